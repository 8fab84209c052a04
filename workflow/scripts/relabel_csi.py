"""Rule relabel_csi (WISV wing, edgespec.wisv.relabel): repair/skip decisions of every mismatch
under CSI samples spanning the evaluation channels (cvxpy MILP), priced under one regime."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import pandas as pd

from edgespec import plots
from edgespec.artifacts import read_json, write_csv, write_json, write_parquet
from edgespec.seeding import numpy_rng
from edgespec.wisv.regimes import Pricing
from edgespec.wisv.relabel import relabel_under_csi

pricing = Pricing.from_dict(read_json(snakemake.input.pricing))
run = relabel_under_csi(
    pd.read_parquet(snakemake.input.table),
    pricing,
    snakemake.params.channels,
    snakemake.params.wisv,
    numpy_rng(snakemake.params.seed, "relabel"),
    source=snakemake.input.table,
)
write_parquet(run.relabeled, snakemake.output.train)
write_csv(run.safe, snakemake.output.safe)
write_json(run.summary, snakemake.output.summary)
plots.safe_vs_channel(
    run.safe, run.summary["safe_before"], snakemake.output.figure, subtitle=pricing.description
)
