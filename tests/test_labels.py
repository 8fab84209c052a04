"""WISV label mining (methods §4.2): the cached semi-greedy walk against a from-scratch one,
labels that measure answers, the stated-answer parser."""

from __future__ import annotations

import difflib
import math

import numpy as np
import pandas as pd
import pytest
import torch

from edgespec.data.answers import marked_answer
from edgespec.wisv.labels import LABEL_COLUMNS, criterion_counts, label_summary, mine_labels
from edgespec.wisv.mining import Branch, MiningConfig, MiningTask, judge_branches

MARKER = "The answer is"
MAX_NEW = 10
LABEL_BUDGET = 22
THRESHOLD = 0.6


def _prompts(seed: int = 2, lengths=(5, 9, 3, 7, 6, 4, 8)) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 61, (n,), generator=g).tolist() for n in lengths]


PROMPTS = _prompts()
IDS = [f"q{i}" for i in range(len(PROMPTS))]
GOLDS = ["1", None, "3", "4", None, "2", "5"]


def _text(ids: list[int]) -> str:
    """A toy detokenizer whose texts state answers now and then: one token is the marker,
    six are digits, two end a sentence."""
    out = []
    for t in ids:
        r = t % 11
        if r == 0:
            out.append(f" {MARKER} ")
        elif r <= 6:
            out.append(str(t % 10))
        elif r <= 8:
            out.append(". ")
        else:
            out.append(chr(97 + t % 26))
    return "".join(out)


def _similarity(a: list[str], b: list[str]) -> list[float]:
    return [difflib.SequenceMatcher(None, x, y).ratio() for x, y in zip(a, b, strict=True)]


# --------------------------------------------------------------------------------------------
# A from-scratch reference: no caches, one full forward per token
# --------------------------------------------------------------------------------------------


def _argmax_after(model, ids: list[int]) -> int:
    with torch.no_grad():
        return int(model(torch.tensor([ids])).logits[0, -1].argmax())


def _state_after(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return (
            model(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0, -1].numpy()
        )


def _greedy(model, prefix, budget, eos, stop) -> list[int]:
    out: list[int] = []
    while len(out) < budget:
        tok = _argmax_after(model, prefix + out)
        out.append(tok)
        if tok in eos or stop(out):
            break
    return out


def _stated(tokens, gold, eos):
    value, complete = marked_answer(_text(tokens), MARKER, gold)
    return value if value is not None and (complete or (tokens and tokens[-1] in eos)) else None


def _mine_from_scratch(draft, target, eos, cap):
    rows, h_d, h_t = [], [], []
    for prompt, pid, gold in zip(PROMPTS, IDS, GOLDS, strict=True):

        def stop(prefix, gold=gold):
            return lambda out: (
                gold is not None and marked_answer(_text(prefix + out), MARKER, gold)[1]
            )

        original = _greedy(target, prompt, LABEL_BUDGET, eos, stop([]))
        ref_answer = _stated(original, gold, eos) if gold is not None else None
        response, border, judged = list(original), 0, 0
        while judged < cap:
            m = min(len(response), MAX_NEW)
            choices = [_argmax_after(draft, prompt + response[:j]) for j in range(m)]
            found = [j for j in range(border, m) if choices[j] != response[j]]
            if not found:
                break
            p = found[0]
            d = choices[p]
            prefix = response[:p] + [d]
            budget = 0 if d in eos else LABEL_BUDGET - p - 1
            alt = prefix + _greedy(target, prompt + prefix, budget, eos, stop(prefix))
            alt_answer = _stated(alt, gold, eos) if gold is not None else None
            if ref_answer is not None and alt_answer is not None:
                safe, risk, sim, criterion = alt_answer == ref_answer, None, math.nan, "answer"
                risk = 0.0 if safe else 1.0
            else:
                sim = _similarity([_text(alt)], [_text(original)])[0]
                safe, risk, criterion = sim >= THRESHOLD, min(max(1 - sim, 0.0), 1.0), "similarity"
            rows.append(
                {
                    "prompt_id": pid,
                    "step": judged,
                    "position": p,
                    "draft_token": d,
                    "target_token": response[p],
                    "label": 0 if safe else 1,
                    "risk": risk,
                    "similarity": sim,
                    "answer_task": gold is not None,
                    "criterion": criterion,
                }
            )
            h_d.append(_state_after(draft, prompt + prefix))
            h_t.append(_state_after(target, prompt + prefix))
            judged, border = judged + 1, p + 1
            if safe:
                response = alt
    return pd.DataFrame(rows, columns=list(LABEL_COLUMNS)), np.stack(h_d), np.stack(h_t)


@pytest.fixture(scope="module")
def reference(tiny_draft_close, tiny_target):
    return _mine_from_scratch(tiny_draft_close, tiny_target, {7}, 4)


def _mining_config(**extra) -> MiningConfig:
    """The tests' mining settings, plus ``extra``."""
    return MiningConfig(
        max_new_tokens=MAX_NEW,
        eos_token_ids=(7,),
        pad_token_id=0,
        batch_size=3,
        similarity_threshold=THRESHOLD,
        max_mismatches_per_prompt=4,
        hidden_dtype=np.float64,
        label_max_new_tokens=LABEL_BUDGET,
        answer_marker=MARKER,
        **extra,
    )


@pytest.fixture(scope="module")
def mined(tiny_draft_close, tiny_target):
    config = _mining_config()
    return mine_labels(
        tiny_draft_close, tiny_target, PROMPTS, IDS, GOLDS, config, _text, _similarity
    )


def test_cached_mining_equals_from_scratch_mining(mined, reference):
    table, h_draft, h_target = mined
    expected, e_draft, e_target = reference
    pd.testing.assert_frame_equal(table, expected, check_dtype=False)
    np.testing.assert_allclose(h_draft, e_draft, atol=1e-9, rtol=0)
    np.testing.assert_allclose(h_target, e_target, atol=1e-9, rtol=0)


def test_the_reference_exercises_every_path(reference):
    """The comparison above is only as strong as the paths the data takes."""
    table, _, _ = reference
    counts = criterion_counts(table)
    assert counts["answer"] > 0 and counts["similarity"] > 0
    assert counts["answer_task_fallback"] > 0
    assert set(table["label"]) == {0, 1}
    # Semi-greedy: some prompt keeps walking after a safe substitution changed its response.
    after_safe = [
        (group["label"].iloc[:-1] == 0).any()
        for _, group in table.groupby("prompt_id")
        if len(group) > 1
    ]
    assert any(after_safe)
    assert (table.loc[table["criterion"] == "answer", "risk"].isin([0.0, 1.0])).all()
    graded = table.loc[table["criterion"] == "similarity", "risk"]
    assert ((graded > 0) & (graded < 1)).any()


def test_open_text_with_numbers_is_not_an_answer_task(mined):
    table, _, _ = mined
    no_gold = table["prompt_id"].isin([i for i, g in zip(IDS, GOLDS, strict=True) if g is None])
    assert no_gold.any()
    assert (table.loc[no_gold, "criterion"] == "similarity").all()
    assert not table.loc[no_gold, "answer_task"].any()


def test_label_budget_must_cover_the_decoding_budget():
    with pytest.raises(ValueError, match="label_max_new_tokens"):
        MiningConfig(max_new_tokens=8, label_max_new_tokens=4)


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"max_new_tokens": 0}, "max_new_tokens and batch_size"),
        ({"max_new_tokens": 4, "batch_size": 0}, "max_new_tokens and batch_size"),
        ({"max_new_tokens": 4, "max_mismatches_per_prompt": 0}, "max_mismatches_per_prompt"),
    ],
)
def test_mining_config_rejects_bad_settings(settings, match):
    with pytest.raises(ValueError, match=match):
        MiningConfig(**settings)


def test_mining_config_from_the_workflow_settings():
    wisv = {
        "max_new_tokens": 6,
        "label_max_new_tokens": None,
        "similarity_threshold": 0.7,
        "max_mismatches_per_prompt": None,
        "answer_marker": "So:",
    }
    config = MiningConfig.from_settings(wisv, eos_token_ids=[2, 5], pad_token_id=1, batch_size=4)
    assert config.label_budget == 6 and config.cap == math.inf
    assert config.eos_token_ids == (2, 5) and config.answer_marker == "So:"
    assert (
        MiningConfig.from_settings(
            {**wisv, "label_max_new_tokens": 9, "max_mismatches_per_prompt": 3},
            eos_token_ids=[],
            pad_token_id=0,
            batch_size=1,
        ).label_budget
        == 9
    )


def test_judging_by_answers_then_by_one_similarity_call():
    """Answers decide where both branches state one; the rest go to one similarity call, in
    order, safe at the threshold itself, the risk 1 - s clipped to [0, 1]."""
    calls = []

    def similarity(texts, refs):
        calls.append((list(texts), list(refs)))
        return [{"b": 0.6, "c": 1.2, "d": -0.1}[t] for t in texts]

    task = MiningTask(
        [[1]], ["p"], ["7"], MiningConfig(4, similarity_threshold=0.6), str, similarity
    )
    originals = [Branch([], "R", "7")] * 4 + [Branch([], "R0", None)]
    alternatives = [
        Branch([], "same", "7"),
        Branch([], "other", "8"),
        Branch([], "b", None),
        Branch([], "c", None),
        Branch([], "d", "7"),
    ]
    verdicts = judge_branches(task, originals, alternatives)
    assert verdicts[0][:2] == (True, 0.0) and verdicts[0].criterion == "answer"
    assert verdicts[1][:2] == (False, 1.0) and math.isnan(verdicts[1].similarity)
    assert calls == [(["b", "c", "d"], ["R", "R", "R0"])]
    assert verdicts[2] == (True, pytest.approx(0.4), 0.6, "similarity")
    assert verdicts[3] == (True, 0.0, 1.2, "similarity")
    assert verdicts[4] == (False, 1.0, -0.1, "similarity")


def test_label_summary_counts(mined):
    table, _, _ = mined
    config = MiningConfig(MAX_NEW, label_max_new_tokens=LABEL_BUDGET)
    summary = label_summary(table, GOLDS, config, 2.5)
    assert summary["prompts"] == 7 and summary["answer_task_prompts"] == 5
    assert summary["mismatches"] == len(table) == summary["important"] + summary["safe"]
    assert summary["important"] == int((table["label"] == 1).sum())
    assert summary["criterion"] == criterion_counts(table)
    assert summary["label_max_new_tokens"] == LABEL_BUDGET and summary["seconds"] == 2.5


@pytest.mark.parametrize(
    ("text", "gold", "expected"),
    [
        ("So 3 + 4 = 7. The answer is 7", None, ("7", False)),
        ("The answer is 7.", "7", ("7", False)),
        ("The answer is 7. ", "7", ("7", True)),
        ("the answer is: 1,234\n", "1234", ("1234", True)),
        ("The answer is 14.5 apples", None, ("14.5", True)),
        ("The answer is 3. Then the answer is 4.\n", None, ("4", True)),
        ("No marker here, 5.", None, (None, False)),
        ("The answer is yes, since", "no", ("yes", True)),
        ("The answer is Paris.", "paris", ("paris", True)),
        ("The answer is Paris", "paris", ("paris", False)),
    ],
)
def test_marked_answer_hand_cases(text, gold, expected):
    assert marked_answer(text, MARKER, gold) == expected


# --------------------------------------------------------------------------------------------
# Branch caches (edgespec.decoding.branching)
# --------------------------------------------------------------------------------------------


def test_branches_from_cut_caches_equal_uncached_greedy(tiny_target):
    from edgespec.decoding.branching import greedy_continue

    first = greedy_continue(
        tiny_target, [None, None, None], PROMPTS[:3], [9, 9, 9], [], pad_token_id=0
    )
    assert [c.stopped_by for c in first] == ["budget"] * 3
    for prompt, cont in zip(PROMPTS[:3], first, strict=True):
        assert cont.tokens == _greedy(tiny_target, prompt, 9, set(), lambda out: False)
        assert len(cont.cache) == len(prompt) + 8  # the last token is not fed
    # Branch each row at a different point, with a different token, ragged.
    cuts = [0, 3, 7]
    feeds = [[5], [11, 12], [40]]
    stop_after = 4
    branches = greedy_continue(
        tiny_target,
        [c.cache.prefix(len(p) + k) for c, p, k in zip(first, PROMPTS[:3], cuts, strict=True)],
        feeds,
        [6, 0, 6],
        [first[2].tokens[0]],
        stop=lambda row, tokens: row == 0 and len(tokens) == stop_after,
    )
    for b, (cont, prompt, k, feed) in enumerate(zip(first, PROMPTS[:3], cuts, feeds, strict=True)):
        prefix = prompt + cont.tokens[:k] + feed
        np.testing.assert_allclose(
            branches[b].first_hidden.numpy(), _state_after(tiny_target, prefix), atol=1e-9
        )
        expected = _greedy(
            tiny_target,
            prefix,
            [6, 0, 6][b],
            {first[2].tokens[0]},
            lambda out, b=b: b == 0 and len(out) == stop_after,
        )
        assert branches[b].tokens == expected
    assert branches[1].tokens == [] and branches[1].stopped_by == "budget"
    assert branches[0].stopped_by == "rule" and len(branches[0].tokens) == stop_after


def _assert_same_cache(a, b):
    assert len(a) == len(b)
    for ka, kb, va, vb in zip(a.keys, b.keys, a.values, b.values, strict=True):
        np.testing.assert_allclose(ka.numpy(), kb.numpy(), atol=1e-9, rtol=0)
        np.testing.assert_allclose(va.numpy(), vb.numpy(), atol=1e-9, rtol=0)


def test_prefilled_rows_equal_the_padded_prefill(tiny_target):
    """Rows sharing a long prefix and rows of very different lengths: each row's cache equals
    the one a plain left-padded feed of all prompts leaves."""
    from edgespec.decoding.branching import BranchBatch, prefill_rows

    shared = _prompts(seed=5, lengths=(12,))[0]
    prompts = [shared + [3, 4], shared + [9], *PROMPTS[:3], [], _prompts(9, (30,))[0]]
    rows = prefill_rows(tiny_target, prompts, pad_token_id=0)
    assert rows[5] is None
    plain = BranchBatch(tiny_target, [None] * 6)
    nonempty = [p for p in prompts if p]
    plain.feed(nonempty, 1)
    expected = [plain.row_cache(b) for b in range(len(nonempty))]
    for row, exp in zip([r for r in rows if r is not None], expected, strict=True):
        _assert_same_cache(row, exp)


def test_graded_risks_average_sampled_continuations(mined, tiny_draft_close, tiny_target):
    """With K = 3 continuations the walk, labels and states are the greedy mining's, and each
    risk is the mean of the greedy verdict's and two sampled continuations' risks (each in
    [0, 1]), so it lies within [r/3, (r + 2)/3] of the greedy risk r."""
    table, h_draft, _ = mined
    config = _mining_config(continuations=3, continuation_temperature=1.5, seed=4)
    graded, g_draft, _ = mine_labels(
        tiny_draft_close, tiny_target, PROMPTS, IDS, GOLDS, config, _text, _similarity
    )
    keep = [c for c in table.columns if c != "risk"]
    pd.testing.assert_frame_equal(graded[keep], table[keep])
    np.testing.assert_allclose(g_draft, h_draft)
    greedy, risk = table["risk"].to_numpy(), graded["risk"].to_numpy()
    assert (risk >= greedy / 3 - 1e-12).all() and (risk <= (greedy + 2) / 3 + 1e-12).all()
    assert not np.allclose(risk, greedy)  # the draws disagree with the greedy one somewhere
    summary = label_summary(graded, GOLDS, config, 1.0)
    assert summary["continuations"] == 3
    assert summary["risk_graded"] == int(((risk > 0) & (risk < 1)).sum())
