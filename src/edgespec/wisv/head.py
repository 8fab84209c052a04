"""WISV decision head (methods §4.1-4.2): q = sigmoid(f([h_draft ; h_target ; phi(c)])).

q is the probability that accepting a mismatched draft token is safe; the edge accepts it when
q >= tau. The head is logistic (``hidden=0``, the AutoJudge/Judge-Decoding choice, which matched
a small MLP there; docs/methods.md §4.2) or has one ReLU hidden layer. Inputs are
standardised inside the module with train-split mean/std kept as buffers, so a saved head needs
nothing else. Training: class-weighted BCE, a validation split by prompt group, early stopping
on validation ROC AUC, and seeded torch generators for initialisation and shuffling.
"""

from __future__ import annotations

import copy
import math
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from edgespec import checks
from edgespec.artifacts import default_file_mode

MIN_STD = 1e-6
"""Features whose train-split std is below this are constant: they are centred, not scaled."""

REJECT_ALL_TAU = float(np.nextafter(1.0, 2.0))
"""A threshold above every probability: the head accepts nothing (strict matching only)."""

_EVAL_CHUNK = 8192
_SAVE_FORMAT = 1


@dataclass
class HeadConfig:
    hidden: int = 0
    """0: logistic head; > 0: one ReLU hidden layer of this width."""
    epochs: int = 200
    lr: float = 1e-3
    weight_decay: float = 1e-4
    batch_size: int = 256
    patience: int = 20
    """Stop after this many epochs without a higher validation ROC AUC."""
    seed: int = 0
    use_csi: bool = True
    """False: the no-CSI baseline (judge/AutoJudge style); CSI inputs are ignored."""


def _as_tensor(x: Any) -> torch.Tensor:
    return torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x)


def _init_linear(dims: tuple[int, int], generator: torch.Generator) -> nn.Linear:
    """nn.Linear with PyTorch's default initialisation, drawn from ``generator`` only."""
    layer = torch.nn.utils.skip_init(nn.Linear, dims[0], dims[1])
    nn.init.kaiming_uniform_(layer.weight, a=math.sqrt(5), generator=generator)
    bound = 1.0 / math.sqrt(dims[0]) if dims[0] > 0 else 0.0
    nn.init.uniform_(layer.bias, -bound, bound, generator=generator)
    return layer


class DecisionHead(nn.Module):
    """Logit of "safe to accept" from [h_draft ; h_target ; csi] (``d_csi = 0``: no CSI).

    ``forward`` takes tensors with any matching leading shape [..., d]; ``csi`` may also be a
    single vector [d_csi] shared by all positions (one round has one CSI). A head with
    ``d_csi = 0`` ignores ``csi``.
    """

    def __init__(
        self,
        d_draft: int,
        d_target: int,
        d_csi: int = 0,
        hidden: int = 0,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        if min(d_draft, d_target, d_csi, hidden) < 0 or d_draft + d_target + d_csi == 0:
            raise ValueError(f"bad head sizes {(d_draft, d_target, d_csi, hidden)}")
        self.d_draft, self.d_target, self.d_csi, self.hidden = d_draft, d_target, d_csi, hidden
        d_in = d_draft + d_target + d_csi
        self.register_buffer("mean", torch.zeros(d_in))
        self.register_buffer("std", torch.ones(d_in))
        if generator is None:
            generator = torch.Generator().manual_seed(0)
        if hidden == 0:
            self.net = _init_linear((d_in, 1), generator)
        else:
            self.net = nn.Sequential(
                _init_linear((d_in, hidden), generator),
                nn.ReLU(),
                _init_linear((hidden, 1), generator),
            )

    def arch(self) -> dict[str, int]:
        return {
            "d_draft": self.d_draft,
            "d_target": self.d_target,
            "d_csi": self.d_csi,
            "hidden": self.hidden,
        }

    @torch.no_grad()
    def set_standardisation(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        std = torch.where(std < MIN_STD, torch.ones_like(std), std)
        self.mean.copy_(mean.to(self.mean.dtype))
        self.std.copy_(std.to(self.std.dtype))

    def inputs(self, h_draft: Any, h_target: Any, csi: Any = None) -> torch.Tensor:
        """The raw (unstandardised) input [..., d_in], checked against the head's sizes."""
        dtype = self.mean.dtype
        h_draft = _as_tensor(h_draft).to(dtype)
        h_target = _as_tensor(h_target).to(dtype)
        if h_draft.shape[-1] != self.d_draft or h_target.shape[-1] != self.d_target:
            raise ValueError(
                f"hidden sizes {h_draft.shape[-1]}, {h_target.shape[-1]} do not match the head's "
                f"{self.d_draft}, {self.d_target}"
            )
        if h_draft.shape[:-1] != h_target.shape[:-1]:
            raise ValueError(f"leading shapes differ: {h_draft.shape}, {h_target.shape}")
        parts = [h_draft, h_target]
        if self.d_csi > 0:
            if csi is None:
                raise ValueError("this head uses CSI features; csi is None")
            csi = _as_tensor(csi).to(dtype)
            if csi.shape[-1] != self.d_csi:
                raise ValueError(f"csi has {csi.shape[-1]} features, the head {self.d_csi}")
            parts.append(csi.expand(*h_draft.shape[:-1], self.d_csi))
        return torch.cat(parts, dim=-1)

    def logits_from_inputs(self, x: torch.Tensor) -> torch.Tensor:
        return self.net((x - self.mean) / self.std).squeeze(-1)

    def forward(self, h_draft: Any, h_target: Any, csi: Any = None) -> torch.Tensor:
        return self.logits_from_inputs(self.inputs(h_draft, h_target, csi))


def head_accept_probability(
    head: DecisionHead, h_draft: Any, h_target: Any, csi: Any = None
) -> torch.Tensor:
    """q = sigmoid(logit) for each position, without gradients."""
    with torch.no_grad():
        return torch.sigmoid(head(h_draft, h_target, csi))


def split_by_group(
    groups: Any, val_fraction: float, seed: int, labels: Any = None
) -> tuple[np.ndarray, np.ndarray]:
    """Train/validation row indices such that no group (prompt) lies in both.

    With ``labels``, the split is stratified by group (StratifiedGroupKFold, the first fold
    whose both sides hold both classes), because mined labels are few and clustered by prompt
    and a plain group shuffle often leaves one side with a single class. Otherwise, or when no
    fold qualifies, GroupShuffleSplit.
    """
    # Imported here: decoding jobs import this module for the head alone, and scikit-learn
    # adds half a second to each of them.
    from sklearn.model_selection import GroupShuffleSplit, StratifiedGroupKFold

    groups = np.asarray(groups)
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must lie in (0, 1), got {val_fraction}")
    if len(np.unique(groups)) < 2:
        raise ValueError("need at least two groups to split by group")
    if labels is not None:
        labels = np.asarray(labels)
        n_splits = min(max(2, round(1 / val_fraction)), len(np.unique(groups)))
        if len(np.unique(labels)) == 2:
            folds = StratifiedGroupKFold(n_splits=n_splits, shuffle=True, random_state=seed)
            for train_idx, val_idx in folds.split(np.zeros(len(groups)), labels, groups):
                if len(np.unique(labels[train_idx])) == 2 and len(np.unique(labels[val_idx])) == 2:
                    return np.sort(train_idx), np.sort(val_idx)
    splitter = GroupShuffleSplit(n_splits=1, test_size=val_fraction, random_state=seed)
    train_idx, val_idx = next(splitter.split(np.zeros(len(groups)), groups=groups))
    return np.sort(train_idx), np.sort(val_idx)


def _predict_logits(head: DecisionHead, x: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        chunks = [
            head.logits_from_inputs(x[i : i + _EVAL_CHUNK]) for i in range(0, len(x), _EVAL_CHUNK)
        ]
    return torch.cat(chunks).double().numpy()


def train_head(
    X_draft: Any,
    X_target: Any,
    csi: Any,
    y_safe: Any,
    groups: Any,
    cfg: HeadConfig | None = None,
    val_fraction: float = 0.2,
    split: tuple[Any, Any] | None = None,
) -> tuple[DecisionHead, dict[str, Any]]:
    """Train a decision head; returns (head with the best-validation weights, metrics).

    ``X_draft`` [N, d_draft], ``X_target`` [N, d_target], ``csi`` [N, k] or None (required when
    ``cfg.use_csi``), ``y_safe`` [N] with 1 = safe to accept, ``groups`` [N] prompt ids. The
    validation split is ``split`` (train and validation row indices, e.g. the rows of prompts
    shared by several heads) or ``split_by_group(groups, val_fraction, cfg.seed)``. The train
    split needs both classes. The loss is BCE with pos_weight = n_unsafe / n_safe on the train
    split. Early stopping follows the validation ROC AUC, or the validation loss where the
    validation rows hold one class (AUC undefined; ``val_auc`` is then NaN).

    metrics: val_auc (best, or NaN), val_loss (at the kept epoch), train_auc (same weights),
    n_train, n_val, n_groups_train, n_groups_val, pos_fraction (safe fraction in the train
    split), val_pos_fraction, pos_weight, best_epoch (1-based), epochs_run, history (per
    epoch: epoch, train_loss, val_loss, val_auc).
    """
    cfg = cfg or HeadConfig()
    if cfg.batch_size < 1 or cfg.epochs < 1 or cfg.patience < 1:
        raise ValueError(f"batch_size, epochs and patience must be >= 1: {cfg}")
    X_draft = _as_tensor(X_draft).float()
    X_target = _as_tensor(X_target).float()
    from sklearn.metrics import roc_auc_score  # see split_by_group

    y = np.asarray(y_safe).astype(np.float64).reshape(-1)
    groups = np.asarray(groups)
    n = len(y)
    if X_draft.shape[0] != n or X_target.shape[0] != n or len(groups) != n:
        raise ValueError("X_draft, X_target, y_safe and groups need the same number of rows")
    if not np.isin(y, (0.0, 1.0)).all():
        raise ValueError("y_safe must be 0/1")
    if cfg.use_csi:
        if csi is None:
            raise ValueError("cfg.use_csi is True but csi is None")
        csi_t = _as_tensor(csi).float()
        if csi_t.ndim == 1:
            csi_t = csi_t.unsqueeze(-1)
        if csi_t.shape[0] != n:
            raise ValueError("csi needs one row per mismatch")
        d_csi = csi_t.shape[1]
    else:
        csi_t, d_csi = None, 0

    if split is None:
        train_idx, val_idx = split_by_group(groups, val_fraction, cfg.seed, labels=y_safe)
    else:
        train_idx, val_idx = (np.sort(np.asarray(part, dtype=np.int64)) for part in split)
        if len(np.intersect1d(groups[train_idx], groups[val_idx])):
            raise ValueError("the given split puts a group (prompt) on both sides")
    if len(train_idx) == 0 or len(val_idx) == 0:
        raise ValueError("the train and validation splits both need rows")
    y_train, y_val = y[train_idx], y[val_idx]
    if y_train.min() == y_train.max():
        raise ValueError("the train split has one class only; need safe and unsafe rows")
    val_has_both = y_val.min() != y_val.max()

    generator = torch.Generator().manual_seed(cfg.seed)
    head = DecisionHead(X_draft.shape[1], X_target.shape[1], d_csi, cfg.hidden, generator)
    x = head.inputs(X_draft, X_target, csi_t)
    x_train, x_val = x[torch.as_tensor(train_idx)], x[torch.as_tensor(val_idx)]
    x64 = x_train.double()
    head.set_standardisation(x64.mean(0), x64.std(0, unbiased=False))
    del x64

    n_pos = float(y_train.sum())
    pos_weight = (len(y_train) - n_pos) / n_pos
    loss_fn = nn.BCEWithLogitsLoss(pos_weight=torch.tensor(pos_weight, dtype=torch.float32))
    optimiser = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    target = torch.as_tensor(y_train, dtype=torch.float32)

    val_target = torch.as_tensor(y_val, dtype=torch.float32)
    best_score, best_epoch, best_state, wait = -math.inf, 0, None, 0
    best_auc, best_val_loss = math.nan, math.nan
    history = []
    for epoch in range(1, cfg.epochs + 1):
        head.train()
        order = torch.randperm(len(train_idx), generator=generator)
        total = 0.0
        for start in range(0, len(order), cfg.batch_size):
            batch = order[start : start + cfg.batch_size]
            optimiser.zero_grad()
            loss = loss_fn(head.logits_from_inputs(x_train[batch]), target[batch])
            loss.backward()
            optimiser.step()
            total += float(loss.detach()) * len(batch)
        head.eval()
        val_logits = _predict_logits(head, x_val)
        val_loss = float(
            loss_fn(torch.as_tensor(val_logits, dtype=torch.float32), val_target).detach()
        )
        val_auc = float(roc_auc_score(y_val, val_logits)) if val_has_both else math.nan
        history.append(
            {
                "epoch": epoch,
                "train_loss": total / len(order),
                "val_loss": val_loss,
                "val_auc": val_auc,
            }
        )
        score = val_auc if val_has_both else -val_loss
        if score > best_score:
            best_score, best_epoch, wait = score, epoch, 0
            best_auc, best_val_loss = val_auc, val_loss
            best_state = copy.deepcopy(head.state_dict())
        else:
            wait += 1
            if wait >= cfg.patience:
                break
    head.load_state_dict(best_state)
    head.eval()
    head.train_config = asdict(cfg)
    metrics = {
        "val_auc": best_auc,
        "val_loss": best_val_loss,
        "train_auc": float(roc_auc_score(y_train, _predict_logits(head, x_train))),
        "n_train": len(train_idx),
        "n_val": len(val_idx),
        "n_groups_train": len(np.unique(groups[train_idx])),
        "n_groups_val": len(np.unique(groups[val_idx])),
        "pos_fraction": float(y_train.mean()),
        "val_pos_fraction": float(y_val.mean()),
        "pos_weight": pos_weight,
        "best_epoch": best_epoch,
        "epochs_run": len(history),
        "history": history,
    }
    return head, metrics


HEAD_USES_CSI = {"wisv_head": True, "no_csi_head": False, "relabel_no_csi_head": False}
"""The heads rule train_head trains (the WISV head and its two no-CSI ablations), by key, and
whether each reads the CSI."""


def untrained_heads(
    d_draft: int, d_target: int, d_csi: int, hidden: int
) -> dict[str, DecisionHead]:
    """Every head of :data:`HEAD_USES_CSI` with the sizes :func:`train_head` gives it (hidden
    states ``d_draft`` and ``d_target`` wide, ``d_csi`` CSI features where the head reads them,
    ``hidden`` as :attr:`HeadConfig.hidden`) and untrained weights: a head's compute per round
    depends on its sizes, not on its weights, so it can be timed before the labels it is
    trained on exist."""
    return {
        key: DecisionHead(d_draft, d_target, d_csi if uses_csi else 0, hidden)
        for key, uses_csi in HEAD_USES_CSI.items()
    }


def choose_threshold(
    q_val: Any,
    y_safe_val: Any,
    *,
    max_accuracy_drop: float,
    important_weight: Any = None,
    grid: Any = None,
) -> tuple[float, pd.DataFrame]:
    """The smallest tau whose unsafe accept rate on validation is within ``max_accuracy_drop``.

    unsafe_accept_rate(tau) = sum_{j: y_j = 0, q_j >= tau} w_j / N_val, over all N_val validation
    mismatches, with w_j = ``important_weight`` (scalar or [N_val]; default 1, or e.g. the soft
    risk r_j). ``q_val`` may be [N_val, S]: a head that reads the CSI, scored under S channel
    states; a mismatch then counts as accepted for the fraction of states with q >= tau, so the
    rates stay per mismatch and the budget means the same for every head compared on the same
    labels and prompts. It is the proxy for the accuracy drop: during label mining each important
    mismatch, when accepted, changed the target's final answer, so it counts the answer
    changes caused per mismatch. It is a proxy because (i) it is per mismatch, not per answer:
    an answer's drop is at most this rate times the mean number of mismatches per answer, so
    divide the per-answer budget by that number for a bound; (ii) a changed answer is not always
    a wrong one; (iii) labels were mined one mismatch at a time on the target's own trajectory.

    The rate falls as tau rises, so the smallest feasible tau accepts the most. Candidates are
    ``grid`` (default: every distinct value of q_val) plus ``REJECT_ALL_TAU`` (accept none by
    the head, always feasible). Returns (tau, table) with one row per candidate: tau,
    accept_rate (share of validation mismatches with q >= tau), unsafe_accept_rate,
    safe_accept_rate (share of safe mismatches accepted) and meets_budget.
    """
    q2 = np.asarray(q_val, dtype=np.float64)
    if q2.ndim == 1:
        q2 = q2[:, None]
    y = np.asarray(y_safe_val).reshape(-1)
    if q2.ndim != 2 or q2.shape[0] == 0 or q2.shape[1] == 0 or q2.shape[0] != len(y):
        raise ValueError("q_val ([N] or [N, S]) and y_safe_val need the same, nonzero length")
    if not np.isin(y, (0, 1)).all():
        raise ValueError("y_safe_val must be 0/1")
    max_accuracy_drop = checks.nonneg_number("max_accuracy_drop", max_accuracy_drop)
    weight = np.broadcast_to(
        checks.nonneg_array(
            "important_weight", 1.0 if important_weight is None else important_weight
        ),
        y.shape,
    )

    # One entry per (mismatch, state), each carrying 1/S of its mismatch.
    states = q2.shape[1]
    q = q2.reshape(-1)
    y_entry = np.repeat(y, states)
    w_entry = np.repeat(weight, states) / states
    order = np.argsort(q, kind="stable")
    q_sorted = q[order]
    unsafe_w = np.where(y_entry[order] == 0, w_entry[order], 0.0)
    safe = np.where(y_entry[order] == 1, 1.0 / states, 0.0)
    count = np.full(len(q), 1.0 / states)
    # Suffix sums: entry i covers sorted rows i.. (those with q >= q_sorted[i]); entry N is 0.
    unsafe_suffix = np.concatenate([np.cumsum(unsafe_w[::-1])[::-1], [0.0]])
    safe_suffix = np.concatenate([np.cumsum(safe[::-1])[::-1], [0.0]])
    count_suffix = np.concatenate([np.cumsum(count[::-1])[::-1], [0.0]])

    taus = np.unique(q) if grid is None else np.unique(np.asarray(grid, dtype=np.float64))
    taus = np.union1d(taus, [REJECT_ALL_TAU])
    first = np.searchsorted(q_sorted, taus, side="left")
    n = len(y)
    n_safe = max(float((y == 1).sum()), 1.0)
    table = pd.DataFrame(
        {
            "tau": taus,
            "accept_rate": count_suffix[first] / n,
            "unsafe_accept_rate": unsafe_suffix[first] / n,
            "safe_accept_rate": safe_suffix[first] / n_safe,
        }
    )
    table["meets_budget"] = table["unsafe_accept_rate"] <= max_accuracy_drop + 1e-12
    tau = float(table.loc[table["meets_budget"], "tau"].min())
    return tau, table


def save_head(head: DecisionHead, path: str | os.PathLike, extra: dict | None = None) -> None:
    """torch.save {config, state_dict, extra} atomically (temp file + os.replace).

    ``extra`` must hold plain Python values (dict/list/str/number/bool/None) or tensors, so that
    ``load_head`` can read it with ``weights_only=True``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": _SAVE_FORMAT,
        "config": head.arch(),
        "train_config": getattr(head, "train_config", None),
        "state_dict": {k: v.detach().cpu().clone() for k, v in head.state_dict().items()},
        "extra": dict(extra or {}),
    }
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save(payload, fh)
        os.chmod(tmp, default_file_mode())  # mkstemp's 0600 would hide it from the group
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load_head(path: str | os.PathLike) -> tuple[DecisionHead, dict]:
    """(head in eval mode, extra) from a ``save_head`` file."""
    payload = torch.load(path, map_location="cpu", weights_only=True)
    if payload.get("format") != _SAVE_FORMAT:
        raise ValueError(f"{path}: not a decision-head file of format {_SAVE_FORMAT}")
    head = DecisionHead(**payload["config"])
    head.load_state_dict(payload["state_dict"])
    if payload.get("train_config") is not None:
        head.train_config = payload["train_config"]
    head.eval()
    return head, payload["extra"]
