"""Rule evaluate_wisv (WISV wing, edgespec.wisv.evaluate): one variant's rounds priced under one
channel and gamma, plus scores."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])


import numpy as np
import pandas as pd

from edgespec.artifacts import read_json, write_json
from edgespec.runconfig import completion_texts, prompt_split
from edgespec.scoring import answer_fidelity, exact_match, semantic_similarity
from edgespec.seeding import numpy_rng
from edgespec.wireless.channel import ChannelCondition, uplink_rate_bps
from edgespec.wireless.delay import LatencyProfile
from edgespec.wisv.evaluate import (
    draw_round_gains,
    round_latencies,
    round_uplink_bits,
    wisv_metrics,
)

params = snakemake.params
wisv = params.wisv
variant, channel = snakemake.wildcards.wvariant, snakemake.wildcards.wchannel
gamma = int(snakemake.wildcards.gamma)
condition = ChannelCondition.from_dict(params.channels[channel])
records = prompt_split(snakemake.input.prompts, "eval")
rounds = pd.read_parquet(snakemake.input.rounds)
if rounds["condition"].iloc[0] != channel:
    # Decoded channel-blind: draw this channel's gains exactly as decode_wisv would have.
    gains = draw_round_gains(
        condition,
        len(records),
        wisv["max_new_tokens"],
        numpy_rng(params.seed, "wisv-channel", channel),
    )
    row = {r.id: i for i, r in enumerate(records)}
    g = gains[rounds["prompt_id"].map(row).to_numpy(), rounds["round"].to_numpy()]
    rounds = rounds.assign(
        gain=g, rate_bps=np.asarray(uplink_rate_bps(condition, g)), condition=channel
    )
provenance = read_json(snakemake.input.provenance)
protocol = {
    "vocab_size": provenance["models"]["target"]["logits_size"],
    "hidden_size": provenance["models"]["draft"]["hidden_size"],
    "bits_per_value": wisv["hidden_bits"],
}
profile = LatencyProfile.from_dict(read_json(snakemake.input.profile))
latencies = round_latencies(rounds, variant, protocol, profile, condition.rtt_s, gamma)
uplink = round_uplink_bits(rounds, variant, protocol, gamma)
metrics = wisv_metrics(rounds, latencies, uplink)


ours = completion_texts(snakemake.input.completions, records)
vanilla = completion_texts(snakemake.input.reference, records)
refs = [r.reference or v for r, v in zip(records, vanilla, strict=True)]
em = [x for x in exact_match(ours, [r.gold_answer for r in records]) if x is not None]
metrics.update(
    {
        "task_accuracy": float(np.mean(em)) if em else float("nan"),
        "answer_fidelity": float(np.mean(answer_fidelity(ours, vanilla))),
        "semantic_accuracy": float(np.mean(semantic_similarity(ours, refs))),
        "identical_to_vanilla": float(
            np.mean([a == b for a, b in zip(ours, vanilla, strict=True)])
        ),
    }
)
write_json(
    {
        "variant": variant,
        "channel": channel,
        "gamma": gamma,
        "condition": condition.to_dict(),
        "profile_source": profile.source,
        **metrics,
    },
    snakemake.output.metrics,
)
