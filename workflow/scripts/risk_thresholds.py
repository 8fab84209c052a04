"""Rule risk_thresholds (CU-HLM wing, edgespec.cuhlm.calibration): every threshold rule with its
skip fraction and risk, for the report (the reported risk budgets are cuhlm.risk_budgets)."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import pandas as pd

from edgespec.artifacts import read_json, write_csv
from edgespec.cuhlm.calibration import reported_thresholds

columns = ["u", "beta"]
tokens = pd.concat(
    [pd.read_parquet(p, columns=columns) for p in snakemake.input.tokens], ignore_index=True
)
table = reported_thresholds(
    tokens["u"].to_numpy(),
    tokens["beta"].to_numpy(),
    read_json(snakemake.input.fit),
    snakemake.params.risk_budgets,
)
write_csv(table, snakemake.output.thresholds)
