"""Rule evaluate_cuhlm (CU-HLM wing, edgespec.cuhlm.evaluate, edgespec.hardware): one decoded
variant priced under every channel of the sweep, both latency profiles and K fading seeds ->
methods §6 metrics, one row per (channel, profile, seed)."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import logging

import pandas as pd

from edgespec.artifacts import read_json, write_parquet
from edgespec.cuhlm.evaluate import price_variant
from edgespec.hardware import HardwareSpec, roofline_profile
from edgespec.variants import RECONSTRUCTION_SAMPLING_VARIANTS
from edgespec.wireless.channel import ChannelCondition
from edgespec.wireless.delay import LatencyProfile

params = snakemake.params
variant = snakemake.wildcards.variant
tokens = pd.read_parquet(snakemake.input.tokens)
kstar = read_json(snakemake.input.kstar)
vocab_size = kstar["vocab_size"]
profiles = {"primary": LatencyProfile.from_dict(read_json(snakemake.input.profile))}
hardware = params.paper_hardware
if hardware["enabled"]:
    profiles["paper_hw"], _ = roofline_profile(
        HardwareSpec.from_dict(hardware), vocab_size, params.uncertainty_samples
    )
conditions = {name: ChannelCondition.from_dict(c) for name, c in params.channels.items()}
# Every variant, every SNR of a fading model and both profiles see the same normalised fading
# draws per (prompt, position, seed): common random numbers (edgespec.cuhlm.evaluate).
metrics = price_variant(
    tokens,
    variant,
    conditions,
    profiles,
    vocab_size,
    params.prob_bits,
    params.seed,
    params.evaluation["fading_seeds"],
    sampling_k=kstar["k_star"] if variant in RECONSTRUCTION_SAMPLING_VARIANTS else None,
)
logging.info(
    "%s: %d tokens priced under %d channels x %d profiles x %d fading seeds",
    variant,
    len(tokens),
    len(conditions),
    len(profiles),
    params.evaluation["fading_seeds"],
)
write_parquet(metrics, snakemake.output.metrics)
