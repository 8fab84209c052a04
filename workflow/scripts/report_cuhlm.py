"""Rule report_cuhlm (CU-HLM wing, edgespec.cuhlm.report): the CU-HLM summary with intervals
under both latency profiles, the paper comparison, the headline table and the figures."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import pandas as pd

from edgespec.artifacts import atomic_path, read_json, write_csv
from edgespec.cuhlm.report import (
    FIGURES,
    ReportInputs,
    ReportSettings,
    build_report,
    draw_figures,
)

params, inputs, outputs = snakemake.params, snakemake.input, snakemake.output
settings = ReportSettings(
    variants=params.variants,
    seed_interval=params.evaluation["seed_interval"],
    bootstrap_interval=params.evaluation["bootstrap_interval"],
    bootstrap_samples=params.evaluation["bootstrap_samples"],
    paper_hardware=params.paper_hardware,
    uncertainty_samples=params.uncertainty_samples,
    prob_bits=params.prob_bits,
    kstar_channel=params.kstar_channel,
    seed=params.seed,
)
data = ReportInputs(
    fit=read_json(inputs.fit),
    kstar=read_json(inputs.kstar),
    profile=read_json(inputs.profile),
    provenance=read_json(inputs.provenance),
    precision=read_json(inputs.precision),
    quantization=read_json(inputs.quantization) if "quantization" in inputs.keys() else None,
    metrics=pd.concat([pd.read_parquet(p) for p in inputs.metrics], ignore_index=True),
    tokens={v: pd.read_parquet(p) for v, p in zip(params.variants, inputs.tokens, strict=True)},
    scores=pd.read_parquet(inputs.scores),
    thresholds=pd.read_csv(inputs.thresholds),
    k_table=pd.read_csv(inputs.k_table),
    joint=pd.read_csv(inputs.joint),
    joint_sensitivity=pd.read_csv(inputs.joint_sensitivity),
)
report = build_report(data, settings)
write_csv(report.summary, outputs.summary)
write_csv(report.headline, outputs.headline)
with atomic_path(outputs.markdown) as tmp:
    tmp.write_text(report.markdown)
trace_u = pd.concat([pd.read_parquet(p, columns=["u"]) for p in inputs.traces])["u"]
draw_figures(report, data, settings, trace_u, {name: outputs[name] for name in FIGURES})
