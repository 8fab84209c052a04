"""Rule evaluate_cuhlm (CU-HLM wing, edgespec.cuhlm.evaluate): one decoded variant under one channel
condition -> methods §6 metrics."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import pandas as pd

from edgespec.artifacts import read_json, write_json
from edgespec.cuhlm.evaluate import apply_channel, uses_uncertainty, variant_metrics
from edgespec.seeding import numpy_rng
from edgespec.wireless.channel import ChannelCondition
from edgespec.wireless.delay import LatencyProfile

variant, channel = snakemake.wildcards.variant, snakemake.wildcards.channel
tokens = pd.read_parquet(snakemake.input.tokens)
profile = LatencyProfile.from_dict(read_json(snakemake.input.profile))
vocab_size = read_json(snakemake.input.kstar)["vocab_size"]
prob_bits = snakemake.params.cuhlm["prob_bits"]
condition = ChannelCondition.from_dict(snakemake.params.condition)
# The fading stream depends on the fading model only: every variant, and every SNR of the
# sweep, sees the same normalised gains |h|^2 (common random numbers), so curves over SNR
# are not reshuffled by which tokens happen to meet a deep fade.
rng = numpy_rng(snakemake.params.seed, "channel", condition.fading, condition.k_factor)
delays = apply_channel(
    tokens, variant, condition, profile, vocab_size, prob_bits, rng, uses_uncertainty(variant)
)
metrics = variant_metrics(tokens, delays, vocab_size, prob_bits)
write_json(
    {
        "variant": variant,
        "channel": channel,
        "condition": condition.to_dict(),
        "profile_source": profile.source,
        **metrics,
    },
    snakemake.output.metrics,
)
