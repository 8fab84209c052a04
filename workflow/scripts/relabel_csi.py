"""Rule relabel_csi (WISV wing, edgespec.wisv.relabel): repair/skip decisions of every mismatch
under sampled CSI (cvxpy MILP)."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import logging

import numpy as np
import pandas as pd

from edgespec import plots
from edgespec.artifacts import read_json, write_csv, write_parquet
from edgespec.seeding import numpy_rng
from edgespec.wireless.channel import (
    ChannelCondition,
    csi_features,
    sample_power_gains,
    uplink_rate_bps,
)
from edgespec.wireless.delay import LatencyProfile
from edgespec.wisv.protocols import fh_payload
from edgespec.wisv.relabel import relabel_over_csi, repair_cost_s, safe_fraction_by_channel

wisv = snakemake.params.wisv
cfg = wisv["relabel"]
table = pd.read_parquet(snakemake.input.table)
with np.load(snakemake.input.hidden) as hidden:
    draft_hidden_size = hidden["draft"].shape[1]
profile = LatencyProfile.from_dict(read_json(snakemake.input.profile))
vocab_size = int(max(table["draft_token"].max(), table["target_token"].max()) + 1)
rng = numpy_rng(snakemake.params.seed, "relabel")
gamma = cfg["gamma"]
uplink_bits = fh_payload(gamma, vocab_size, draft_hidden_size, wisv["hidden_bits"]).uplink_bits
samples, described = [], []
for i in range(cfg["num_csi_samples"]):
    condition = ChannelCondition(
        name=f"csi{i}",
        fading="rayleigh",
        bandwidth_hz=cfg["bandwidth_hz"],
        snr_db=float(rng.uniform(*cfg["snr_db_range"])),
        rtt_s=float(rng.uniform(*cfg["rtt_s_range"])),
    )
    gain = float(sample_power_gains(condition, 1, rng)[0])
    rate = float(uplink_rate_bps(condition, gain))
    features = csi_features(condition, gain)
    cost = repair_cost_s(
        rate,
        condition.rtt_s,
        gamma,
        profile.draft_token_s,
        profile.target_verify(gamma),
        uplink_bits,
    )
    samples.append(
        {"features": {k: features[k] for k in wisv["csi_features"]}, "repair_cost_s": cost}
    )
    described.append(
        {
            "csi_sample": i,
            "snr_db_mean": condition.snr_db,
            "rtt_s": condition.rtt_s,
            "gain": gain,
            "rate_mbps": rate / 1e6,
            "repair_cost_s": cost,
        }
    )
relabeled = relabel_over_csi(table, samples, cfg["lam_s_per_risk"], cfg["risk_budget"])
safe = safe_fraction_by_channel(relabeled).merge(
    pd.DataFrame(described).drop(columns="repair_cost_s"), on="csi_sample"
)
logging.info(
    "safe fraction from %.3f (best channel) to %.3f (worst)",
    safe["safe_fraction"].iloc[0],
    safe["safe_fraction"].iloc[-1],
)
write_parquet(relabeled, snakemake.output.train)
write_csv(safe, snakemake.output.safe)
plots.safe_vs_channel(
    safe,
    float((table["label"] == 0).mean()) if len(table) else float("nan"),
    snakemake.output.figure,
)
