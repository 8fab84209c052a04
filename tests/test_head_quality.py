"""Held-out quality of the WISV heads (edgespec.wisv.head_quality) on hand-made cases."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score

from edgespec.wisv.head_quality import (
    _auc,
    accept_by_state,
    heldout_auc,
    learning_curve,
    per_mismatch_q,
)


def test_auc_matches_sklearn_with_ties():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 50)
    score = np.round(rng.random(50), 1)  # many ties
    assert _auc(y, score) == pytest.approx(roc_auc_score(y, score))
    assert np.isnan(_auc(np.ones(4), np.arange(4.0)))


def test_heldout_auc_interval_resamples_whole_prompts():
    y = np.array([1, 0, 1, 0, 1, 0])
    q = np.array([[0.9, 0.7], [0.2, 0.4], [0.8, 0.8], [0.3, 0.1], [0.6, 0.6], [0.5, 0.3]])
    out = heldout_auc(q, y, ["a", "a", "b", "b", "c", "c"], seed=1, samples=300)
    # per mismatch q = row means: 0.8, 0.3, 0.8, 0.2, 0.6, 0.4 -> every safe above every unsafe
    np.testing.assert_allclose(per_mismatch_q(q), [0.8, 0.3, 0.8, 0.2, 0.6, 0.4])
    assert out["auc"] == 1.0 and out["auc_lo"] == 1.0 and out["auc_hi"] == 1.0
    # One safe mismatch scored lowest: the AUC drops, and resampling prompts spreads it.
    noisy = heldout_auc([0.8, 0.3, 0.8, 0.2, 0.1, 0.4], y, list("aabbcc"), 1, 0.9, 300)
    assert noisy["auc"] == pytest.approx(6 / 9)
    assert noisy["auc_lo"] < noisy["auc"] < noisy["auc_hi"] == 1.0


def test_accept_by_state_sorts_by_repair_cost():
    q = np.array([[0.9, 0.2, 0.6], [0.4, 0.5, 0.7]])
    states = pd.DataFrame({"csi_sample": [0, 1, 2], "repair_cost": [1.5, 1.1, 2.0]})
    relabeled = pd.DataFrame({"csi_sample": [0, 0, 1, 1, 2, 2], "label_csi": [1, 0, 1, 1, 0, 0]})
    out = accept_by_state(q, 0.5, states, relabeled)
    assert out["csi_sample"].tolist() == [1, 0, 2]
    np.testing.assert_allclose(out["accept_rate"], [0.5, 0.5, 1.0])
    np.testing.assert_allclose(out["relabeled_safe"], [0.0, 0.5, 1.0])
    with pytest.raises(ValueError, match="q_val"):
        accept_by_state(q[:, :2], 0.5, states, relabeled)


def test_learning_curve_grows_nested_prompt_sets():
    seen = []

    def fit_auc(prompts):
        seen.append(list(prompts))
        if len(prompts) < 3:
            raise ValueError("one class")
        return 10 * len(prompts), 0.5 + 0.01 * len(prompts)

    out = learning_curve(fit_auc, [f"p{i}" for i in range(8)], seed=4)
    assert out["prompts"].tolist() == [2, 4, 6, 8]
    assert np.isnan(out["auc"].iloc[0]) and out["mismatches"].iloc[1] == 40
    for small, large in zip(seen, seen[1:], strict=False):
        assert large[: len(small)] == small
