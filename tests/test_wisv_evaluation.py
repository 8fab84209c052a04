"""Rule evaluate_wisv's glue (edgespec.wisv.evaluate): which decode each fading seed prices, the
protocol's sizes, the head's time charged to the variants that run one, the per-seed summary."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from script_runner import Snakemake, run_script

from edgespec.wireless.channel import ChannelCondition
from edgespec.wireless.delay import LatencyProfile
from edgespec.wisv.evaluate import (
    CSI_VARIANTS,
    HEAD_OF_VARIANT,
    PROMPT_COLUMNS,
    attach_channel,
    evaluate_variant,
    fading_seed,
    head_round_s,
    price_over_seeds,
    protocol_params,
    rounds_by_fading_seed,
)
from edgespec.wisv.protocols import BREAKDOWN_PARTS

CONDITION = ChannelCondition(
    name="poor", fading="rayleigh", bandwidth_hz=1e6, snr_db=0.0, rtt_s=0.03, correlation=0.8
)
PROFILE = LatencyProfile(draft_token_s=0.01, target_token_s=0.02, target_verify_s={4: 0.05})
PARAMS = {"vocab_size": 61, "hidden_size": 32, "bits_per_value": 16}
HEAD_TIMES = {
    "head_round_s": {"wisv_head": 0.007, "no_csi_head": 0.003, "relabel_no_csi_head": 0.005}
}


def _rounds() -> pd.DataFrame:
    """Three prompts' channel-free rounds, some without a mismatch (no head runs there)."""
    rows = []
    for pid, mismatches in (("a", (1, 0, 2)), ("b", (0, 0, 1, 3, 0)), ("c", (2, 1))):
        for r, m in enumerate(mismatches):
            rows.append(
                {
                    "prompt_id": pid,
                    "prompt_tokens": 6,
                    "round": r,
                    "num_drafted": 4,
                    "num_accepted": 4 - m,
                    "num_committed": 5 if m == 0 else 5 - m,
                    "num_mismatches": m,
                    "num_semantic_accepts": 0,
                    "draft_forwards": 5,
                    "gain": np.nan,
                    "rate_bps": np.nan,
                }
            )
    return pd.DataFrame(rows)


@pytest.mark.parametrize(
    ("variant", "charged"),
    [
        ("head_no_csi", 0.003),
        ("head_relabel_no_csi", 0.005),
        ("wisv_fh", 0.007),
        ("wisv_sh", 0.007),
    ],
)
def test_the_heads_time_is_charged_in_rounds_with_a_mismatch(variant, charged):
    rounds = _rounds()
    # A CSI-reading variant's decodes carry the gains of their own fading seed.
    by_seed = {
        s: attach_channel(rounds, CONDITION, fading_seed(9, s))
        if variant in CSI_VARIANTS
        else rounds
        for s in (0, 1)
    }
    costs, summary = evaluate_variant(
        by_seed, variant, "poor", CONDITION, PARAMS, PROFILE, 4, 9, HEAD_TIMES
    )
    free = price_over_seeds(by_seed, variant, CONDITION, PARAMS, PROFILE, 4, 9, head_s=0.0)
    with_head = rounds.groupby("prompt_id")["num_mismatches"].apply(lambda m: int((m > 0).sum()))
    extra = costs["latency_s"].to_numpy() - free["latency_s"].to_numpy()
    np.testing.assert_allclose(extra, charged * with_head[costs["prompt_id"]].to_numpy())
    assert summary["head_round_s"] == charged


def test_variants_without_a_head_pay_none():
    rounds = _rounds()
    for variant in ("vanilla_sd", "topk_accept"):
        assert head_round_s(variant, None) == 0.0 and head_round_s(variant, HEAD_TIMES) == 0.0
        costs, summary = evaluate_variant(
            {0: rounds}, variant, "poor", CONDITION, PARAMS, PROFILE, 4, 9
        )
        free = price_over_seeds({0: rounds}, variant, CONDITION, PARAMS, PROFILE, 4, 9)
        np.testing.assert_array_equal(costs["latency_s"], free["latency_s"])
        assert summary["head_round_s"] == 0.0
    with pytest.raises(ValueError, match="decision head"):
        head_round_s("head_no_csi", None)
    with pytest.raises(ValueError, match="unknown WISV variant"):
        head_round_s("wisv", HEAD_TIMES)


def test_the_summary_per_fading_seed():
    rounds = _rounds()
    costs, summary = evaluate_variant(
        {s: rounds for s in range(3)},
        "head_no_csi",
        "poor",
        CONDITION,
        PARAMS,
        PROFILE,
        4,
        9,
        HEAD_TIMES,
    )
    assert list(costs.columns) == ["regime", "variant", "channel", "gamma", *PROMPT_COLUMNS]
    assert (costs["regime"] == "measured").all() and summary["regime"] == "measured"
    assert (costs["variant"] == "head_no_csi").all() and (costs["gamma"] == 4).all()
    assert summary["fading_seeds"] == [0, 1, 2] and summary["channel"] == "poor"
    assert summary["condition"] == CONDITION.to_dict() and summary["profile_source"] == "measured"
    per_seed = summary["per_seed"]
    assert per_seed["fading_index"] == [0, 1, 2]
    for s in range(3):
        mine = costs[costs["fading_index"] == s]
        assert per_seed["e2e_latency_s"][s] == pytest.approx(mine["latency_s"].mean())
        assert per_seed["tokens"][s] == mine["tokens"].sum() == rounds["num_committed"].sum()
        assert per_seed["aal"][s] == pytest.approx(mine["tokens"].sum() / len(rounds))
        throughput = mine["tokens"].sum() / mine["latency_s"].sum()
        assert per_seed["throughput_tok_s"][s] == pytest.approx(throughput)
    median = summary["median"]
    assert median["e2e_latency_s"] == pytest.approx(np.median(per_seed["e2e_latency_s"]))
    # The seeds' draws differ: the latencies do too.
    assert len(set(per_seed["e2e_latency_s"])) == 3


def test_which_decode_each_fading_seed_prices():
    a, b = _rounds(), _rounds().iloc[:4]
    assert rounds_by_fading_seed("wisv_sh", [a, b], [3, 5], None) == {3: a, 5: b}
    with pytest.raises(ValueError):
        rounds_by_fading_seed("wisv_fh", [a], [3, 5], None)
    blind = rounds_by_fading_seed("vanilla_sd", [a], None, 4)
    assert list(blind) == [0, 1, 2, 3] and all(t is a for t in blind.values())
    with pytest.raises(ValueError, match="evaluation.fading_seeds"):
        rounds_by_fading_seed("head_no_csi", [a], None, None)


def test_protocol_sizes_from_the_provenance():
    provenance = {"models": {"target": {"logits_size": 151936}, "draft": {"hidden_size": 896}}}
    assert protocol_params(provenance, 8) == {
        "vocab_size": 151936,
        "hidden_size": 896,
        "bits_per_value": 8,
    }


@pytest.mark.parametrize("variant", ["head_relabel_no_csi", "wisv_sh"])
def test_evaluate_script_charges_the_regimes_head_time_and_every_part(tmp_path, variant):
    """workflow/scripts/evaluate_wisv.py on constructed rounds and a regime's pricing: each
    answer is charged the head's time in its rounds with a mismatch (a script that zeroed the
    head's time fails here), its parts add up to its latency, and the regime is named."""
    rounds = _rounds()
    seeds = [0, 1] if variant in CSI_VARIANTS else [0, 1, 2]
    paths = []
    for s in seeds if variant in CSI_VARIANTS else [None]:
        table = rounds if s is None else attach_channel(rounds, CONDITION, fading_seed(9, s))
        paths.append(tmp_path / f"rounds{s}.parquet")
        table.to_parquet(paths[-1])
    pricing = {
        "regime": "testbed",
        "profile": PROFILE.to_dict(),
        "protocol": PARAMS,
        "head_times": HEAD_TIMES,
        "description": "a test regime",
    }
    (tmp_path / "pricing.json").write_text(json.dumps(pricing))
    out = {"costs": tmp_path / "costs.parquet", "metrics": tmp_path / "metrics.json"}
    wisv = {"arq": {"packet_bits": 1080, "max_retransmissions": 3, "timeout_s": None}}
    if variant in CSI_VARIANTS:
        wisv["csi_decode_seeds"] = seeds
    run_script(
        "evaluate_wisv",
        Snakemake(
            input={"rounds": [str(p) for p in paths], "pricing": tmp_path / "pricing.json"},
            output=out,
            params={
                "wisv": wisv,
                "channels": {"poor": CONDITION.to_dict()},
                "evaluation": {} if variant in CSI_VARIANTS else {"fading_seeds": 3},
                "seed": 9,
            },
            wildcards={"wvariant": variant, "wchannel": "poor", "gamma": "4"},
            log=tmp_path / "evaluate.log",
        ),
    )
    costs = pd.read_parquet(out["costs"])
    assert (costs["regime"] == "testbed").all()
    assert sorted(costs["fading_index"].unique()) == seeds
    with_head = rounds.groupby("prompt_id")["num_mismatches"].apply(lambda m: int((m > 0).sum()))
    charged = HEAD_TIMES["head_round_s"][HEAD_OF_VARIANT[variant]]
    np.testing.assert_allclose(
        costs["head_s"], charged * with_head[costs["prompt_id"]].to_numpy(), rtol=1e-12
    )
    parts = costs[["prefill_s", *BREAKDOWN_PARTS]].sum(axis=1)
    np.testing.assert_allclose(parts, costs["latency_s"], rtol=1e-12)
    # Five draft forwards a round are charged (the fixture's rounds kept hidden states).
    rounds_per_prompt = rounds.groupby("prompt_id").size()[costs["prompt_id"]].to_numpy()
    np.testing.assert_allclose(costs["draft_s"], 5 * 0.01 * rounds_per_prompt)
    assert json.loads(out["metrics"].read_text())["regime"] == "testbed"
