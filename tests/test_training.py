"""Training the three WISV heads (rule train_head): one shared split, which labels and inputs
each head learns from, each tau by the same rule on the same original validation labels, the
accept rate by channel, the saved heads and the metrics."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from script_runner import Snakemake, run_script

from edgespec.wireless.channel import ChannelCondition, csi_features
from edgespec.wisv.head import choose_threshold, load_head
from edgespec.wisv.training import (
    HEAD_TITLES,
    LabeledSet,
    accept_rate_by_channel,
    calibration_curves,
    save_heads,
    train_heads,
    training_metrics,
)

CSI = ("snr_db_mean", "rtt_ms")
SETTINGS = {
    "hidden": 0,
    "epochs": 40,
    "lr": 0.05,
    "weight_decay": 0.0,
    "patience": 15,
    "val_fraction": 0.25,
    "max_accuracy_drop": 0.1,
}
SEED = 3
# Three CSI samples (mean SNR [dB], RTT [ms], the repair cost's risk bar): the worse the
# channel, the higher the bar, the more mismatches the relabeling makes safe.
SAMPLES = ((25.0, 5.0, 0.2), (10.0, 20.0, 0.5), (-5.0, 60.0, 0.8))


def _labeled_set(seed: int = 0) -> LabeledSet:
    """60 mismatches of 12 prompts: labels that depend on the hidden states, graded risks,
    and a relabeling under three CSI samples (repair iff risk > the sample's bar)."""
    rng = np.random.default_rng(seed)
    n = 60
    prompt_id = np.repeat([f"p{i}" for i in range(12)], 5)
    draft = rng.normal(size=(n, 3)).astype(np.float32)
    target = rng.normal(size=(n, 2)).astype(np.float32)
    score = draft[:, 0] + 0.5 * target[:, 0] + rng.normal(scale=0.7, size=n)
    label = (score > 0.2).astype(np.int64)
    risk = np.where(label == 1, rng.uniform(0.3, 1.0, n), rng.uniform(0.0, 0.3, n))
    table = pd.DataFrame({"prompt_id": prompt_id, "label": label, "risk": risk})
    frames = []
    for s, (snr, rtt, bar) in enumerate(SAMPLES):
        frames.append(
            pd.DataFrame(
                {
                    "mismatch": np.arange(n),
                    "prompt_id": prompt_id,
                    "csi_sample": s,
                    "phi_snr_db_mean": snr,
                    "phi_rtt_ms": rtt,
                    "repair_cost": bar,
                    "risk": risk,
                    "label": label,
                    "label_csi": (risk > bar).astype(np.int64),
                }
            )
        )
    relabeled = pd.concat(frames, ignore_index=True)
    return LabeledSet(table, relabeled, draft, target, CSI)


@pytest.fixture(scope="module")
def data():
    return _labeled_set()


@pytest.fixture(scope="module")
def trained(data):
    torch.set_num_threads(1)
    return train_heads(data, SETTINGS, SEED)


def _q(head, data, rows, states=None):
    """The head's probabilities by hand: [len(rows)], or [len(rows), S] under each state."""
    xd = torch.as_tensor(data.draft_hidden[rows])
    xt = torch.as_tensor(data.target_hidden[rows])
    with torch.no_grad():
        if states is None:
            return torch.sigmoid(head(xd, xt)).numpy()
        cols = [torch.sigmoid(head(xd, xt, torch.as_tensor(s))).numpy() for s in states]
    return np.stack(cols, axis=1)


def test_one_split_serves_every_head(data, trained):
    heads, validation = trained
    table, relabeled = data.table, data.relabeled
    val_prompts = set(table["prompt_id"].iloc[validation.val_rows])
    assert val_prompts == validation.prompts
    assert not val_prompts & set(table["prompt_id"].iloc[validation.train_rows])
    assert len(validation.train_rows) + len(validation.val_rows) == len(table)
    relabel_train, relabel_val = validation.relabel_split
    assert set(relabeled["prompt_id"].iloc[relabel_val]) == val_prompts
    assert len(relabel_val) == len(SAMPLES) * len(validation.val_rows)
    assert len(relabel_train) + len(relabel_val) == len(relabeled)
    np.testing.assert_array_equal(
        validation.y_safe, 1 - table["label"].to_numpy()[validation.val_rows]
    )
    np.testing.assert_array_equal(validation.states, [[s[0], s[1]] for s in SAMPLES])
    # Stratified: both classes on both sides.
    assert set(validation.y_safe) == {0, 1}


def test_each_head_learns_its_own_labels_and_inputs(data, trained):
    heads, validation = trained
    label, label_csi = data.table["label"].to_numpy(), data.relabeled["label_csi"].to_numpy()
    relabel_train, _ = validation.relabel_split
    assert heads["wisv_head"].head.d_csi == len(CSI)
    assert heads["no_csi_head"].head.d_csi == 0 and heads["relabel_no_csi_head"].head.d_csi == 0
    no_csi = heads["no_csi_head"].metrics
    assert no_csi["n_train"] == len(validation.train_rows)
    assert no_csi["pos_fraction"] == pytest.approx(1 - label[validation.train_rows].mean())
    for key in ("wisv_head", "relabel_no_csi_head"):
        metrics = heads[key].metrics
        assert metrics["n_train"] == len(relabel_train)
        assert metrics["pos_fraction"] == pytest.approx(1 - label_csi[relabel_train].mean())
    assert "history" not in no_csi


def test_every_tau_by_one_rule_on_the_original_validation_labels(data, trained):
    """tau = choose_threshold on the original labels of the shared validation mismatches,
    each important one weighted by its risk, within max_accuracy_drop, each mismatch scored
    once: the CSI head's q under every CSI sample ([N_val, S]) averaged over the samples."""
    heads, validation = trained
    rows = validation.val_rows
    y_safe = 1 - data.table["label"].to_numpy()[rows]
    risk = data.table["risk"].to_numpy()[rows]
    states = np.array([[s[0], s[1]] for s in SAMPLES], dtype=np.float32)
    unweighted_differs = False
    for key, t in heads.items():
        q = _q(t.head, data, rows, states if key == "wisv_head" else None)
        np.testing.assert_allclose(t.q_val, q, rtol=0, atol=1e-6)
        q = q.mean(axis=1) if q.ndim == 2 else q
        budget = SETTINGS["max_accuracy_drop"]
        tau, table = choose_threshold(q, y_safe, max_accuracy_drop=budget, important_weight=risk)
        assert t.tau == pytest.approx(tau) and t.metrics["tau"] == t.tau
        chosen = table.iloc[int(np.argmin(np.abs(table["tau"].to_numpy() - tau)))]
        assert t.metrics["val_accept_rate"] == pytest.approx(chosen["accept_rate"])
        assert t.metrics["val_unsafe_accept_rate"] <= budget + 1e-12
        unweighted, _ = choose_threshold(q, y_safe, max_accuracy_drop=budget)
        unweighted_differs |= unweighted != pytest.approx(tau)
    # The data tell the rule apart from the unweighted one.
    assert unweighted_differs


def test_accept_rate_by_channel_at_each_mean_state(data, trained):
    heads, _ = trained
    channels = {
        "good": {
            "name": "good",
            "fading": "rayleigh",
            "bandwidth_hz": 20e6,
            "snr_db": 25.0,
            "rtt_s": 0.005,
        },
        "poor": {
            "name": "poor",
            "fading": "rayleigh",
            "bandwidth_hz": 1e6,
            "snr_db": -5.0,
            "rtt_s": 0.06,
        },
    }
    rates = accept_rate_by_channel(heads["wisv_head"], channels, data)
    assert list(rates) == ["good", "poor"]
    rows = np.arange(len(data.table))
    for name, spec in channels.items():
        feats = csi_features(ChannelCondition.from_dict(spec), 1.0)
        state = np.array([[feats[k] for k in CSI]], dtype=np.float32)
        q = _q(heads["wisv_head"].head, data, rows, state)[:, 0]
        assert rates[name] == pytest.approx(float((q >= heads["wisv_head"].tau).mean()))
    assert rates["good"] != rates["poor"]


def test_saved_heads_metrics_and_curves(data, trained, tmp_path):
    heads, validation = trained
    paths = {key: tmp_path / f"{key}.pt" for key in heads}
    save_heads(heads, paths, CSI)
    for key, path in paths.items():
        head, extra = load_head(path)
        assert extra["tau"] == heads[key].tau
        assert extra.get("csi_features") == (list(CSI) if key == "wisv_head" else None)
    metrics = training_metrics(heads, validation, {"good": 0.5}, SETTINGS["max_accuracy_drop"])
    assert metrics["validation"] == {
        "prompts": sorted(validation.prompts),
        "mismatches": len(validation.val_rows),
        "important": int((validation.y_safe == 0).sum()),
        "csi_states": len(SAMPLES),
        "max_accuracy_drop": SETTINGS["max_accuracy_drop"],
    }
    assert metrics["accept_rate_by_channel"] == {"good": 0.5}
    for key, t in heads.items():
        assert metrics[key] is t.metrics
        assert metrics[f"tau_table_{key}"]["tau"] == list(t.tau_table["tau"])
    curves = calibration_curves(heads, validation)
    assert list(curves) == [HEAD_TITLES[key] for key in heads]
    q, y = curves[HEAD_TITLES["wisv_head"]]
    np.testing.assert_allclose(q, heads["wisv_head"].q_val.mean(1))
    np.testing.assert_array_equal(y, validation.y_safe)


def test_other_csi_features_than_configured_stop_with_the_key(data):
    other = LabeledSet(
        data.table, data.relabeled, data.draft_hidden, data.target_hidden, ("gain_db",)
    )
    with pytest.raises(ValueError, match=r"train.parquet.*wisv.csi_features.*rerun relabel_csi"):
        other.check_features("train.parquet")
    data.check_features("train.parquet")


def _write_inputs(data: LabeledSet, folder) -> dict:
    """rule train_head's inputs from a constructed labeled set."""
    paths = {
        "table": folder / "mismatches.parquet",
        "hidden": folder / "hidden.npz",
        "train": folder / "train.parquet",
    }
    data.table.to_parquet(paths["table"])
    data.relabeled.to_parquet(paths["train"])
    np.savez(paths["hidden"], draft=data.draft_hidden, target=data.target_hidden)
    return paths


def test_train_head_script_gives_every_head_the_one_threshold_rule(data, tmp_path):
    """Runs workflow/scripts/train_head.py on constructed labels and recomputes each saved
    head's tau from the head itself: choose_threshold on its q over the validation mismatches
    (the CSI head's averaged over the CSI states), the original labels, risk weights and the
    budget. A script that gave any head another rule (another budget, weights, or the CSI
    head's [N, S] scoring) fails here."""
    out = {
        "wisv_head": tmp_path / "wisv_head.pt",
        "judge_head": tmp_path / "no_csi_head.pt",
        "relabel_head": tmp_path / "relabel_no_csi_head.pt",
        "metrics": tmp_path / "metrics.json",
        "figure": tmp_path / "calibration.png",
    }
    channels = {
        name: {"name": name, "fading": "rayleigh", "bandwidth_hz": w, "snr_db": snr, "rtt_s": rtt}
        for name, w, snr, rtt in (("good", 2e7, 20.0, 0.01), ("poor", 1e6, 0.0, 0.05))
    }
    run_script(
        "train_head",
        Snakemake(
            input=_write_inputs(data, tmp_path),
            output=out,
            params={
                "wisv": {"head": SETTINGS, "csi_features": list(CSI)},
                "channels": channels,
                "seed": SEED,
            },
            log=tmp_path / "train_head.log",
        ),
    )
    metrics = json.loads(out["metrics"].read_text())
    prompts = set(metrics["validation"]["prompts"])
    rows = np.flatnonzero(data.table["prompt_id"].isin(prompts).to_numpy())
    y_safe = 1 - data.table["label"].to_numpy()[rows]
    risk = data.table["risk"].to_numpy()[rows]
    states = np.array([[s[0], s[1]] for s in SAMPLES], dtype=np.float32)
    files = {"wisv_head": "wisv_head", "no_csi_head": "judge_head"}
    files["relabel_no_csi_head"] = "relabel_head"
    for key, name in files.items():
        head, extra = load_head(out[name])
        q = _q(head, data, rows, states if head.d_csi else None)
        q = q.mean(axis=1) if q.ndim == 2 else q
        tau, _ = choose_threshold(
            q, y_safe, max_accuracy_drop=SETTINGS["max_accuracy_drop"], important_weight=risk
        )
        assert extra["tau"] == pytest.approx(tau), key
        assert metrics[key]["tau"] == pytest.approx(tau), key
    # The held-out block: an AUC with its interval per head, the CSI head's accept rate under
    # each CSI state (q >= tau on the validation mismatches), a learning curve per head.
    for key in files:
        auc = metrics["heldout_auc"][key]
        assert auc["auc_lo"] <= auc["auc"] <= auc["auc_hi"]
    by_state = pd.DataFrame(metrics["accept_by_state"])
    head, extra = load_head(out["wisv_head"])
    q = _q(head, data, rows, states)
    expected = (q >= extra["tau"]).mean(axis=0)
    np.testing.assert_allclose(by_state.sort_values("csi_sample")["accept_rate"], expected)
    assert list(by_state["repair_cost"]) == sorted(s[2] for s in SAMPLES)
    curve = pd.DataFrame(metrics["learning_curve"]["no_csi_head"])
    assert curve["share"].tolist() == [0.25, 0.5, 0.75, 1.0]
    assert curve["mismatches"].dropna().is_monotonic_increasing
    assert curve["auc"].iloc[-1] == pytest.approx(metrics["heldout_auc"]["no_csi_head"]["auc"])
