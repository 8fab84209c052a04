"""The decision head's features (methods §4.1): after-token hidden states, identical at decode
time and at mining time for the same prefix and token."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edgespec.decoding.config import DecodingConfig
from edgespec.decoding.rounds import generate_rounds, strict_acceptance
from edgespec.wisv.labels import mine_labels
from edgespec.wisv.mining import MiningConfig

MAX_NEW = 14
GAMMA = 3


def _prompts(seed: int = 4, lengths=(6, 3, 9, 5)) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 61, (n,), generator=g).tolist() for n in lengths]


PROMPTS = _prompts()


def _last_state(model, ids: list[int]) -> torch.Tensor:
    """Hugging Face, no cache: the last-layer state after consuming the last of ``ids``."""
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_hidden_states=True)
    return out.hidden_states[-1][0, -1]


def _decode_rounds(draft, target, keep_hidden: bool, batch_size: int = 3):
    seen = []
    strict = strict_acceptance(0.0)

    def recording(round_, generator):
        seen.append(round_)
        return strict(round_, generator)

    cfg = DecodingConfig(
        max_new_tokens=MAX_NEW, temperature=0.0, batch_size=batch_size, keep_hidden=keep_hidden
    )
    out, stats = generate_rounds(
        PROMPTS, cfg, torch.Generator().manual_seed(0), draft, target, GAMMA, recording
    )
    return out, stats, seen


@pytest.fixture(scope="module")
def decoded(tiny_draft_close, tiny_target):
    return _decode_rounds(tiny_draft_close, tiny_target, keep_hidden=True)


def test_keep_hidden_changes_no_token(decoded, tiny_draft_close, tiny_target):
    out, stats, _ = decoded
    plain, plain_stats, _ = _decode_rounds(tiny_draft_close, tiny_target, keep_hidden=False)
    assert out == plain
    assert [(s.prompt_index, s.num_accepted, s.num_committed) for s in stats] == [
        (s.prompt_index, s.num_accepted, s.num_committed) for s in plain_stats
    ]


def test_round_states_are_after_token_states(decoded, tiny_draft_close, tiny_target):
    """h_i of both models is the state at x_i's position after consuming x_i."""
    out, _, rounds = decoded
    checked = 0
    for round_ in rounds:
        assert round_.draft_hidden.shape[:2] == round_.draft_tokens.shape
        assert round_.target_hidden.shape[:2] == round_.draft_tokens.shape
        for row, p in enumerate(round_.prompt_indices):
            prefix = PROMPTS[p] + out[p][: int(round_.generated_lengths[row])]
            drafts = round_.draft_tokens[row].tolist()
            for i in range(GAMMA):
                ids = prefix + drafts[: i + 1]
                torch.testing.assert_close(
                    round_.draft_hidden[row, i],
                    _last_state(tiny_draft_close, ids),
                    atol=1e-6,
                    rtol=0,
                )
                torch.testing.assert_close(
                    round_.target_hidden[row, i], _last_state(tiny_target, ids), atol=1e-6, rtol=0
                )
                checked += 1
    assert checked > 20


def test_decode_time_features_equal_mining_time_features(decoded, tiny_draft_close, tiny_target):
    """Where a vanilla round's first mismatch meets a mined mismatch (same prefix, same draft
    token), the head's inputs at decode time equal the ones it was trained on."""
    out, _, rounds = decoded
    # Every substitution judged important: the walk stays on the target's greedy response,
    # which vanilla greedy SD reproduces, so prefixes coincide.
    table, h_draft, h_target = mine_labels(
        tiny_draft_close,
        tiny_target,
        PROMPTS,
        list(range(len(PROMPTS))),
        [None] * len(PROMPTS),
        MiningConfig(max_new_tokens=MAX_NEW, batch_size=2, similarity_threshold=0.5),
        lambda ids: " ".join(map(str, ids)),
        lambda a, b: [0.0] * len(a),
    )
    assert (table["label"] == 1).all()
    mined = {
        (int(r.prompt_id), int(r.position), int(r.draft_token)): k
        for k, r in enumerate(table.itertuples())
    }
    matched = 0
    for round_ in rounds:
        choice = round_.target_logits.argmax(-1)[:, :GAMMA]
        for row, p in enumerate(round_.prompt_indices):
            mism = (round_.draft_tokens[row] != choice[row]).nonzero()
            if len(mism) == 0:
                continue
            i = int(mism[0])
            position = int(round_.generated_lengths[row]) + i
            if position >= len(out[p]):
                continue
            key = (p, position, int(round_.draft_tokens[row, i]))
            assert key in mined, f"decode-time first mismatch {key} was not mined"
            k = mined[key]
            np.testing.assert_allclose(
                round_.draft_hidden[row, i].numpy(), h_draft[k], atol=1e-6, rtol=0
            )
            np.testing.assert_allclose(
                round_.target_hidden[row, i].numpy(), h_target[k], atol=1e-6, rtol=0
            )
            matched += 1
    assert matched >= 5
