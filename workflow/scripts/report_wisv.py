"""Rule report_wisv (WISV wing, edgespec.wisv.report, edgespec.wisv.summary): every WISV variant
against vanilla SD with intervals on common fading, beside the paper's numbers, and the
figures."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import pandas as pd

from edgespec import plots
from edgespec.artifacts import atomic_path, read_json, write_csv
from edgespec.wireless.arq import ArqSettings
from edgespec.wireless.delay import LatencyProfile
from edgespec.wisv.report import (
    ReportInputs,
    latency_curves,
    read_scores,
    report_markdown,
    tau_curves,
)
from edgespec.wisv.summary import headline, summarise

params, inp, out = snakemake.params, snakemake.input, snakemake.output
costs = pd.concat([pd.read_parquet(p) for p in inp.costs], ignore_index=True)
scores = read_scores(inp.scores, params.variants)
summary = summarise(costs, scores, params.seed, params.evaluation)
write_csv(summary, out.summary)
top = headline(summary)
write_csv(top, out.headline)
inputs = ReportInputs(
    head=read_json(inp.head),
    head_times=read_json(inp.head_times),
    labels=read_json(inp.labels),
    relabel=read_json(inp.relabel),
    provenance=read_json(inp.provenance),
    precision=read_json(inp.precision),
    quantization=read_json(inp.quantization) if "quantization" in inp.keys() else None,
    profile=LatencyProfile.from_dict(read_json(inp.profile)),
)
with atomic_path(out.markdown) as tmp:
    tmp.write_text(report_markdown(summary, top, inputs, params.wisv, params.evaluation))
rounds = pd.read_parquet(inp.wisv_rounds[0]) if inp.wisv_rounds else None
arq = ArqSettings.from_dict(params.wisv["arq"])
curves, note = latency_curves(rounds, params.channels, inputs, params.wisv["hidden_bits"], arq=arq)
plots.latency_vs_channel(curves, out.latency, subtitle=f"{inputs.subtitle}\n{note}")
plots.aal_vs_gamma(summary, out.aal, subtitle=inputs.subtitle)
plots.accuracy_vs_tau(*tau_curves(inputs.head), out.tau, subtitle=inputs.subtitle)
