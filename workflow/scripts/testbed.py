"""Rule testbed_run (edgespec.testbed.stage, the processes of edgespec.testbed.session): every
testbed method's answers on one channel, the draft in a device process and the target in an edge
process over loopback TCP through the user-space link."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

from edgespec.artifacts import read_json, write_parquet
from edgespec.runconfig import model_settings
from edgespec.testbed.answer import wire_sizes
from edgespec.testbed.stage import run_stage

params, inputs = snakemake.params, snakemake.input
tables = run_stage(
    params.model_dir,
    model_settings(params.models, inputs.precision),  # the run's dtype and weight layout
    list(inputs.prefill),
    dict(params.heads),
    list(inputs.prompts),
    params.prompting,
    params.testbed,
    snakemake.wildcards.tbchannel,
    params.channel,
    wire_sizes(read_json(inputs.provenance)),
    params.temperature,
    params.policy,
    read_json(inputs.fit) if inputs.get("fit") else None,
    params.seed,
    log_path=snakemake.log[0],
)
for name, table in tables.items():
    write_parquet(table, snakemake.output[name])
