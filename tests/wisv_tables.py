"""Small WISV evaluation tables for the report tests: per (fading seed, prompt) costs as
``wisv.evaluate.price_over_seeds`` gives them, and per-prompt text scores as
``wisv.scores.text_scores`` gives them (two prompts, "a" and "b")."""

from __future__ import annotations

import pandas as pd

from edgespec.wisv.protocols import BREAKDOWN_PARTS


def costs(variant, seeds, latency, tokens=(4, 6), rounds=(2, 2), channel="poor", regime="measured"):
    """Per (seed, prompt) costs: latency[s][p], of which 0.1 s prefill, the rest draft time."""
    rows = []
    for s in seeds:
        for p, pid in enumerate(("a", "b")):
            rows.append(
                {
                    "regime": regime,
                    "variant": variant,
                    "channel": channel,
                    "gamma": 4,
                    "fading_index": s,
                    "prompt_id": pid,
                    "latency_s": latency[s][p],
                    "prefill_s": 0.1,
                    **{part: 0.0 for part in BREAKDOWN_PARTS},
                    "draft_s": latency[s][p] - 0.1,
                    "rounds": rounds[p],
                    "tokens": tokens[p],
                    "drafted": 4 * rounds[p],
                    "accepted": tokens[p] - rounds[p],
                    "mismatches": 1,
                    "semantic_accepts": 0,
                    "uplink_bits": 80.0,
                }
            )
    return pd.DataFrame(rows)


def scores(variant, channel, exact, semantic=(0.9, 0.8), regime=None):
    """Per-prompt scores; a channel-free decode (channel "any") serves every regime unless
    ``regime`` says otherwise, a CSI decode the measured regime."""
    if regime is None:
        regime = "any" if channel == "any" else "measured"
    return pd.DataFrame(
        {
            "regime": regime,
            "variant": variant,
            "channel": channel,
            "gamma": 4,
            "prompt_id": ["a", "b"],
            "task": "arithmetic",
            "exact_match": exact,
            "answer_fidelity": [1.0, 1.0],
            "semantic_accuracy": list(semantic),
            "identical_to_vanilla": [1.0, 0.0],
        }
    )
