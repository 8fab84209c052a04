"""Rule fit_calibration (CU-HLM wing, edgespec.cuhlm.calibration): beta ~ a u + b on the traces,
the thresholds the variants use, and the beta-vs-u figure."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import logging

import pandas as pd

from edgespec import plots
from edgespec.artifacts import write_csv, write_json
from edgespec.cuhlm.calibration import (
    SKIP_NOTHING_THRESHOLD,
    binned_rejection,
    clamp_threshold,
    fit_rejection_model,
    rejectable_fraction,
    risk_averse_threshold,
    risk_budget_threshold,
    risk_prone_threshold,
)

cuhlm = snakemake.params.cuhlm
tokens = pd.concat([pd.read_parquet(p) for p in snakemake.input.tokens], ignore_index=True)
u, beta = tokens["u"].to_numpy(), tokens["beta"].to_numpy()
fit = fit_rejection_model(u, beta)
delta = rejectable_fraction(tokens["x_d"], tokens["y_d"])
logging.info(
    "fit over %d tokens: a=%.4f b=%.4f R2=%.3f r=%.3f", fit.n, fit.a, fit.b, fit.r2, fit.pearson_r
)
# The table of every threshold rule (and the reported risk budgets) is rule risk_thresholds.
if fit.a > 0:
    u_averse, u_prone = risk_averse_threshold(fit), risk_prone_threshold(fit, delta)
else:
    # A non-increasing fit means uncertainty does not predict rejection: the linear-model
    # thresholds are undefined, so the U-HLM/CU-HLM variants skip nothing.
    logging.warning("slope a=%.4f <= 0: thresholds undefined, skipping disabled", fit.a)
    u_averse = u_prone = SKIP_NOTHING_THRESHOLD
rule = cuhlm["threshold_rule"]
if rule == "risk_budget":
    u_th = risk_budget_threshold(u, beta, fit, cuhlm["risk_budget"]) if fit.a > 0 else u_averse
else:
    u_th = u_averse if rule == "risk_averse" else u_prone
# u <= 1 always, so a threshold >= 1 skips every token: clamp it and say what that means.
raw = {"risk_averse": u_averse, "risk_prone": u_prone, "threshold_rule": u_th}
slm_only: list[str] = []


def clamp_and_warn(name: str, value: float, users: list[str]) -> float:
    clamped, skips_everything = clamp_threshold(value)
    if skips_everything:
        slm_only.extend(users)
        logging.warning(
            "%s threshold %.4f >= 1 clamped to 1: u(t) <= 1 always, so it skips every token and "
            "%s have become SLM-only",
            name,
            value,
            ", ".join(users),
        )
    return clamped


u_averse = clamp_and_warn("risk_averse", u_averse, ["uhlm_risk_averse"])
u_prone = clamp_and_warn("risk_prone", u_prone, ["uhlm_risk_prone"])
u_th = clamp_and_warn(
    f"threshold_rule {rule}", u_th, ["fixed_topk", "cuhlm_offline", "cuhlm_online", "cuhlm_exact"]
)
bins = binned_rejection(u, beta)
write_csv(bins, snakemake.output.bins)
write_json(
    {
        "a": fit.a,
        "b": fit.b,
        "r2": fit.r2,
        "pearson_r": fit.pearson_r,
        "n": fit.n,
        "delta": delta,
        "u_th_risk_averse": u_averse,
        "u_th_risk_prone": u_prone,
        "threshold_rule": rule,
        "u_th": u_th,
        "u_th_unclamped": raw,
        "slm_only_variants": sorted(set(slm_only)),
        "valid_slope": bool(fit.a > 0),
    },
    snakemake.output.fit,
)
plots.beta_vs_u(
    u,
    beta,
    bins,
    fit.a,
    fit.b,
    snakemake.output.figure,
    subtitle=f"{len(tokens)} traced tokens; R2 = {fit.r2:.3f}, r = {fit.pearson_r:.3f}",
)
