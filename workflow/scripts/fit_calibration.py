"""Rule fit_calibration (CU-HLM wing, edgespec.cuhlm.calibration): beta ~ a u + b on the traces,
the thresholds the variants use, and the beta-vs-u figure."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import pandas as pd

from edgespec import plots
from edgespec.artifacts import write_csv, write_json
from edgespec.cuhlm.calibration import binned_rejection, calibration_record

cuhlm = snakemake.params.cuhlm
tokens = pd.concat([pd.read_parquet(p) for p in snakemake.input.tokens], ignore_index=True)
u, beta = tokens["u"].to_numpy(), tokens["beta"].to_numpy()
# The table of every threshold rule (and the reported risk budgets) is rule risk_thresholds.
fit, record = calibration_record(
    u, beta, tokens["x_d"], tokens["y_d"], cuhlm["threshold_rule"], cuhlm.get("risk_budget")
)
bins = binned_rejection(u, beta)
write_csv(bins, snakemake.output.bins)
write_json(record, snakemake.output.fit)
plots.beta_vs_u(
    u,
    beta,
    bins,
    fit.a,
    fit.b,
    snakemake.output.figure,
    subtitle=f"{len(tokens)} traced tokens; R2 = {fit.r2:.3f}, r = {fit.pearson_r:.3f}",
)
