"""Rule simulate_multidevice (edgespec.multidevice.sweep, edgespec.multidevice.workload; prices the
CU-HLM wing's token tables with edgespec.cuhlm.evaluate and the WISV wing's round tables with
edgespec.wisv.evaluate): one method under one channel, N devices sharing the band and the edge,
every device count, uplink scheme and fading seed."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import logging  # noqa: E402

import pandas as pd  # noqa: E402

from edgespec.artifacts import read_json, write_parquet  # noqa: E402
from edgespec.multidevice.edge import BatchingPolicy, BatchTimes  # noqa: E402
from edgespec.multidevice.sweep import SweepSettings, sweep  # noqa: E402
from edgespec.multidevice.workload import CuhlmPricing, WisvPricing, family  # noqa: E402
from edgespec.variants import RECONSTRUCTION_SAMPLING_VARIANTS  # noqa: E402
from edgespec.wireless.arq import ArqSettings  # noqa: E402
from edgespec.wireless.channel import ChannelCondition  # noqa: E402
from edgespec.wireless.delay import LatencyProfile  # noqa: E402
from edgespec.wisv.evaluate import CSI_VARIANTS, HEAD_OF_VARIANT, HEAD_VARIANTS  # noqa: E402

params = snakemake.params
method, channel = snakemake.wildcards.mdmethod, snakemake.wildcards.mdchannel
condition = ChannelCondition.from_dict(params.channel)
profile = LatencyProfile.from_dict(read_json(snakemake.input.profile))
batch_times = BatchTimes.from_dict(read_json(snakemake.input.batching))
seeds = list(params.seeds)
tables = [pd.read_parquet(path) for path in snakemake.input.tables]
if family(method) == "cuhlm":
    kstar = read_json(snakemake.input.kstar)
    pricing = CuhlmPricing(
        method,
        condition,
        profile,
        kstar["vocab_size"],
        params.pricing["prob_bits"],
        params.seed,
        sampling_k=kstar["k_star"] if method in RECONSTRUCTION_SAMPLING_VARIANTS else None,
    )
else:
    provenance = read_json(snakemake.input.provenance)
    head_s = 0.0
    if method in HEAD_VARIANTS:
        head_s = float(read_json(snakemake.input.head)["head_round_s"][HEAD_OF_VARIANT[method]])
    pricing = WisvPricing(
        method,
        condition,
        profile,
        params.pricing["gamma"],
        {
            "vocab_size": provenance["models"]["target"]["logits_size"],
            "hidden_size": provenance["models"]["draft"]["hidden_size"],
            "bits_per_value": params.pricing["hidden_bits"],
        },
        params.seed,
        head_s=head_s,
        arq=ArqSettings.from_dict(params.pricing["arq"]),
    )
if method in CSI_VARIANTS:
    # Decoded under each listed fading seed: each decode runs on its own seed's draws.
    tables_by_seed = dict(zip(seeds, tables, strict=True))
else:
    # Decoded once, channel-free: re-priced under every fading seed.
    tables_by_seed = {s: tables[0] for s in seeds}
settings = SweepSettings(
    device_counts=params.sweep["device_counts"],
    uplink=params.sweep["uplink"],
    slot_s=params.sweep["tdma_slot_s"],
    policy=BatchingPolicy.from_dict(params.sweep["batching"]),
    prompts_per_device=params.sweep["prompts_per_device"],
)
runs = sweep(tables_by_seed, pricing, batch_times, settings)
runs.insert(0, "step", pricing.step)
runs.insert(0, "family", family(method))
runs.insert(0, "channel", channel)
runs.insert(0, "method", method)
if "single_device_rel_diff" in runs:
    logging.info(
        "one device reproduces the single-device evaluation to %.2g (relative)",
        runs["single_device_rel_diff"].max(),
    )
top = runs[runs["devices"] == runs["devices"].max()]
for scheme, rows in top.groupby("uplink"):
    logging.info(
        "%s %s %s, %d devices: aggregate %.3g tokens/s (median over %d seeds), edge busy %.0f%%, "
        "band busy %.0f%%, mean batch %.2f",
        method,
        channel,
        scheme,
        int(rows["devices"].iloc[0]),
        rows["aggregate_tps"].median(),
        len(rows),
        100 * rows["edge_utilisation"].median(),
        100 * rows["uplink_utilisation"].median(),
        rows["mean_batch"].median(),
    )
write_parquet(runs, snakemake.output.runs)
