"""Rule optimize_k (CU-HLM wing, edgespec.cuhlm.kselect): the offline k* as a mixed-integer
programme (cvxpy, HiGHS)."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import logging

import pandas as pd

from edgespec import plots
from edgespec.artifacts import read_json, write_csv, write_json
from edgespec.cuhlm.calibration import LinearFit
from edgespec.cuhlm.kselect import optimize_k_star
from edgespec.wireless.channel import ChannelCondition, ergodic_rate_bps
from edgespec.wireless.delay import LatencyProfile

cuhlm = snakemake.params.cuhlm
fit_info = read_json(snakemake.input.fit)
fit = LinearFit(fit_info["a"], fit_info["b"], fit_info["r2"], fit_info["pearson_r"], fit_info["n"])
trace = pd.concat([pd.read_parquet(p) for p in snakemake.input.tokens], ignore_index=True)
k_grid = sorted(int(c[3:]) for c in trace.columns if c.startswith("nk_"))
vocab_size = k_grid[-1]  # the trace grid always ends with |V|
profile = LatencyProfile.from_dict(read_json(snakemake.input.profile))
reference = ChannelCondition.from_dict(snakemake.params.reference_channel)
latency = {
    "draft_s": profile.draft_token_s,
    "uncertainty_s": profile.uncertainty_s,
    "target_s": profile.target_token_s,
    "rtt_s": reference.rtt_s,
    "mean_uplink_rate_bps": ergodic_rate_bps(reference),
    "prob_bits": cuhlm["prob_bits"],
    "vocab_size": vocab_size,
}
u_th = fit_info["u_th"] if fit_info["u_th"] >= 0 else None
if cuhlm["joint_threshold"]:
    solution = optimize_k_star(
        trace,
        k_grid,
        fit,
        cuhlm["theta_tv"],
        latency,
        u_th_grid=sorted(set(trace["u"].round(6))),
        risk_budget=cuhlm["risk_budget"],
    )
else:
    solution = optimize_k_star(trace, k_grid, fit, cuhlm["theta_tv"], latency, u_th=u_th)
logging.info(
    "k* = %d (u_th %s), E[tau] = %.4f s, %s via %s",
    solution.k_star,
    solution.u_th,
    solution.objective_s,
    solution.status,
    solution.solver,
)
write_csv(solution.table, snakemake.output.table)
write_json(
    {
        "k_star": solution.k_star,
        "u_th": solution.u_th,
        "objective_s": solution.objective_s,
        "status": solution.status,
        "solver": solution.solver,
        "slack": solution.slack,
        "theta_tv": cuhlm["theta_tv"],
        "vocab_size": vocab_size,
        "k_grid": k_grid,
        "latency_inputs": latency,
        "joint_threshold": cuhlm["joint_threshold"],
    },
    snakemake.output.kstar,
)
plots.bound_vs_k(
    solution.table,
    cuhlm["theta_tv"],
    solution.k_star,
    snakemake.output.figure,
    subtitle=f"|V| = {vocab_size}; {len(trace)} traced tokens",
)
