"""Training the WISV decision heads (methods §4.2; rule train_head).

Three heads (``head.HEAD_USES_CSI``): the WISV head (hidden states + CSI features, trained on
the relabeled labels, one row per mismatch and CSI sample), the no-CSI head on the original
labels (judge/AutoJudge style) and the no-CSI head on the relabeled labels (the ablation that
isolates what reading the CSI adds).

One split of the mined prompts serves every head (:func:`shared_split`, stratified by the
original labels): each head trains on the rows of the training prompts and early-stops on
those of the validation prompts, and each threshold tau is chosen by one rule
(:func:`head_threshold`) against the same original labels of the same validation mismatches
under the same budget, the CSI head scored under every CSI sample of the relabeling.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from edgespec.wireless.channel import ChannelCondition, csi_features
from edgespec.wisv.head import (
    HEAD_USES_CSI,
    DecisionHead,
    HeadConfig,
    choose_threshold,
    head_accept_probability,
    save_head,
    split_by_group,
    train_head,
)
from edgespec.wisv.head_quality import (
    accept_by_state,
    heldout_auc,
    learning_curve,
    per_mismatch_q,
    quality_metrics,
)
from edgespec.wisv.relabel import FEATURE_PREFIX, csi_feature_columns

log = logging.getLogger(__name__)

HEAD_TITLES = {
    "wisv_head": "WISV head (CSI, relabeled; mean over CSI states)",
    "no_csi_head": "no-CSI head (original labels)",
    "relabel_no_csi_head": "no-CSI head (relabeled labels)",
}
"""Each head's name in the calibration figure."""


@dataclass(frozen=True)
class LabeledSet:
    """What the heads learn from: the mined mismatches (``table``: prompt_id, label 1 =
    important, risk), their after-token states (``draft_hidden`` [N, H_d], ``target_hidden``
    [N, H_t], row j of ``table``) and the relabeling (``relabeled``, ``relabel_over_csi``'s
    rows: ``mismatch`` a row of ``table``, ``csi_sample``, the ``phi_<name>`` columns of
    ``csi_features``, ``label_csi``)."""

    table: pd.DataFrame
    relabeled: pd.DataFrame
    draft_hidden: np.ndarray
    target_hidden: np.ndarray
    csi_features: tuple[str, ...]

    @property
    def feature_columns(self) -> list[str]:
        return [FEATURE_PREFIX + name for name in self.csi_features]

    def check_features(self, source: str) -> None:
        """ValueError unless the relabeling (read from ``source``) has the CSI features that
        config key wisv.csi_features names, in order."""
        found = csi_feature_columns(self.relabeled)
        if self.feature_columns != found:
            raise ValueError(
                f"{source} has CSI features {found}, config key wisv.csi_features asks for "
                f"{self.feature_columns}: rerun relabel_csi"
            )


@dataclass(frozen=True)
class Validation:
    """The split every head shares: ``train_rows`` and ``val_rows`` of the mined table,
    ``relabel_split`` the (train, validation) rows of the relabeled table (same prompts),
    ``prompts`` the validation prompts, ``y_safe`` and ``risk`` the original labels (1 =
    safe) and risks of the validation mismatches, ``states`` [S, k] the relabeling's CSI
    samples (in sample order) the CSI head is scored under."""

    train_rows: np.ndarray
    val_rows: np.ndarray
    relabel_split: tuple[np.ndarray, np.ndarray]
    prompts: set[Any]
    y_safe: np.ndarray
    risk: np.ndarray
    states: np.ndarray


@dataclass
class TrainedHead:
    """One trained head: the head, its metrics (``train_head``'s without the history, plus
    tau and the validation accept rates at tau), its tau table (``choose_threshold``) and its
    validation probabilities q ([N_val], or [N_val, S] for the CSI head)."""

    head: DecisionHead
    metrics: dict[str, Any]
    tau_table: pd.DataFrame
    q_val: np.ndarray

    @property
    def tau(self) -> float:
        return self.metrics["tau"]


def shared_split(data: LabeledSet, val_fraction: float, seed: int) -> Validation:
    """One split of the prompts for every head (``split_by_group``, stratified by the original
    labels), so that the validation prompts, labels and budget that choose each tau agree."""
    table, relabeled = data.table, data.relabeled
    train_rows, val_rows = split_by_group(
        table["prompt_id"].to_numpy(), val_fraction, seed, labels=1 - table["label"].to_numpy()
    )
    prompts = set(table["prompt_id"].iloc[val_rows])
    in_val = relabeled["prompt_id"].isin(prompts).to_numpy()
    states = relabeled.drop_duplicates("csi_sample").sort_values("csi_sample")
    return Validation(
        train_rows,
        val_rows,
        (np.flatnonzero(~in_val), np.flatnonzero(in_val)),
        prompts,
        1 - table["label"].to_numpy()[val_rows],
        table["risk"].to_numpy()[val_rows],
        states[data.feature_columns].to_numpy(np.float32),
    )


def head_config(settings: Mapping[str, Any], seed: int, use_csi: bool) -> HeadConfig:
    """The ``HeadConfig`` of config key wisv.head (hidden, epochs, lr, weight_decay,
    patience)."""
    return HeadConfig(
        hidden=settings["hidden"],
        epochs=settings["epochs"],
        lr=settings["lr"],
        weight_decay=settings["weight_decay"],
        patience=settings["patience"],
        seed=seed,
        use_csi=use_csi,
    )


def validation_q(
    head: DecisionHead, data: LabeledSet, validation: Validation, use_csi: bool
) -> np.ndarray:
    """The head's q on the validation mismatches: [N_val], or for a head that reads the CSI
    (``use_csi``) [N_val, S], each mismatch under every CSI state of ``validation.states``."""
    rows = validation.val_rows
    xd, xt = data.draft_hidden[rows], data.target_hidden[rows]
    if not use_csi:
        return head_accept_probability(head, xd, xt).numpy()
    n, s = len(rows), len(validation.states)
    q = head_accept_probability(
        head,
        np.repeat(xd, s, axis=0),
        np.repeat(xt, s, axis=0),
        np.tile(validation.states, (n, 1)),
    )
    return q.numpy().reshape(n, s)


def head_threshold(
    q_val: np.ndarray, validation: Validation, max_accuracy_drop: float
) -> tuple[float, pd.DataFrame]:
    """Every head's tau rule: ``choose_threshold`` on the original labels of the shared
    validation mismatches, each important one weighted by its risk, the unsafe accept rate
    within ``max_accuracy_drop`` (config key wisv.head.max_accuracy_drop). Each mismatch is
    scored once, so one mismatch weighs the same for every head: a CSI head's [N_val, S] q is
    averaged over the CSI states first (``head_quality.per_mismatch_q``)."""
    return choose_threshold(
        per_mismatch_q(q_val),
        validation.y_safe,
        max_accuracy_drop=max_accuracy_drop,
        important_weight=validation.risk,
    )


def fit_head(
    name: str,
    data: LabeledSet,
    validation: Validation,
    settings: Mapping[str, Any],
    seed: int,
    train_prompts: set[Any] | None = None,
) -> TrainedHead:
    """Train head ``name`` (``HEAD_USES_CSI``) and choose its tau: the WISV head and the
    relabeled no-CSI head on the relabeled rows (``label_csi``), the no-CSI head on the
    original labels; ``settings`` config key wisv.head. ``train_prompts`` (default: all the
    training prompts) restricts the training rows (the learning curve)."""
    use_csi = HEAD_USES_CSI[name]
    if name == "no_csi_head":
        frame, rows = data.table, np.arange(len(data.table))
        labels, split = data.table["label"].to_numpy(), (validation.train_rows, validation.val_rows)
    else:
        frame, rows = data.relabeled, data.relabeled["mismatch"].to_numpy()
        labels, split = data.relabeled["label_csi"].to_numpy(), validation.relabel_split
    if train_prompts is not None:
        keep = frame["prompt_id"].iloc[split[0]].isin(train_prompts).to_numpy()
        split = (split[0][keep], split[1])
    head, metrics = train_head(
        data.draft_hidden[rows],
        data.target_hidden[rows],
        frame[data.feature_columns].to_numpy(np.float32) if use_csi else None,
        1 - labels,
        frame["prompt_id"].to_numpy(),
        head_config(settings, seed, use_csi),
        split=split,
    )
    q_val = validation_q(head, data, validation, use_csi)
    tau, tau_table = head_threshold(q_val, validation, settings["max_accuracy_drop"])
    metrics = {k: v for k, v in metrics.items() if k != "history"}
    chosen = tau_table[tau_table["tau"] == tau].iloc[0]
    metrics.update(
        {
            "tau": float(tau),
            "val_accept_rate": float(chosen["accept_rate"]),
            "val_unsafe_accept_rate": float(chosen["unsafe_accept_rate"]),
            "val_safe_accept_rate": float(chosen["safe_accept_rate"]),
        }
    )
    log.info("%s: %s", name, metrics)
    return TrainedHead(head, metrics, tau_table, q_val)


def train_heads(
    data: LabeledSet, settings: Mapping[str, Any], seed: int
) -> tuple[dict[str, TrainedHead], Validation]:
    """Every head of ``HEAD_USES_CSI`` on one shared split (config key wisv.head:
    val_fraction and the ``fit_head`` settings), by key."""
    validation = shared_split(data, settings["val_fraction"], seed)
    heads = {name: fit_head(name, data, validation, settings, seed) for name in HEAD_USES_CSI}
    return heads, validation


LEARNING_HEADS = ("no_csi_head", "wisv_head")
"""The heads whose learning curve train_head reports (original labels; relabeled with CSI)."""


def heldout_quality(
    heads: Mapping[str, TrainedHead],
    data: LabeledSet,
    validation: Validation,
    settings: Mapping[str, Any],
    seed: int,
    learning: bool = True,
) -> dict[str, Any]:
    """Held-out quality (``head_quality``): each head's AUC on the original validation labels
    with its bootstrap interval over prompts, the CSI head's accept rate under each CSI state
    of the relabeling, and (``learning``) the learning curves of ``LEARNING_HEADS``."""
    prompts = data.table["prompt_id"].to_numpy()[validation.val_rows]
    auc = {
        key: heldout_auc(t.q_val, validation.y_safe, prompts, seed, tag=key)
        for key, t in heads.items()
    }
    accept = None
    if "wisv_head" in heads:
        states = (
            data.relabeled.drop_duplicates("csi_sample")
            .sort_values("csi_sample")[["csi_sample", "repair_cost"]]
            .reset_index(drop=True)
        )
        relabeled_val = data.relabeled.iloc[validation.relabel_split[1]]
        accept = accept_by_state(
            heads["wisv_head"].q_val, heads["wisv_head"].tau, states, relabeled_val
        )
    curves = {}
    if learning:
        train_prompts = sorted(set(data.table["prompt_id"].iloc[validation.train_rows]), key=str)
        for key in LEARNING_HEADS:

            def fit_auc(chosen, key=key):
                t = fit_head(key, data, validation, settings, seed, set(chosen))
                n = int(data.table["prompt_id"].iloc[validation.train_rows].isin(chosen).sum())
                return n, heldout_auc(t.q_val, validation.y_safe, prompts, seed, samples=1)["auc"]

            curves[key] = learning_curve(fit_auc, train_prompts, seed)
    return quality_metrics(auc, accept, curves)


def accept_rate_by_channel(
    trained: TrainedHead, channels: Mapping[str, Mapping[str, Any]], data: LabeledSet
) -> dict[str, float]:
    """Does the head use the CSI? Its accept rate (q >= tau) on every mined mismatch at each
    evaluation channel's mean state (|h|^2 = 1), by channel name."""
    out = {}
    for name, spec in channels.items():
        features = csi_features(ChannelCondition.from_dict(spec), 1.0)
        row = [features[k] for k in data.csi_features]
        csi = np.tile(row, (len(data.table), 1)).astype(np.float32)
        q = head_accept_probability(trained.head, data.draft_hidden, data.target_hidden, csi)
        out[name] = float((q.numpy() >= trained.tau).mean())
    return out


def save_heads(
    heads: Mapping[str, TrainedHead], paths: Mapping[str, Any], csi_names: Sequence[str]
) -> None:
    """Each head to ``paths[key]`` with its tau (and, where it reads the CSI, the feature
    names ``csi_names`` in order)."""
    for key, trained in heads.items():
        extra: dict[str, Any] = {"tau": trained.tau}
        if trained.head.d_csi:
            extra["csi_features"] = list(csi_names)
        save_head(trained.head, paths[key], extra)


def training_metrics(
    heads: Mapping[str, TrainedHead],
    validation: Validation,
    accept_by_channel: Mapping[str, float],
    max_accuracy_drop: float,
) -> dict[str, Any]:
    """Rule train_head's metrics.json: each head's metrics by key, the validation set, the
    WISV head's accept rate by channel and each head's tau table (``tau_table_<key>``)."""
    return {
        **{key: trained.metrics for key, trained in heads.items()},
        "validation": {
            "prompts": sorted(map(str, validation.prompts)),
            "mismatches": len(validation.val_rows),
            "important": int((validation.y_safe == 0).sum()),
            "csi_states": len(validation.states),
            "max_accuracy_drop": max_accuracy_drop,
        },
        "accept_rate_by_channel": dict(accept_by_channel),
        **{
            f"tau_table_{key}": trained.tau_table.to_dict(orient="list")
            for key, trained in heads.items()
        },
    }


def calibration_curves(
    heads: Mapping[str, TrainedHead], validation: Validation
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(q, y_safe) of each head on the validation mismatches, by its ``HEAD_TITLES`` title
    (the CSI head's q averaged over the CSI states), for ``plots.head_calibration``."""
    return {
        HEAD_TITLES[key]: (t.q_val.mean(1) if t.q_val.ndim == 2 else t.q_val, validation.y_safe)
        for key, t in heads.items()
    }
