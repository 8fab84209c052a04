"""Rule report_wisv (WISV wing, edgespec.wisv.report, summary, policy, figures): every WISV
variant against vanilla SD with intervals on common fading, in both pricing regimes, beside the
paper's numbers, and the figures."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import pandas as pd

from edgespec import plots
from edgespec.artifacts import atomic_path, read_json, write_csv
from edgespec.wireless.arq import ArqSettings
from edgespec.wisv import figures
from edgespec.wisv.policy import PART_TITLES, breakdown_table, check_breakdown
from edgespec.wisv.regimes import Pricing
from edgespec.wisv.report import RegimeInputs, ReportInputs, read_scores, report_markdown
from edgespec.wisv.summary import headline, summarise

params, inp, out = snakemake.params, snakemake.input, snakemake.output
regimes = list(params.regimes)
costs = pd.concat([pd.read_parquet(p) for p in inp.costs], ignore_index=True)
check_breakdown(costs)
summary = summarise(costs, read_scores(inp.scores, params.variants), params.seed, params.evaluation)
write_csv(summary, out.summary)
top = headline(summary)
write_csv(top, out.headline)
breakdown = breakdown_table(costs)
write_csv(breakdown, out.breakdown_table)
per_regime = {
    regime: RegimeInputs(
        Pricing.from_dict(read_json(inp.pricing[i])),
        read_json(inp.heads[i]),
        read_json(inp.relabel[i]),
        pd.read_csv(inp.safe[i]),
    )
    for i, regime in enumerate(regimes)
}
inputs = ReportInputs(
    labels=read_json(inp.labels),
    risks=pd.read_parquet(inp.mismatches)["risk"].to_numpy(),
    provenance=read_json(inp.provenance),
    precision=read_json(inp.precision),
    quantization=read_json(inp.quantization) if "quantization" in inp.keys() else None,
    regimes=per_regime,
)
with atomic_path(out.markdown) as tmp:
    tmp.write_text(report_markdown(summary, top, breakdown, inputs, params.wisv, params.evaluation))
heads = {regime: r.head for regime, r in per_regime.items()}
rounds = dict(zip(regimes, map(pd.read_parquet, inp.wisv_rounds), strict=False))
pricing = {regime: r.pricing for regime, r in per_regime.items()}
arq = ArqSettings.from_dict(params.wisv["arq"])
curves, note = figures.latency_curves(rounds, params.channels, pricing, arq=arq)
plots.latency_vs_channel(curves, out.latency, subtitle=f"{inputs.subtitle}\n{note}")
plots.aal_vs_gamma(summary, out.aal, subtitle=inputs.subtitle)
plots.accuracy_vs_tau(*figures.tau_curves(heads), out.tau, subtitle=inputs.subtitle)
safe = {regime: r.safe for regime, r in per_regime.items()}
plots.policy_vs_channel(figures.policy_curves(safe, heads), out.policy, subtitle=inputs.subtitle)
plots.latency_breakdown(breakdown, PART_TITLES, out.breakdown, subtitle=inputs.subtitle)
plots.learning_curve(figures.learning_curves(heads), out.learning, subtitle=inputs.subtitle)
