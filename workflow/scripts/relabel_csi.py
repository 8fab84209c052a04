"""Rule relabel_csi (WISV wing, edgespec.wisv.relabel, edgespec.wisv.csi): repair/skip decisions
of every mismatch under CSI samples spanning the evaluation channels (cvxpy MILP)."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import logging

import numpy as np
import pandas as pd

from edgespec import plots
from edgespec.artifacts import read_json, write_csv, write_json, write_parquet
from edgespec.seeding import numpy_rng
from edgespec.wireless.delay import LatencyProfile
from edgespec.wisv.csi import (
    csi_ranges,
    repair_cost_rounds,
    round_compute_s,
    sample_csi,
)
from edgespec.wisv.protocols import fh_payload
from edgespec.wisv.relabel import check_two_classes, relabel_over_csi, safe_fraction_by_channel

wisv = snakemake.params.wisv
cfg = wisv["relabel"]
table = pd.read_parquet(snakemake.input.table)
with np.load(snakemake.input.hidden) as hidden:
    draft_hidden_size = hidden["draft"].shape[1]
check_two_classes(table["label"], f"the mined labels ({snakemake.input.table})")
profile = LatencyProfile.from_dict(read_json(snakemake.input.profile))
vocab_size = int(max(table["draft_token"].max(), table["target_token"].max()) + 1)
gamma = cfg["gamma"]
uplink_bits = fh_payload(gamma, vocab_size, draft_hidden_size, wisv["hidden_bits"]).uplink_bits
round_compute = round_compute_s(profile, gamma)
ranges = csi_ranges(snakemake.params.channels, cfg)
samples = sample_csi(
    ranges,
    cfg["num_csi_samples"],
    numpy_rng(snakemake.params.seed, "relabel"),
    wisv["correlation"],
)
costs = [repair_cost_rounds(s, uplink_bits, round_compute) for s in samples]
csi = [
    {"features": s.features(wisv["csi_features"]), "repair_cost": c}
    for s, c in zip(samples, costs, strict=True)
]
# Each prompt's mismatches in response order: the programme's tie-break repairs earlier ones.
ordered = table.sort_values(["prompt_id", "position"], kind="stable")
relabeled = relabel_over_csi(ordered, csi, cfg["lam_rounds_per_risk"], cfg["risk_budget"])
described = pd.DataFrame([{"csi_sample": i, **s.describe()} for i, s in enumerate(samples)])
safe = safe_fraction_by_channel(relabeled).merge(described, on="csi_sample")
logging.info(
    "T_0 = %.3f s per round; repair costs %.3f to %.3f rounds; safe fraction from %.3f "
    "(best channel) to %.3f (worst), %.3f before relabeling",
    round_compute,
    min(costs),
    max(costs),
    safe["safe_fraction"].iloc[0],
    safe["safe_fraction"].iloc[-1],
    float((table["label"] == 0).mean()),
)
check_two_classes(
    relabeled["label_csi"],
    "the relabeled labels",
    f" rows ({len(table)} mismatches x {len(samples)} CSI samples; repair costs "
    f"{min(costs):.3f} to {max(costs):.3f} rounds of T_0 = {round_compute:.3f} s)",
)
write_parquet(relabeled, snakemake.output.train)
write_csv(safe, snakemake.output.safe)
write_json(
    {
        "round_compute_s": round_compute,
        "uplink_bits": uplink_bits,
        "ranges": {k: list(v) for k, v in ranges.items()},
        "correlation": wisv["correlation"],
        "lam_rounds_per_risk": cfg["lam_rounds_per_risk"],
        "risk_budget": cfg["risk_budget"],
        "csi_samples": len(samples),
        "mismatches": len(table),
        "safe_before": float((table["label"] == 0).mean()),
        "safe_best_channel": float(safe["safe_fraction"].iloc[0]),
        "safe_worst_channel": float(safe["safe_fraction"].iloc[-1]),
        "safe_after": float((relabeled["label_csi"] == 0).mean()),
        "repair_cost_rounds": [min(costs), max(costs)],
    },
    snakemake.output.summary,
)
plots.safe_vs_channel(
    safe,
    float((table["label"] == 0).mean()) if len(table) else float("nan"),
    snakemake.output.figure,
)
