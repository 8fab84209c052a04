"""Rule risk_thresholds (CU-HLM wing, edgespec.cuhlm.calibration): every threshold rule with its
skip fraction and risk, for the report (the reported risk budgets are cuhlm.risk_budgets)."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import pandas as pd

from edgespec.artifacts import read_json, write_csv
from edgespec.cuhlm.calibration import SKIP_NOTHING_THRESHOLD, LinearFit, threshold_table

columns = ["u", "beta"]
tokens = pd.concat(
    [pd.read_parquet(p, columns=columns) for p in snakemake.input.tokens], ignore_index=True
)
fit_info = read_json(snakemake.input.fit)
fit = LinearFit(fit_info["a"], fit_info["b"], fit_info["r2"], fit_info["pearson_r"], fit_info["n"])
if fit_info["valid_slope"]:
    table = threshold_table(
        tokens["u"].to_numpy(),
        tokens["beta"].to_numpy(),
        fit,
        snakemake.params.risk_budgets,
        delta=fit_info["delta"],
    )
else:
    # fit_calibration found no increasing fit: the thresholds are undefined, nothing is skipped.
    table = pd.DataFrame(
        [
            {
                "rule": r,
                "epsilon": float("nan"),
                "u_th": SKIP_NOTHING_THRESHOLD,
                "skip_fraction": 0.0,
                "predicted_risk": 0.0,
                "empirical_risk": 0.0,
                "skips_every_token": False,
            }
            for r in ("risk_averse", "risk_prone")
        ]
    )
write_csv(table, snakemake.output.thresholds)
