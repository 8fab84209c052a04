"""WISV: acceptance rules, channel-free and per-channel decoding, common fading across variants,
round latencies and per-answer costs (label mining: test_labels.py)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from edgespec.decoding import rounds as rounds_module
from edgespec.decoding.config import DecodingConfig
from edgespec.decoding.rounds import strict_acceptance
from edgespec.decoding.tokenwise import generate_tokenwise
from edgespec.wireless.channel import ChannelCondition, csi_features, uplink_rate_bps
from edgespec.wireless.delay import LatencyProfile
from edgespec.wisv.acceptance import head_acceptance, topk_acceptance
from edgespec.wisv.decode import CHANNEL_FREE, ROUND_COLUMNS, decode_wisv, variant_rule
from edgespec.wisv.evaluate import (
    VARIANTS,
    attach_channel,
    fading_seed,
    price_over_seeds,
    prompt_costs,
    round_breakdowns,
    round_gains,
    round_latencies,
    round_uplink_bits,
    wisv_metrics,
)
from edgespec.wisv.head import REJECT_ALL_TAU, DecisionHead, save_head
from edgespec.wisv.protocols import BREAKDOWN_PARTS

VOCAB = 61
HIDDEN = 32
MAX_NEW = 12
GAMMA = 3
CSI_NAMES = ["snr_db_instantaneous", "rate_mbps"]
CONDITION = ChannelCondition(
    name="poor", fading="rayleigh", bandwidth_hz=1e6, snr_db=5.0, correlation=0.8
)


def _prompts(seed: int = 0, lengths=(5, 9, 3, 7)) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lengths]


PROMPTS = _prompts()
IDS = [f"p{i}" for i in range(len(PROMPTS))]


def _cfg(batch_size: int = 2, keep_hidden: bool = True) -> DecodingConfig:
    return DecodingConfig(
        max_new_tokens=MAX_NEW, temperature=0.0, batch_size=batch_size, keep_hidden=keep_hidden
    )


def _encoder(condition, gain):
    feats = csi_features(condition, gain)
    return np.array([feats[k] for k in CSI_NAMES])


def _head(d_csi: int) -> DecisionHead:
    return DecisionHead(HIDDEN, HIDDEN, d_csi, generator=torch.Generator().manual_seed(3))


def _decode(variant, draft, target, acceptance, seed=5, batch_size=2, csi=True, keep=True):
    return decode_wisv(
        variant,
        draft,
        target,
        PROMPTS,
        IDS,
        _cfg(batch_size, keep),
        GAMMA,
        acceptance,
        CONDITION,
        fading_seed(seed, 0),
        _encoder if csi else None,
    )


@pytest.fixture(scope="module")
def target_greedy(tiny_target):
    cfg = DecodingConfig(max_new_tokens=MAX_NEW, temperature=0.0, batch_size=4)
    return generate_tokenwise(PROMPTS, cfg, torch.Generator(), target=tiny_target)


@pytest.fixture(scope="module")
def vanilla(tiny_draft_independent, tiny_target):
    return _decode("vanilla_sd", tiny_draft_independent, tiny_target, None)


def _same_rounds(a: pd.DataFrame, b: pd.DataFrame) -> None:
    cols = [c for c in ROUND_COLUMNS if c != "variant"]
    pd.testing.assert_frame_equal(a[cols].reset_index(drop=True), b[cols].reset_index(drop=True))


# --------------------------------------------------------------------------------------------
# decode_wisv and the acceptance rules
# --------------------------------------------------------------------------------------------


def test_vanilla_equals_target_greedy(vanilla, target_greedy):
    rounds, completions = vanilla
    assert completions == target_greedy
    assert list(rounds.columns) == list(ROUND_COLUMNS)
    assert (rounds["num_semantic_accepts"] == 0).all()
    assert (rounds["num_drafted"] == GAMMA).all()
    per_prompt = rounds.groupby("prompt_id", sort=False)["num_committed"].sum()
    assert per_prompt.tolist() == [len(c) for c in completions]
    # Rounds are numbered 0.. per prompt, and the rates follow the gains.
    for _, group in rounds.groupby("prompt_id"):
        assert group["round"].tolist() == list(range(len(group)))
    np.testing.assert_allclose(rounds["rate_bps"], uplink_rate_bps(CONDITION, rounds["gain"]))
    assert (rounds["num_mismatches"] > 0).any()


def test_head_with_tau_above_all_outputs_is_vanilla(vanilla, tiny_draft_independent, tiny_target):
    rounds, completions = _decode(
        "wisv_fh", tiny_draft_independent, tiny_target, head_acceptance(_head(2), 1.01)
    )
    assert completions == vanilla[1]
    _same_rounds(rounds, vanilla[0])
    rounds, completions = _decode(
        "head_no_csi",
        tiny_draft_independent,
        tiny_target,
        head_acceptance(_head(0), REJECT_ALL_TAU),
        csi=False,
    )
    assert completions == vanilla[1]
    _same_rounds(rounds, vanilla[0])


def test_head_with_tau_zero_accepts_every_draft(tiny_draft_independent, tiny_target):
    rounds, completions = _decode(
        "wisv_sh", tiny_draft_independent, tiny_target, head_acceptance(_head(2), 0.0)
    )
    assert (rounds["num_accepted"] == GAMMA).all()
    last = rounds.groupby("prompt_id")["round"].transform("max") == rounds["round"]
    assert (rounds.loc[~last, "num_committed"] == GAMMA + 1).all()
    assert [len(c) for c in completions] == [MAX_NEW] * len(PROMPTS)
    assert rounds["num_semantic_accepts"].sum() > 0
    assert (rounds["num_semantic_accepts"] <= rounds["num_mismatches"]).all()


@pytest.mark.parametrize(("variant", "keep"), [("vanilla_sd", False), ("wisv_fh", True)])
def test_the_delay_model_charges_every_draft_forward_the_engine_runs(
    monkeypatch, tiny_draft_independent, tiny_target, variant, keep
):
    """Counts the draft's forwards (rows x feeds of its ragged cache) while decoding and
    compares them with the draft time the round delay charges."""
    counted = {"rows": 0}

    class Counting(rounds_module.RaggedCachedModel):
        def feed(self, ids, valid, keep_last, *args, **kwargs):
            if self.model is tiny_draft_independent:
                counted["rows"] += int(ids.shape[0])
            return super().feed(ids, valid, keep_last, *args, **kwargs)

    monkeypatch.setattr(rounds_module, "RaggedCachedModel", Counting)
    rule = head_acceptance(_head(2), 0.5) if keep else None
    rounds, _ = _decode(variant, tiny_draft_independent, tiny_target, rule, csi=keep, keep=keep)
    assert counted["rows"] == int(rounds["draft_forwards"].sum()) > 0
    assert (rounds["draft_forwards"] == GAMMA + keep).all()
    profile = LatencyProfile(draft_token_s=0.01, target_token_s=0.02, target_verify_s={3: 0.05})
    parts = round_breakdowns(rounds, variant, PARAMS, profile, 0.01, GAMMA)
    assert parts["draft_s"].sum() == pytest.approx(0.01 * counted["rows"])


def test_head_needs_hidden_states(tiny_draft_independent, tiny_target):
    with pytest.raises(ValueError, match="keep_hidden"):
        _decode(
            "wisv_fh",
            tiny_draft_independent,
            tiny_target,
            head_acceptance(_head(2), 0.5),
            keep=False,
        )


def test_csi_head_without_encoder_raises(tiny_draft_independent, tiny_target):
    with pytest.raises(ValueError, match="csi_encoder"):
        _decode(
            "wisv_fh",
            tiny_draft_independent,
            tiny_target,
            head_acceptance(_head(2), 0.5),
            csi=False,
        )


def test_topk_all_vocab_accepts_all_and_top1_is_vanilla(
    vanilla, tiny_draft_independent, tiny_target
):
    rounds, completions = _decode(
        "topk_accept", tiny_draft_independent, tiny_target, topk_acceptance(VOCAB), csi=False
    )
    assert (rounds["num_accepted"] == GAMMA).all()
    assert [len(c) for c in completions] == [MAX_NEW] * len(PROMPTS)
    rounds, completions = _decode(
        "topk_accept", tiny_draft_independent, tiny_target, topk_acceptance(1), csi=False
    )
    assert completions == vanilla[1]
    _same_rounds(rounds, vanilla[0])


def test_intermediate_threshold_accepts_some_mismatches(
    vanilla, tiny_draft_independent, tiny_target
):
    head = _head(2)
    rounds, _ = _decode("wisv_fh", tiny_draft_independent, tiny_target, head_acceptance(head, 0.5))
    # A random head accepts some mismatches and rejects others.
    assert rounds["num_semantic_accepts"].sum() > 0
    assert (rounds["num_accepted"] < GAMMA).any()


def test_common_random_numbers_across_variants(vanilla, tiny_draft_independent, tiny_target):
    gains = round_gains(CONDITION, IDS, MAX_NEW, fading_seed(5, 0))
    other, _ = _decode(
        "topk_accept", tiny_draft_independent, tiny_target, topk_acceptance(VOCAB), batch_size=3
    )
    for rounds in (vanilla[0], other):
        index = rounds["prompt_id"].map({p: i for i, p in enumerate(IDS)}).to_numpy()
        np.testing.assert_array_equal(rounds["gain"], gains[index, rounds["round"].to_numpy()])
    both = vanilla[0].merge(other, on=["prompt_id", "round"], suffixes=("_a", "_b"))
    assert len(both) > 0
    np.testing.assert_array_equal(both["gain_a"], both["gain_b"])


def test_channel_free_decode_equals_channel_decode_of_a_blind_variant(
    vanilla, tiny_draft_independent, tiny_target
):
    rounds, completions = decode_wisv(
        "vanilla_sd",
        tiny_draft_independent,
        tiny_target,
        PROMPTS,
        IDS,
        _cfg(),
        GAMMA,
        None,
        None,
    )
    assert completions == vanilla[1]
    assert (rounds["condition"] == CHANNEL_FREE).all() and rounds["gain"].isna().all()
    assert (
        rounds["prompt_tokens"]
        == rounds["prompt_id"].map(dict(zip(IDS, map(len, PROMPTS), strict=True)))
    ).all()
    # Priced under the decode's seed, the channel-free rounds are the channel decode's rounds.
    priced = attach_channel(rounds, CONDITION, fading_seed(5, 0))
    _same_rounds(priced, vanilla[0])
    with pytest.raises(ValueError, match="fading_seed"):
        decode_wisv(
            "vanilla_sd",
            tiny_draft_independent,
            tiny_target,
            PROMPTS,
            IDS,
            _cfg(),
            GAMMA,
            None,
            CONDITION,
        )
    with pytest.raises(ValueError, match="CSI encoder"):
        decode_wisv(
            "wisv_fh",
            tiny_draft_independent,
            tiny_target,
            PROMPTS,
            IDS,
            _cfg(),
            GAMMA,
            None,
            None,
            csi_encoder=_encoder,
        )


def test_head_decisions_read_the_rounds_csi(tiny_draft_independent, tiny_target):
    """A head that looks only at the instantaneous SNR accepts a mismatch iff that round's SNR
    is above 5 dB: the acceptance rule must hand the round's own CSI to the head."""
    head = DecisionHead(HIDDEN, HIDDEN, 2)
    with torch.no_grad():
        head.net.weight.zero_()
        head.net.weight[0, 2 * HIDDEN] = 4.0  # snr_db_instantaneous
        head.net.bias.fill_(-4.0 * 5.0)
    seen = []
    inner = head_acceptance(head, 0.5)

    def recording(round_, generator):
        verdict = inner(round_, generator)
        seen.append((round_.csi[:, 0].clone(), round_.draft_tokens, round_.target_logits, verdict))
        return verdict

    _decode("wisv_fh", tiny_draft_independent, tiny_target, recording, seed=11)
    accepted_mismatch = 0
    for snr, drafts, logits, verdict in seen:
        mismatch = drafts != logits[:, :GAMMA].argmax(-1)
        for row in range(len(snr)):
            first = int(mismatch[row].nonzero()[0]) if mismatch[row].any() else GAMMA
            if first == GAMMA:
                continue
            expected = bool(snr[row] > 5.0)  # the head's verdict on the first mismatch
            assert (int(verdict.num_accepted[row]) > first) == expected
            accepted_mismatch += expected
    assert accepted_mismatch > 0
    assert any(bool((s <= 5.0).any()) for s, *_ in seen)


def test_round_sees_its_own_csi(tiny_draft_close, tiny_target):
    seen = []
    strict = strict_acceptance(0.0)

    def recording(round_, generator):
        seen.append((round_.round_indices.clone(), round_.gains.clone(), round_.csi.clone()))
        return strict(round_, generator)

    rounds, _ = _decode("wisv_fh", tiny_draft_close, tiny_target, recording)
    assert sum(len(r) for r, _, _ in seen) == len(rounds)
    for _, gains, csi in seen:
        expected = np.stack([_encoder(CONDITION, float(g)) for g in gains])
        np.testing.assert_allclose(csi.numpy(), expected)
    got = sorted(float(g) for _, gains, _ in seen for g in gains)
    np.testing.assert_allclose(got, sorted(rounds["gain"]))


def test_bad_variant_and_sampling_rejected(tiny_draft_close, tiny_target):
    with pytest.raises(ValueError, match="variant"):
        _decode("judge", tiny_draft_close, tiny_target, None)
    cfg = DecodingConfig(max_new_tokens=4, temperature=1.0)
    with pytest.raises(ValueError, match="greedy"):
        decode_wisv(
            "vanilla_sd",
            tiny_draft_close,
            tiny_target,
            PROMPTS,
            IDS,
            cfg,
            GAMMA,
            None,
            CONDITION,
            np.random.default_rng(0),
        )


def test_each_variant_decodes_with_its_rule(tmp_path, tiny_draft_independent, tiny_target):
    """Rule decode_wisv's choice: strict matching, top-k at wisv.top_k, or the saved head at
    its saved tau with the encoder of its saved CSI features."""
    assert variant_rule("vanilla_sd") == (None, None, False)
    topk = variant_rule("topk_accept", top_k=4)
    assert topk.acceptance is not None and topk.csi_encoder is None and not topk.keep_hidden
    with pytest.raises(ValueError, match="wisv.top_k"):
        variant_rule("topk_accept")
    with pytest.raises(ValueError, match="unknown WISV variant"):
        variant_rule("judge")
    with pytest.raises(ValueError, match="decision head"):
        variant_rule("wisv")
    save_head(_head(0), tmp_path / "plain.pt", {"tau": 0.3})
    plain = variant_rule("head_no_csi", str(tmp_path / "plain.pt"))
    assert plain.keep_hidden and plain.csi_encoder is None
    save_head(_head(2), tmp_path / "csi.pt", {"tau": 0.45, "csi_features": CSI_NAMES})
    rule = variant_rule("wisv", str(tmp_path / "csi.pt"))
    assert rule.keep_hidden
    np.testing.assert_array_equal(rule.csi_encoder(CONDITION, 0.7), _encoder(CONDITION, 0.7))
    rounds, _ = _decode("wisv_fh", tiny_draft_independent, tiny_target, rule.acceptance)
    direct, _ = _decode(
        "wisv_fh", tiny_draft_independent, tiny_target, head_acceptance(_head(2), 0.45)
    )
    _same_rounds(rounds, direct)
    assert 0 < rounds["num_semantic_accepts"].sum() < rounds["num_mismatches"].sum()


# --------------------------------------------------------------------------------------------
# Latency and metrics
# --------------------------------------------------------------------------------------------

PROFILE = LatencyProfile(draft_token_s=0.01, target_token_s=0.02, target_verify_s={4: 0.05})
PARAMS = {"vocab_size": VOCAB, "hidden_size": HIDDEN, "bits_per_value": 16}


def _hand_rounds() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "prompt_id": ["a", "a", "b"],
            "round": [0, 1, 0],
            "num_drafted": [4, 4, 4],
            "num_accepted": [4, 1, 2],
            "num_committed": [5, 2, 3],
            "num_mismatches": [0, 2, 3],
            "num_semantic_accepts": [0, 0, 1],
            # the first round kept no hidden states, the others ran one more draft forward
            "draft_forwards": [4, 5, 5],
            "rate_bps": [1e4, 1e4, 2e4],
        }
    )


def test_round_latencies_hand_computed():
    rounds = _hand_rounds()
    # ids: ceil(log2 61) = 6 bit; hidden: 32 * 16 = 512 bit; compute n_d * 0.01 + 0.05 s with
    # n_d the round's draft forwards: 0.09 s, then 0.10 s twice.
    rtt = 0.02
    c = np.array([0.09, 0.10, 0.10])
    fh = round_latencies(rounds, "wisv_fh", PARAMS, PROFILE, rtt, 4)
    fh_bits = 4 * (6 + 512)
    np.testing.assert_allclose(fh, c + np.array([fh_bits / 1e4 + rtt] * 2 + [fh_bits / 2e4 + rtt]))
    sh = round_latencies(rounds, "wisv_sh", PARAMS, PROFILE, rtt, 4)
    np.testing.assert_allclose(
        sh,
        c
        + np.array(
            [
                24 / 1e4 + rtt,  # no mismatch: no extra trip
                (24 + 2 * 512) / 1e4 + 2 * rtt,
                (24 + 3 * 512) / 2e4 + 2 * rtt,
            ]
        ),
    )
    vanilla = round_latencies(rounds, "vanilla_sd", PARAMS, PROFILE, rtt, 4)
    np.testing.assert_allclose(vanilla, c + np.array([24 / 1e4 + rtt] * 2 + [24 / 2e4 + rtt]))
    np.testing.assert_allclose(round_latencies(rounds, "head_no_csi", PARAMS, PROFILE, rtt, 4), fh)
    np.testing.assert_allclose(
        round_latencies(rounds, "head_relabel_no_csi", PARAMS, PROFILE, rtt, 4), fh
    )
    np.testing.assert_allclose(
        round_latencies(rounds, "topk_accept", PARAMS, PROFILE, rtt, 4), vanilla
    )
    # Decision-head time is charged to head variants in rounds with a mismatch.
    timed = round_latencies(rounds, "wisv_fh", PARAMS, PROFILE, rtt, 4, head_s=0.003)
    np.testing.assert_allclose(timed - fh, [0.0, 0.003, 0.003])
    np.testing.assert_allclose(
        round_uplink_bits(rounds, "wisv_sh", PARAMS, 4), [24, 24 + 1024, 24 + 1536]
    )
    with pytest.raises(ValueError, match="gamma"):
        round_latencies(rounds, "wisv_fh", PARAMS, PROFILE, rtt, 3)


def test_wisv_metrics_hand_computed():
    rounds = _hand_rounds()
    lat = np.array([0.1, 0.2, 0.4])
    bits = np.array([24.0, 24.0, 24.0])
    m = wisv_metrics(rounds, lat, bits)
    assert m["num_prompts"] == 2 and m["num_rounds"] == 3 and m["num_tokens"] == 10
    assert math.isclose(m["aal"], 10 / 3)
    assert math.isclose(m["rounds_per_answer"], 1.5)
    assert math.isclose(m["e2e_latency_s"], (0.3 + 0.4) / 2)
    assert math.isclose(m["throughput_tok_s"], 10 / 0.7)
    assert math.isclose(m["acceptance_rate"], 7 / 12)
    assert math.isclose(m["semantic_accept_fraction"], 1 / 7)
    assert math.isclose(m["uplink_bytes_per_round"], 72 / 8 / 3)
    assert math.isclose(m["uplink_bytes_per_token"], 72 / 8 / 10)
    assert math.isnan(wisv_metrics(rounds, lat)["uplink_bytes_per_token"])


def test_prompt_costs_add_the_prefill_hand_computed():
    rounds = _hand_rounds().assign(prompt_tokens=[7, 7, 3])
    profile = LatencyProfile(
        draft_token_s=0.01,
        target_token_s=0.02,
        target_verify_s={4: 0.05},
        draft_prefill_token_s=0.001,
        target_prefill_token_s=0.002,
    )
    parts = pd.DataFrame(0.0, index=rounds.index, columns=list(BREAKDOWN_PARTS))
    parts["draft_s"] = [0.05, 0.1, 0.3]
    parts["retransmission_s"] = [0.05, 0.1, 0.1]
    costs = prompt_costs(rounds, parts, [24.0, 24.0, 30.0], profile)
    assert costs["prompt_id"].tolist() == ["a", "b"]
    np.testing.assert_allclose(costs["prefill_s"], [7 * 0.003, 3 * 0.003])
    np.testing.assert_allclose(costs["latency_s"], [0.3 + 0.021, 0.4 + 0.009])
    np.testing.assert_allclose(costs["draft_s"], [0.15, 0.3])
    np.testing.assert_allclose(costs["retransmission_s"], [0.15, 0.1])
    assert costs["rounds"].tolist() == [2, 1] and costs["tokens"].tolist() == [7, 3]
    assert costs["uplink_bits"].tolist() == [48.0, 30.0]
    assert costs["semantic_accepts"].tolist() == [0, 1]


def _blind_rounds(prompts=("a", "b", "c"), num_rounds=(3, 5, 2), gamma=4):
    rows = []
    for pid, n in zip(prompts, num_rounds, strict=True):
        for r in range(n):
            rows.append(
                {
                    "prompt_id": pid,
                    "prompt_tokens": 5,
                    "round": r,
                    "num_drafted": gamma,
                    "num_accepted": 1,
                    "num_committed": 2,
                    "num_mismatches": 1,
                    "num_semantic_accepts": 0,
                    "draft_forwards": gamma + 1,
                    "gain": np.nan,
                    "rate_bps": np.nan,
                }
            )
    return pd.DataFrame(rows)


def test_every_variant_channel_and_gamma_sees_the_same_draw_per_prompt_round_and_seed():
    poor = CONDITION
    good = ChannelCondition(
        name="good", fading="rayleigh", bandwidth_hz=2e7, snr_db=20.0, correlation=0.8
    )
    seed = fading_seed(9, 3)
    short = attach_channel(_blind_rounds(), poor, seed)
    # Another channel, another gamma (other round counts), another set of prompts.
    other = attach_channel(_blind_rounds(("c", "a"), (6, 4), gamma=8), good, seed)
    both = short.merge(other, on=["prompt_id", "round"], suffixes=("_x", "_y"))
    assert len(both) == 2 + 3
    np.testing.assert_array_equal(both["gain_x"], both["gain_y"])
    # A prompt's rounds follow the Gauss-Markov stream of its own seed.
    stream = round_gains(poor, ["b"], 5, seed)[0]
    np.testing.assert_array_equal(short.loc[short["prompt_id"] == "b", "gain"], stream)
    # Other fading seeds give other draws.
    again = attach_channel(_blind_rounds(), poor, fading_seed(9, 4))
    assert not np.allclose(again["gain"], short["gain"])


def test_price_over_seeds_reprices_blind_rounds_and_checks_csi_decodes():
    profile = LatencyProfile(draft_token_s=0.01, target_token_s=0.02, target_verify_s={4: 0.05})
    blind = _blind_rounds()
    costs = price_over_seeds(
        {s: blind for s in range(4)}, "wisv_fh", CONDITION, PARAMS, profile, 4, seed=9, head_s=0.01
    )
    assert sorted(costs["fading_index"].unique()) == [0, 1, 2, 3]
    for s in range(4):
        priced = attach_channel(blind, CONDITION, fading_seed(9, s))
        lat = round_latencies(priced, "wisv_fh", PARAMS, profile, CONDITION.rtt_s, 4, head_s=0.01)
        per_prompt = pd.Series(lat).groupby(priced["prompt_id"].to_numpy(), sort=False).sum()
        got = costs[costs["fading_index"] == s].set_index("prompt_id")["latency_s"]
        np.testing.assert_allclose(got[per_prompt.index], per_prompt.to_numpy())
    # A CSI-reading variant's decode carries its gains; priced under another seed, it is refused.
    decoded = attach_channel(blind, CONDITION, fading_seed(9, 0))
    ok = price_over_seeds({0: decoded}, "wisv_sh", CONDITION, PARAMS, profile, 4, seed=9)
    assert ok["fading_index"].unique().tolist() == [0]
    with pytest.raises(ValueError, match="other gains"):
        price_over_seeds({1: decoded}, "wisv_sh", CONDITION, PARAMS, profile, 4, seed=9)


def test_metrics_of_a_decoded_run(vanilla):
    rounds, completions = vanilla
    lat = round_latencies(
        rounds,
        "vanilla_sd",
        PARAMS,
        LatencyProfile(draft_token_s=0.01, target_token_s=0.02, target_verify_s={GAMMA: 0.05}),
        0.01,
        GAMMA,
    )
    m = wisv_metrics(rounds, lat, round_uplink_bits(rounds, "vanilla_sd", PARAMS, GAMMA))
    assert m["num_tokens"] == sum(len(c) for c in completions)
    assert 1.0 <= m["aal"] <= GAMMA + 1
    assert set(VARIANTS) == {
        "vanilla_sd",
        "topk_accept",
        "head_no_csi",
        "head_relabel_no_csi",
        "wisv_fh",
        "wisv_sh",
    }


def _ragged_greedy(target_greedy):
    """Target-only greedy continuations cut to different lengths (a prefix of a greedy
    continuation is one too), so rows end inside and across the check's chunks."""
    return [list(row[: MAX_NEW - 3 * (i % 4)]) for i, row in enumerate(target_greedy)]


@pytest.mark.parametrize("chunk", [16, 3])
@pytest.mark.parametrize("from_store", [False, True])
def test_greedy_check_passes_the_targets_own_greedy_tokens(
    tiny_target, target_greedy, vanilla, tmp_path, monkeypatch, chunk, from_store
):
    from edgespec.decoding.prefill_store import PrefillStore
    from edgespec.wisv import decode as wisv_decode

    monkeypatch.setattr(wisv_decode, "GREEDY_CHECK_CHUNK", chunk)
    store = None
    if from_store:
        PrefillStore.compute({"target": tiny_target}, PROMPTS, 0, 4, tmp_path / "p.safetensors")
        store = PrefillStore.load([tmp_path / "p.safetensors"])
    rows = _ragged_greedy(target_greedy)
    check = wisv_decode.check_greedy_equivalence(tiny_target, PROMPTS, rows, 1e-9, store)
    assert check["identical"] == len(PROMPTS) and check["near_ties"] == 0
    assert check["tokens"] == sum(map(len, rows))
    _, completions = vanilla  # vanilla SD's own output, through the same check
    assert wisv_decode.check_greedy_equivalence(tiny_target, PROMPTS, completions, 1e-9)[
        "identical"
    ] == len(PROMPTS)


def _logits_after(target, ids):
    with torch.no_grad():
        return target(torch.tensor([ids])).logits[0, -1]


@pytest.mark.parametrize("position", [0, 2, 3, 5])
def test_greedy_check_rejects_a_token_the_target_would_not_choose(
    tiny_target, target_greedy, monkeypatch, position
):
    from edgespec.wisv import decode as wisv_decode

    monkeypatch.setattr(wisv_decode, "GREEDY_CHECK_CHUNK", 3)  # 3 and 5 open and end a chunk
    rows = _ragged_greedy(target_greedy)
    row = 1
    logits = _logits_after(tiny_target, list(PROMPTS[row]) + rows[row][:position])
    runner_up = int(logits.topk(2).indices[1])
    rows[row] = rows[row][:position] + [runner_up]
    with pytest.raises(AssertionError, match=f"new token {position} of prompt {row} "):
        wisv_decode.check_greedy_equivalence(tiny_target, PROMPTS, rows, 1e-9)
    gap = float(logits.max() - logits[runner_up])
    tie = wisv_decode.check_greedy_equivalence(tiny_target, PROMPTS, rows, gap + 1e-6)
    assert (tie["near_ties"], tie["identical"]) == (1, len(PROMPTS) - 1)
    assert tie["max_margin"] == pytest.approx(gap, abs=1e-9)
