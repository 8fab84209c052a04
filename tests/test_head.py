"""WISV decision head (methods §4.2): training, CSI use, determinism, threshold, persistence."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from edgespec.wisv.head import (
    HEAD_USES_CSI,
    REJECT_ALL_TAU,
    DecisionHead,
    HeadConfig,
    choose_threshold,
    head_accept_probability,
    load_head,
    save_head,
    split_by_group,
    train_head,
    untrained_heads,
)

D_DRAFT, D_TARGET, D_CSI = 6, 8, 2


def synthetic(n=1500, csi_weight=0.0, seed=0, noise=0.3):
    """Features with a linear safe/unsafe rule; ``csi_weight`` makes it depend on the CSI."""
    rng = np.random.default_rng(seed)
    xd = rng.normal(size=(n, D_DRAFT)) * 3 + 5  # unstandardised on purpose
    xt = rng.normal(size=(n, D_TARGET))
    csi = rng.normal(size=(n, D_CSI))
    score = xd[:, 0] - 5 - 3 * xt[:, 1] + 2 * xt[:, 2] + csi_weight * csi[:, 0]
    y = (score + noise * rng.normal(size=n) > 0).astype(int)
    groups = np.repeat(np.arange(n // 10), 10)[:n]
    return xd.astype(np.float32), xt.astype(np.float32), csi.astype(np.float32), y, groups


FAST = HeadConfig(epochs=15, lr=2e-2, batch_size=128, patience=5)


def test_separable_data_reaches_high_auc():
    xd, xt, csi, y, groups = synthetic()
    head, metrics = train_head(xd, xt, csi, y, groups, FAST)
    assert metrics["val_auc"] > 0.9 and metrics["train_auc"] > 0.9
    assert metrics["n_train"] + metrics["n_val"] == len(y)
    assert 1 <= metrics["best_epoch"] <= metrics["epochs_run"] == len(metrics["history"])
    assert metrics["pos_fraction"] == pytest.approx(
        y[split_by_group(groups, 0.2, 0, labels=y)[0]].mean()
    )
    q = head_accept_probability(head, xd, xt, csi)
    assert q.shape == (len(y),) and float(q.min()) >= 0 and float(q.max()) <= 1


def test_mlp_head_trains():
    xd, xt, csi, y, groups = synthetic(n=800)
    cfg = HeadConfig(hidden=16, epochs=10, lr=1e-2, batch_size=128, patience=5)
    head, metrics = train_head(xd, xt, csi, y, groups, cfg)
    assert metrics["val_auc"] > 0.9
    assert head.arch()["hidden"] == 16


def test_csi_head_beats_no_csi_head_when_labels_depend_on_csi():
    xd, xt, csi, y, groups = synthetic(csi_weight=6.0)
    _, with_csi = train_head(xd, xt, csi, y, groups, FAST)
    cfg_no = HeadConfig(**{**FAST.__dict__, "use_csi": False})
    head_no, without = train_head(xd, xt, csi, y, groups, cfg_no)
    assert head_no.d_csi == 0
    assert with_csi["val_auc"] > without["val_auc"] + 0.05
    assert with_csi["val_auc"] > 0.9


def test_same_seed_same_weights_other_seed_differs():
    xd, xt, csi, y, groups = synthetic(n=600)
    cfg = HeadConfig(epochs=3, lr=1e-2, batch_size=64, patience=3, seed=7)
    a, _ = train_head(xd, xt, csi, y, groups, cfg)
    b, _ = train_head(xd, xt, csi, y, groups, cfg)
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert ka == kb and torch.equal(va, vb)
    c, _ = train_head(xd, xt, csi, y, groups, HeadConfig(**{**cfg.__dict__, "seed": 8}))
    assert not torch.equal(a.state_dict()["net.weight"], c.state_dict()["net.weight"])


def test_split_is_by_group():
    groups = np.repeat(np.array(list("abcdefghij")), [3, 7, 1, 5, 2, 9, 4, 4, 6, 2])
    train_idx, val_idx = split_by_group(groups, 0.3, seed=1)
    assert set(groups[train_idx]).isdisjoint(groups[val_idx])
    assert len(train_idx) + len(val_idx) == len(groups)
    assert set(np.concatenate([train_idx, val_idx])) == set(range(len(groups)))
    # train_head uses the same split: its counts match.
    xd, xt, csi, y, g = synthetic(n=500)
    _, metrics = train_head(xd, xt, csi, y, g, HeadConfig(epochs=1), val_fraction=0.3)
    tr, va = split_by_group(g, 0.3, HeadConfig().seed, labels=y)
    assert (metrics["n_train"], metrics["n_val"]) == (len(tr), len(va))
    assert metrics["n_groups_train"] + metrics["n_groups_val"] == len(np.unique(g))


def test_choose_threshold_respects_budget():
    # 10 validation mismatches; unsafe (y=0) ones sit at q = 0.9, 0.6, 0.3.
    q = np.array([0.95, 0.9, 0.85, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2])
    y = np.array([1, 0, 1, 1, 1, 0, 1, 1, 0, 1])
    # Budget 0.1 = at most one unsafe accepted among 10: tau must exceed 0.6.
    tau, table = choose_threshold(q, y, max_accuracy_drop=0.1)
    assert tau == pytest.approx(0.7)
    accepted = q >= tau
    assert np.sum(accepted & (y == 0)) / len(q) <= 0.1
    row = table.set_index("tau").loc[tau]
    assert row["accept_rate"] == pytest.approx(0.5)
    assert row["unsafe_accept_rate"] == pytest.approx(0.1)
    assert row["safe_accept_rate"] == pytest.approx(4 / 7)
    assert table["unsafe_accept_rate"].is_monotonic_decreasing
    # Zero budget: no unsafe accepted, tau just above the highest unsafe q.
    tau0, _ = choose_threshold(q, y, max_accuracy_drop=0.0)
    assert tau0 == pytest.approx(0.95)
    # A generous budget accepts everything.
    tau_all, _ = choose_threshold(q, y, max_accuracy_drop=0.5)
    assert tau_all == pytest.approx(0.2)
    # Weights (e.g. soft risk): the unsafe at 0.6 only counts 0.5, so 0.9 + 0.6 fit 0.15.
    w = np.array([1, 1, 1, 1, 1, 0.5, 1, 1, 1, 1])
    tau_w, _ = choose_threshold(q, y, max_accuracy_drop=0.15, important_weight=w)
    assert tau_w == pytest.approx(0.4)
    # When only unsafe mismatches exist, the head accepts nothing.
    tau_none, _ = choose_threshold(q[[1, 5]], y[[1, 5]], max_accuracy_drop=0.0)
    assert tau_none == REJECT_ALL_TAU > 1.0
    # A coarse grid: the smallest feasible grid point.
    tau_g, tab_g = choose_threshold(q, y, max_accuracy_drop=0.1, grid=[0.0, 0.5, 0.75, 1.0])
    assert tau_g == 0.75 and len(tab_g) == 5


def test_choose_threshold_over_csi_states_counts_each_mismatch_once():
    """A CSI head scored under S states: a mismatch counts as accepted for the fraction of
    states with q >= tau, so the rates stay per mismatch, like a no-CSI head's."""
    q = np.array(
        [
            [0.9, 0.2],  # unsafe: accepted under one of two states at tau in (0.2, 0.9]
            [0.8, 0.7],
            [0.6, 0.1],
            [0.3, 0.95],  # unsafe
        ]
    )
    y = np.array([0, 1, 1, 0])
    tau, table = choose_threshold(q, y, max_accuracy_drop=0.125)
    # tau = 0.95 accepts half of one unsafe mismatch (0.5 / 4 = 0.125); at 0.9 both unsafe
    # mismatches are half accepted (1 / 4 = 0.25).
    assert tau == pytest.approx(0.95)
    row = table.set_index("tau").loc[tau]
    assert row["unsafe_accept_rate"] <= 0.125 + 1e-12
    rates = table.set_index("tau")
    assert rates.loc[0.95, "unsafe_accept_rate"] == pytest.approx(0.5 / 4)
    assert rates.loc[0.9, "unsafe_accept_rate"] == pytest.approx(1.0 / 4)
    assert rates.loc[0.9, "accept_rate"] == pytest.approx(1.0 / 4)
    assert rates.loc[0.7, "safe_accept_rate"] == pytest.approx((1.0 + 0.0) / 2)
    # One state is the 1-D case.
    tau_1d, table_1d = choose_threshold(q[:, 0], y, max_accuracy_drop=0.25)
    tau_2d, table_2d = choose_threshold(q[:, :1], y, max_accuracy_drop=0.25)
    assert tau_1d == tau_2d
    pd.testing.assert_frame_equal(table_1d, table_2d)


def test_given_split_is_used_and_a_one_class_validation_stops_on_the_loss():
    xd, xt, csi, y, groups = synthetic(n=600)
    val = np.flatnonzero(groups < 12)
    train = np.flatnonzero(groups >= 12)
    _, metrics = train_head(xd, xt, csi, y, groups, FAST, split=(train, val))
    assert (metrics["n_train"], metrics["n_val"]) == (len(train), len(val))
    # Validation rows of one class: no AUC, early stopping on the validation loss.
    safe_val = val[y[val] == 1]
    _, metrics = train_head(xd, xt, csi, y, groups, FAST, split=(train, safe_val))
    assert math.isnan(metrics["val_auc"]) and metrics["val_loss"] > 0
    with pytest.raises(ValueError, match="both sides"):
        train_head(xd, xt, csi, y, groups, FAST, split=(train, train[:5]))


def test_save_load_round_trip(tmp_path):
    xd, xt, csi, y, groups = synthetic(n=400)
    head, _ = train_head(xd, xt, csi, y, groups, HeadConfig(epochs=2, hidden=4))
    path = tmp_path / "sub" / "head.pt"
    save_head(head, path, {"tau": 0.7, "csi_names": ["snr_db", "rate"]})
    loaded, extra = load_head(path)
    assert extra == {"tau": 0.7, "csi_names": ["snr_db", "rate"]}
    assert loaded.arch() == head.arch()
    assert loaded.train_config["hidden"] == 4
    assert torch.equal(head(xd, xt, csi), loaded(xd, xt, csi))
    assert not torch.equal(loaded.std, torch.ones_like(loaded.std))  # standardisation saved
    assert [p.name for p in path.parent.iterdir()] == ["head.pt"]  # no temp file left


@pytest.mark.parametrize("hidden", [0, 4])
def test_untrained_heads_have_the_trained_heads_sizes(hidden):
    """profile_head times untrained heads in place of train_head's: every head must have the
    sizes and parameter shapes the trained one gets, and read the CSI where it does."""
    xd, xt, csi, y, groups = synthetic(n=300)
    stand_ins = untrained_heads(D_DRAFT, D_TARGET, D_CSI, hidden)
    assert (
        set(stand_ins) == set(HEAD_USES_CSI) == {"wisv_head", "no_csi_head", "relabel_no_csi_head"}
    )
    for key, uses_csi in HEAD_USES_CSI.items():
        cfg = HeadConfig(hidden=hidden, epochs=1, use_csi=uses_csi)
        trained, _ = train_head(xd, xt, csi, y, groups, cfg)
        assert stand_ins[key].arch() == trained.arch(), key
        shapes = {name: tuple(t.shape) for name, t in trained.state_dict().items()}
        assert {n: tuple(t.shape) for n, t in stand_ins[key].state_dict().items()} == shapes
    assert stand_ins["wisv_head"].d_csi == D_CSI and stand_ins["no_csi_head"].d_csi == 0


def test_head_inputs_and_broadcast_csi():
    head = DecisionHead(D_DRAFT, D_TARGET, D_CSI)
    xd, xt = torch.randn(5, D_DRAFT), torch.randn(5, D_TARGET)
    c = torch.randn(D_CSI)
    shared = head_accept_probability(head, xd, xt, c)
    per_row = head_accept_probability(head, xd, xt, c.expand(5, D_CSI))
    assert torch.equal(shared, per_row)
    with pytest.raises(ValueError):
        head(xd, xt, None)
    with pytest.raises(ValueError):
        head(xd[:, :3], xt, c)
    no_csi = DecisionHead(D_DRAFT, D_TARGET, 0)
    assert no_csi(xd, xt).shape == (5,)


def test_train_head_input_errors():
    xd, xt, csi, y, groups = synthetic(n=200)
    with pytest.raises(ValueError):
        train_head(xd, xt, None, y, groups, HeadConfig(epochs=1))
    with pytest.raises(ValueError):
        train_head(xd, xt, csi, np.ones_like(y), groups, HeadConfig(epochs=1))
    with pytest.raises(ValueError):
        train_head(xd, xt, csi, y, np.zeros_like(groups), HeadConfig(epochs=1))


def test_stratified_split_keeps_both_classes_when_possible():
    # Important labels sit in two prompts only: a plain group shuffle can miss them.
    groups = np.repeat(np.arange(12), 4)
    labels = np.ones(len(groups))
    labels[groups == 3] = 0
    labels[groups == 8] = 0
    for seed in range(5):
        tr, va = split_by_group(groups, 0.25, seed, labels=labels)
        assert set(groups[tr]).isdisjoint(groups[va])
        assert set(labels[tr]) == {0.0, 1.0} and set(labels[va]) == {0.0, 1.0}
