"""Rule simulate_multidevice (edgespec.multidevice.job): one method under one channel or
population, N devices sharing the band and the edge, every replicate, edge policy, uplink
scheme and device count."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import logging  # noqa: E402

import pandas as pd  # noqa: E402

from edgespec.artifacts import read_json, write_parquet  # noqa: E402
from edgespec.multidevice.batchprofile import BatchProfile  # noqa: E402
from edgespec.multidevice.job import run_job  # noqa: E402
from edgespec.wireless.channel import ChannelCondition  # noqa: E402
from edgespec.wireless.delay import LatencyProfile  # noqa: E402

params = snakemake.params
method, channel = snakemake.wildcards.mdmethod, snakemake.wildcards.mdchannel
inputs = snakemake.input
tables = {
    (name, int(seed)): pd.read_parquet(path)
    for (name, seed), path in zip(params.table_keys, inputs.tables, strict=True)
}
extras = {k: read_json(inputs[k]) for k in ("kstar", "provenance", "head") if k in inputs.keys()}
batching = read_json(inputs.batching)
runs = run_job(
    method,
    channel,
    {name: ChannelCondition.from_dict(d) for name, d in params.channels.items()},
    params.population,
    tables,
    LatencyProfile.from_dict(read_json(inputs.profile)),
    BatchProfile.from_dict(batching),
    extras,
    {
        "pricing": params.pricing,
        "prompt_tokens": batching.get("prompt_tokens"),
        "sweep": params.sweep,
        "replicates": params.replicates,
        "seed": params.seed,
    },
)
if "single_device_rel_diff" in runs:
    logging.info(
        "one device = the evaluation + the edge work it leaves out, to %.2g (relative)",
        runs["single_device_rel_diff"].max(),
    )
top = runs[(runs["devices"] == runs["devices"].max()) & (runs["policy"] == "base")]
medians = top.groupby("uplink")[["aggregate_tps", "token_latency_p95_s", "edge_utilisation"]]
logging.info(
    "%s %s, the largest N (medians over replicates):\n%s",
    method,
    channel,
    medians.median().to_string(),
)
write_parquet(runs, snakemake.output.runs)
