"""Rule evaluate_wisv (WISV wing, edgespec.wisv.evaluate): one variant's rounds priced under one
channel and gamma over every fading seed, with the same draws for every variant; torch-free."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import logging

import numpy as np
import pandas as pd

from edgespec.artifacts import read_json, write_json, write_parquet
from edgespec.wireless.channel import ChannelCondition
from edgespec.wireless.delay import LatencyProfile
from edgespec.wisv.evaluate import (
    CSI_VARIANTS,
    HEAD_OF_VARIANT,
    HEAD_VARIANTS,
    price_over_seeds,
)

params = snakemake.params
wisv = params.wisv
variant, channel = snakemake.wildcards.wvariant, snakemake.wildcards.wchannel
gamma = int(snakemake.wildcards.gamma)
condition = ChannelCondition.from_dict(params.channels[channel])
if variant in CSI_VARIANTS:
    # Decoded under each listed fading seed: each decode is priced under its own draws.
    seeds = list(wisv["csi_decode_seeds"])
    rounds_by_seed = {
        s: pd.read_parquet(p) for s, p in zip(seeds, snakemake.input.rounds, strict=True)
    }
else:
    # Decoded once, channel-free: re-priced under every fading seed.
    rounds = pd.read_parquet(snakemake.input.rounds[0])
    rounds_by_seed = {s: rounds for s in range(params.evaluation["fading_seeds"])}
provenance = read_json(snakemake.input.provenance)
protocol = {
    "vocab_size": provenance["models"]["target"]["logits_size"],
    "hidden_size": provenance["models"]["draft"]["hidden_size"],
    "bits_per_value": wisv["hidden_bits"],
}
profile = LatencyProfile.from_dict(read_json(snakemake.input.profile))
head_s = 0.0
if variant in HEAD_VARIANTS:
    head_s = float(read_json(snakemake.input.head[0])["head_round_s"][HEAD_OF_VARIANT[variant]])
costs = price_over_seeds(
    rounds_by_seed, variant, condition, protocol, profile, gamma, params.seed, head_s=head_s
)
costs.insert(0, "gamma", gamma)
costs.insert(0, "channel", channel)
costs.insert(0, "variant", variant)
per_seed = costs.groupby("fading_index").agg(
    e2e_latency_s=("latency_s", "mean"),
    tokens=("tokens", "sum"),
    rounds=("rounds", "sum"),
    latency_s=("latency_s", "sum"),
)
per_seed["aal"] = per_seed["tokens"] / per_seed["rounds"]
per_seed["throughput_tok_s"] = per_seed["tokens"] / per_seed["latency_s"]
summary = {
    "variant": variant,
    "channel": channel,
    "gamma": gamma,
    "condition": condition.to_dict(),
    "profile_source": profile.source,
    "head_round_s": head_s,
    "fading_seeds": sorted(int(s) for s in rounds_by_seed),
    "median": per_seed[["e2e_latency_s", "aal", "throughput_tok_s"]].median().to_dict(),
    "per_seed": per_seed.reset_index().to_dict(orient="list"),
}
logging.info(
    "%s %s g%d over %d seeds: e2e latency median %.3f s (%.3f to %.3f), AAL %.3f",
    variant,
    channel,
    gamma,
    len(per_seed),
    summary["median"]["e2e_latency_s"],
    float(np.min(per_seed["e2e_latency_s"])),
    float(np.max(per_seed["e2e_latency_s"])),
    summary["median"]["aal"],
)
write_parquet(costs, snakemake.output.costs)
write_json(summary, snakemake.output.metrics)
