"""Rule report_testbed (edgespec.testbed.summary, figure edgespec.plots): the testbed's bytes and
latency against the simulator's prediction, term by term, per method and channel."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import pandas as pd

from edgespec.artifacts import atomic_path, read_json, write_csv
from edgespec.plots import testbed_against_simulator
from edgespec.testbed.answer import wire_sizes
from edgespec.testbed.summary import TERM_NAMES, compare_answers, context, markdown, summarise
from edgespec.wireless.delay import LatencyProfile

params, inputs = snakemake.params, snakemake.input
tables = {
    name: pd.concat([pd.read_parquet(p) for p in inputs[name]], ignore_index=True)
    for name in ("answers", "frames", "tokens", "rounds")
}
profile = read_json(inputs.profile)
per_answer = compare_answers(
    *(tables[name] for name in ("answers", "frames", "tokens", "rounds")),
    pd.read_parquet(inputs.reference),
    params.channels,
    LatencyProfile.from_dict(profile),
    read_json(inputs.head_times),
    wire_sizes(read_json(inputs.provenance)),
    params.testbed,
    params.seed,
)
summary = summarise(per_answer, params.seed)
write_csv(per_answer.drop(columns=["tokens"]), snakemake.output.answers)
write_csv(summary, snakemake.output.summary)
text = markdown(summary, context(params.models, params.testbed, profile))
with atomic_path(snakemake.output.markdown) as tmp:
    tmp.write_text(text)
testbed_against_simulator(summary, TERM_NAMES, snakemake.output.figure)
