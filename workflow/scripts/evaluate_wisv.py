"""Rule evaluate_wisv (WISV wing, edgespec.wisv.evaluate): one variant's rounds priced under one
regime, channel and gamma over every fading seed, with the same draws for every variant;
torch-free."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import pandas as pd

from edgespec.artifacts import read_json, write_json, write_parquet
from edgespec.wireless.arq import ArqSettings
from edgespec.wireless.channel import ChannelCondition
from edgespec.wisv.evaluate import evaluate_variant, rounds_by_fading_seed
from edgespec.wisv.regimes import Pricing

params, wildcards = snakemake.params, snakemake.wildcards
variant, channel = wildcards.wvariant, wildcards.wchannel
pricing = Pricing.from_dict(read_json(snakemake.input.pricing))
# A CSI-reading variant: decoded under each listed fading seed, each decode priced under its
# own draws. Otherwise decoded once, channel-free, and re-priced under every fading seed.
rounds = rounds_by_fading_seed(
    variant,
    [pd.read_parquet(p) for p in snakemake.input.rounds],
    params.wisv.get("csi_decode_seeds"),
    params.evaluation.get("fading_seeds"),
)
costs, summary = evaluate_variant(
    rounds,
    variant,
    channel,
    ChannelCondition.from_dict(params.channels[channel]),
    pricing.protocol,
    pricing.profile,
    int(wildcards.gamma),
    params.seed,
    head_times=pricing.head_times,
    arq=ArqSettings.from_dict(params.wisv["arq"]),
    regime=pricing.regime,
)
write_parquet(costs, snakemake.output.costs)
write_json(summary, snakemake.output.metrics)
