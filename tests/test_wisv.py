"""WISV: label mining, semantic acceptance rules, per-channel decoding and round latencies."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from edgespec.data.answers import extract_final_number
from edgespec.decoding.engine import DecodingConfig, generate_tokenwise, strict_acceptance
from edgespec.wireless.channel import ChannelCondition, csi_features, uplink_rate_bps
from edgespec.wireless.delay import LatencyProfile
from edgespec.wisv.acceptance import head_acceptance, topk_acceptance
from edgespec.wisv.decode import ROUND_COLUMNS, decode_wisv
from edgespec.wisv.evaluate import (
    VARIANTS,
    draw_round_gains,
    round_latencies,
    round_uplink_bits,
    wisv_metrics,
)
from edgespec.wisv.head import REJECT_ALL_TAU, DecisionHead
from edgespec.wisv.labels import LABEL_COLUMNS, mine_labels

VOCAB = 61
HIDDEN = 32
MAX_NEW = 12
GAMMA = 3
CSI_NAMES = ["snr_db_instantaneous", "rate_mbps"]
CONDITION = ChannelCondition(name="poor", fading="rayleigh", bandwidth_hz=1e6, snr_db=5.0)


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
        np.random.default_rng(seed),
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
    gains = draw_round_gains(CONDITION, len(PROMPTS), MAX_NEW, np.random.default_rng(5))
    other, _ = _decode(
        "topk_accept", tiny_draft_independent, tiny_target, topk_acceptance(VOCAB), batch_size=3
    )
    for rounds in (vanilla[0], other):
        index = rounds["prompt_id"].map({p: i for i, p in enumerate(IDS)}).to_numpy()
        np.testing.assert_array_equal(rounds["gain"], gains[index, rounds["round"].to_numpy()])
    both = vanilla[0].merge(other, on=["prompt_id", "round"], suffixes=("_a", "_b"))
    assert len(both) > 0
    np.testing.assert_array_equal(both["gain_a"], both["gain_b"])


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
            "rate_bps": [1e4, 1e4, 2e4],
        }
    )


def test_round_latencies_hand_computed():
    rounds = _hand_rounds()
    # ids: ceil(log2 61) = 6 bit; hidden: 32 * 16 = 512 bit; compute 4 * 0.01 + 0.05 = 0.09 s.
    rtt = 0.02
    fh = round_latencies(rounds, "wisv_fh", PARAMS, PROFILE, rtt, 4)
    fh_bits = 4 * (6 + 512)
    np.testing.assert_allclose(fh, [0.09 + fh_bits / 1e4 + rtt] * 2 + [0.09 + fh_bits / 2e4 + rtt])
    sh = round_latencies(rounds, "wisv_sh", PARAMS, PROFILE, rtt, 4)
    np.testing.assert_allclose(
        sh,
        [
            0.09 + 24 / 1e4 + rtt,  # no mismatch: no extra trip
            0.09 + (24 + 2 * 512) / 1e4 + 2 * rtt,
            0.09 + (24 + 3 * 512) / 2e4 + 2 * rtt,
        ],
    )
    vanilla = round_latencies(rounds, "vanilla_sd", PARAMS, PROFILE, rtt, 4)
    np.testing.assert_allclose(vanilla, [0.09 + 24 / 1e4 + rtt] * 2 + [0.09 + 24 / 2e4 + rtt])
    np.testing.assert_allclose(round_latencies(rounds, "head_no_csi", PARAMS, PROFILE, rtt, 4), fh)
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
    assert set(VARIANTS) == {"vanilla_sd", "topk_accept", "head_no_csi", "wisv_fh", "wisv_sh"}


# --------------------------------------------------------------------------------------------
# Label mining
# --------------------------------------------------------------------------------------------


def _answer_text(ids: list[int]) -> str:
    """A toy "answer": the parity of the last token, so substitutions change it half the time."""
    return f"the answer is {ids[-1] % 2}" if ids else ""


def _letters(ids: list[int]) -> str:
    return "".join(chr(97 + t % 26) for t in ids)


def _exact(a: list[str], b: list[str]) -> list[float]:
    return [1.0 if x == y else 0.0 for x, y in zip(a, b, strict=True)]


@pytest.fixture(scope="module")
def mined(tiny_draft_close, tiny_target):
    return mine_labels(
        tiny_draft_close,
        tiny_target,
        PROMPTS,
        IDS,
        [None] * len(PROMPTS),
        MAX_NEW,
        [],
        0,
        3,
        _answer_text,
        None,
        0.5,
        None,
    )


def test_mine_labels_shapes_and_labels(mined, tiny_draft_close, tiny_target):
    table, h_draft, h_target = mined
    assert list(table.columns) == list(LABEL_COLUMNS)
    assert len(table) > 0
    assert h_draft.shape == (len(table), HIDDEN) and h_target.shape == (len(table), HIDDEN)
    assert set(table["label"]) <= {0, 1} and set(table["label"]) == {0, 1}
    np.testing.assert_array_equal(table["risk"], table["label"].astype(float))
    assert table["answer_task"].all() and table["similarity"].isna().all()
    assert (table["draft_token"] != table["target_token"]).all()
    for _, group in table.groupby("prompt_id"):
        assert group["step"].tolist() == list(range(len(group)))
        assert group["position"].is_monotonic_increasing and group["position"].is_unique
    # Hidden-state convention: the states that proposed / scored the token at the position.
    with torch.no_grad():
        d_choice = tiny_draft_close.lm_head(torch.as_tensor(h_draft, dtype=torch.float64))
        t_choice = tiny_target.lm_head(torch.as_tensor(h_target, dtype=torch.float64))
    np.testing.assert_array_equal(d_choice.argmax(-1).numpy(), table["draft_token"])
    np.testing.assert_array_equal(t_choice.argmax(-1).numpy(), table["target_token"])


def test_mine_labels_first_mismatch_matches_direct_computation(
    mined, target_greedy, tiny_draft_close, tiny_target
):
    """Step 0 of each prompt, recomputed one prompt at a time with Hugging Face forwards."""
    table, h_draft, h_target = mined
    for i, prompt in enumerate(PROMPTS):
        rows = table.index[(table["prompt_id"] == IDS[i]) & (table["step"] == 0)]
        response = target_greedy[i]
        seq = torch.tensor([prompt + response])
        with torch.no_grad():
            d_out = tiny_draft_close(seq, output_hidden_states=True)
            t_out = tiny_target(seq, output_hidden_states=True)
        start = len(prompt) - 1
        choice = d_out.logits[0, start : start + len(response)].argmax(-1).tolist()
        mism = [p for p, (c, r) in enumerate(zip(choice, response, strict=True)) if c != r]
        if not mism:
            assert len(rows) == 0
            continue
        (row,) = rows
        p = mism[0]
        assert table.loc[row, "position"] == p and table.loc[row, "draft_token"] == choice[p]
        np.testing.assert_allclose(
            h_draft[row], d_out.hidden_states[-1][0, start + p].numpy(), rtol=1e-5, atol=1e-5
        )
        np.testing.assert_allclose(
            h_target[row], t_out.hidden_states[-1][0, start + p].numpy(), rtol=1e-5, atol=1e-5
        )
        prefix = prompt + response[:p] + [choice[p]]
        budget = MAX_NEW - p - 1
        tail = []
        if budget > 0:
            out = tiny_target.generate(
                torch.tensor([prefix]),
                max_new_tokens=budget,
                min_new_tokens=budget,
                do_sample=False,
            )
            tail = out[0, len(prefix) :].tolist()
        alt = response[:p] + [choice[p]] + tail
        changed = extract_final_number(_answer_text(alt)) != extract_final_number(
            _answer_text(response)
        )
        assert table.loc[row, "label"] == int(changed)


def test_mine_labels_open_text_and_cap(tiny_draft_close, tiny_target):
    table, h_draft, h_target = mine_labels(
        tiny_draft_close,
        tiny_target,
        PROMPTS[:2],
        IDS[:2],
        [None, None],
        8,
        [],
        0,
        2,
        _letters,
        _exact,
        0.5,
        2,
    )
    assert len(table) == len(h_draft) == len(h_target)
    assert (table.groupby("prompt_id").size() <= 2).all()
    assert not table["answer_task"].any()
    # Exact-match similarity: every substitution changes the text, so all are important.
    assert (table["label"] == 1).all() and (table["risk"] == 1.0).all()
    assert (table["similarity"] == 0.0).all()


def test_greedy_equivalence_check_accepts_equal_and_rejects_real_divergence(tiny_target):
    from edgespec.wisv.decode import check_greedy_equivalence

    prompt = [3, 5, 7]
    with torch.no_grad():
        logits = tiny_target(torch.tensor([prompt])).logits[0, -1]
    best, runner_up = logits.topk(2).indices.tolist()
    ok = check_greedy_equivalence(tiny_target, [prompt], [[best, 1]], [[best, 1]], 0.25)
    assert ok["identical"] == 1
    with pytest.raises(AssertionError, match="not a numerical near-tie"):
        check_greedy_equivalence(tiny_target, [prompt], [[runner_up]], [[best]], 1e-9)
    gap = float(logits[best] - logits[runner_up])
    tie = check_greedy_equivalence(tiny_target, [prompt], [[runner_up]], [[best]], gap + 1e-6)
    assert tie["near_tie_divergences"] == 1
