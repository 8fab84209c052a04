"""Rule optimize_k (CU-HLM wing, edgespec.cuhlm.kselect, edgespec.cuhlm.kcurves,
edgespec.cuhlm.joint, edgespec.cuhlm.traces): the offline k* over every k in [1, |V|] (cvxpy,
HiGHS), the joint (u_th, k) programme at cuhlm.kstar_channel, the per-grid bound table, and the
dense bound curves (rule joint_kstar solves the joint programme per channel from them)."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import logging
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from edgespec import plots
from edgespec.artifacts import read_json, write_csv, write_json
from edgespec.cuhlm.calibration import LinearFit
from edgespec.cuhlm.joint import latency_inputs, solve_joint
from edgespec.cuhlm.kcurves import dense_bound_curves, save_curves
from edgespec.cuhlm.kselect import k_table, optimize_k_star
from edgespec.cuhlm.traces import replay_draft_probs
from edgespec.models.load import load_model, load_tokenizer, to_device
from edgespec.models.precision import quantize_for_role, quantized_roles, weights_dtype
from edgespec.runconfig import chat_prompts, model_settings, prompt_split
from edgespec.wireless.channel import ChannelCondition
from edgespec.wireless.delay import LatencyProfile

REPLAY_MAX_MEAN_ABS_DIFF = 0.1
"""The replayed x_d of the traced tokens must match the trace's on average to this: rounding of
a batched low-precision decode moves x_d by far less; a misaligned replay by far more."""

params = snakemake.params
cuhlm = params.cuhlm
fit_info = read_json(snakemake.input.fit)
fit = LinearFit(fit_info["a"], fit_info["b"], fit_info["r2"], fit_info["pearson_r"], fit_info["n"])
trace = pd.concat([pd.read_parquet(p) for p in snakemake.input.tokens], ignore_index=True)
# One prompt after another, each in position order: the order the replay yields rows in.
prompt_order = {pid: i for i, pid in enumerate(pd.unique(trace["prompt_id"]))}
trace = trace.sort_values(
    ["prompt_id", "position"], key=lambda s: s.map(prompt_order) if s.name == "prompt_id" else s
).reset_index(drop=True)
k_grid = sorted(int(c[3:]) for c in trace.columns if c.startswith("nk_"))
vocab_size = k_grid[-1]  # the trace grid always ends with |V|
profile = LatencyProfile.from_dict(read_json(snakemake.input.profile))

# x(t) of every calibration token, recomputed by one teacher-forced draft forward per prompt.
torch.set_num_threads(snakemake.threads)
draft_dir = Path(params.model_dir) / "draft"
tokenizer = load_tokenizer(draft_dir, role="draft")
# The replay runs the draft exactly as the traces did: same dtype, same quantisation.
models = model_settings(params.models, snakemake.input.precision)
quantize = models.get("quantize", "none")
draft = load_model(draft_dir, weights_dtype("draft", quantize, models["dtype"]), "draft")
draft = quantize_for_role(draft, "draft", quantize)
# An int8 draft's activations are scaled per forward: replay it a token at a time, as it decoded
# (measured on the default pair: mean |dx_d| 0.084 so, 0.143 in one forward per prompt).
quantized_draft = "draft" in quantized_roles(quantize)
draft = to_device(draft, models.get("device", "cpu"))
records = {r.id: r for r in prompt_split(snakemake.input.prompts, "calib")}
missing = sorted(set(prompt_order) - set(records))
if missing:
    raise ValueError(f"traced prompts {missing[:5]} are not calibration prompts of the data files")
ordered = [records[pid] for pid in prompt_order]
prompts = chat_prompts(tokenizer, ordered, params.prompting)
completions = [
    trace.loc[trace["prompt_id"] == pid, "committed_token"].astype(int).tolist()
    for pid in prompt_order
]
replayed_x_d: list[np.ndarray] = []


def chunks():
    start = 0
    for probs in replay_draft_probs(
        draft, prompts, completions, params.temperature, token_by_token=quantized_draft
    ):
        stop = start + probs.shape[0]
        tokens = torch.tensor(trace["draft_token"].to_numpy()[start:stop])
        replayed_x_d.append(
            probs.to(torch.float64).gather(1, tokens.view(-1, 1)).squeeze(1).numpy()
        )
        start = stop
        yield probs


curves = dense_bound_curves(
    chunks(), trace["u"].to_numpy(), trace["x_d"].to_numpy(), trace["beta"].to_numpy(), fit
)
if curves.vocab_size != vocab_size:
    raise ValueError(f"replayed |V| = {curves.vocab_size} differs from the trace's {vocab_size}")
diff = np.abs(np.concatenate(replayed_x_d) - trace["x_d"].to_numpy())
logging.info(
    "replayed %d calibration tokens: |x_d replay - x_d trace| mean %.3g, max %.3g",
    len(diff),
    diff.mean(),
    diff.max(),
)
if diff.mean() > REPLAY_MAX_MEAN_ABS_DIFF:
    raise RuntimeError(
        f"the replayed draft distributions do not match the trace (mean |dx_d| = {diff.mean():.3g}"
        f" > {REPLAY_MAX_MEAN_ABS_DIFF}): prompts or completions are misaligned"
    )

reference = ChannelCondition.from_dict(params.reference_channel)
reference_name = cuhlm["kstar_channel"]
latency = latency_inputs(profile, reference, cuhlm["prob_bits"], vocab_size)
u_th = fit_info["u_th"] if fit_info["u_th"] >= 0 else None
offline = optimize_k_star(curves, cuhlm["theta_tv"], latency, u_th=u_th)
logging.info(
    "offline k* = %d (u_th %s, every k in [1, %d]), E[tau] = %.4f s, %s via %s",
    offline.k_star,
    offline.u_th,
    vocab_size,
    offline.objective_s,
    offline.status,
    offline.solver,
)
# The joint programme at the reference channel, the one cuhlm_joint decodes (rule joint_kstar
# solves it at every channel of the sweep, for the report, from the saved curves).
joint = solve_joint(curves, cuhlm["theta_tv"], latency, cuhlm["risk_budget"])
logging.info(
    "joint programme at %s: k* = %d, u_th = %g, %s",
    reference_name,
    joint.k_star,
    joint.u_th,
    joint.status,
)
save_curves(curves, snakemake.output.curves)
table = k_table(trace, k_grid, fit, u_th, cuhlm["theta_tv"], latency, offline.k_star)
write_csv(table, snakemake.output.table)
write_json(
    {
        "k_star": offline.k_star,
        "u_th": offline.u_th,
        "objective_s": offline.objective_s,
        "status": offline.status,
        "solver": offline.solver,
        "slack": offline.slack,
        "mean_online_bound": offline.mean_bound,
        "theta_tv": cuhlm["theta_tv"],
        "vocab_size": vocab_size,
        "k_search": f"every integer k in [1, {vocab_size}]",
        "k_grid": k_grid,
        "latency_inputs": latency,
        "joint": {
            "channel": reference_name,
            "k_star": int(joint.k_star),
            "u_th": float(joint.u_th),
            "skip_fraction": float(1.0 - joint.p_tx),
            "skip_risk": float(joint.risk),
            "risk_budget": cuhlm["risk_budget"],
            "mean_online_bound": float(joint.mean_bound),
            "objective_s": float(joint.objective_s),
        },
        "replay": {
            "tokens": int(len(diff)),
            "mean_abs_x_d_diff": float(diff.mean()),
            "max_abs_x_d_diff": float(diff.max()),
        },
    },
    snakemake.output.kstar,
)
plots.bound_vs_k(
    table,
    cuhlm["theta_tv"],
    offline.k_star,
    snakemake.output.figure,
    subtitle=f"|V| = {vocab_size}; {len(trace)} traced tokens",
    dense_k=curves.k_values,
    dense_bound=curves.mean_bound(u_th),
)
