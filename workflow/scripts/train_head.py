"""Rule train_head (WISV wing, edgespec.wisv.head): the WISV head (hidden states + CSI, relabeled
labels) and its ablations (no CSI on the original labels; no CSI on the relabeled labels), each
tau chosen against the same original labels of the same validation prompts under the same
budget. The heads' time per round is rule profile_head's."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import logging

import numpy as np
import pandas as pd
import torch

from edgespec import plots
from edgespec.artifacts import write_json
from edgespec.wireless.channel import ChannelCondition, csi_features
from edgespec.wisv.head import (
    HEAD_USES_CSI,
    HeadConfig,
    choose_threshold,
    head_accept_probability,
    save_head,
    split_by_group,
    train_head,
)
from edgespec.wisv.relabel import csi_feature_columns

params = snakemake.params
wisv, seed = params.wisv, params.seed
hc = wisv["head"]
torch.set_num_threads(snakemake.threads)
table = pd.read_parquet(snakemake.input.table)
relabeled = pd.read_parquet(snakemake.input.train)
with np.load(snakemake.input.hidden) as hidden:
    draft_hidden = hidden["draft"].astype(np.float32)
    target_hidden = hidden["target"].astype(np.float32)
feature_cols = [f"phi_{name}" for name in wisv["csi_features"]]
if feature_cols != csi_feature_columns(relabeled):
    raise ValueError(
        f"{snakemake.input.train} has CSI features {csi_feature_columns(relabeled)}, config key "
        f"wisv.csi_features asks for {feature_cols}: rerun relabel_csi"
    )

# One split of the prompts for every head, stratified by the original labels: the validation
# prompts, labels and budget that choose each tau are the same.
train_rows, val_rows = split_by_group(
    table["prompt_id"].to_numpy(), hc["val_fraction"], seed, labels=1 - table["label"].to_numpy()
)
val_prompts = set(table["prompt_id"].iloc[val_rows])
in_val = relabeled["prompt_id"].isin(val_prompts).to_numpy()
relabel_split = (np.flatnonzero(~in_val), np.flatnonzero(in_val))
val_y = 1 - table["label"].to_numpy()[val_rows]
val_risk = table["risk"].to_numpy()[val_rows]
# The CSI head is scored on each validation mismatch under every CSI sample of the relabeling.
states = relabeled.drop_duplicates("csi_sample").sort_values("csi_sample")[feature_cols]
states = states.to_numpy(np.float32)


def config(use_csi: bool) -> HeadConfig:
    return HeadConfig(
        hidden=hc["hidden"],
        epochs=hc["epochs"],
        lr=hc["lr"],
        weight_decay=hc["weight_decay"],
        patience=hc["patience"],
        seed=seed,
        use_csi=use_csi,
    )


def validation_q(head, use_csi: bool) -> np.ndarray:
    xd, xt = draft_hidden[val_rows], target_hidden[val_rows]
    if not use_csi:
        return head_accept_probability(head, xd, xt).numpy()
    n, s = len(val_rows), len(states)
    q = head_accept_probability(
        head,
        np.repeat(xd, s, axis=0),
        np.repeat(xt, s, axis=0),
        np.tile(states, (n, 1)),
    )
    return q.numpy().reshape(n, s)


def fit(name: str, frame: pd.DataFrame, rows: np.ndarray, labels: np.ndarray, use_csi, split):
    """Train one head on ``frame``'s rows (hidden states ``rows``, 1 = important ``labels``)."""
    head, metrics = train_head(
        draft_hidden[rows],
        target_hidden[rows],
        frame[feature_cols].to_numpy(np.float32) if use_csi else None,
        1 - labels,
        frame["prompt_id"].to_numpy(),
        config(use_csi),
        split=split,
    )
    q_val = validation_q(head, use_csi)
    tau, tau_table = choose_threshold(
        q_val, val_y, max_accuracy_drop=hc["max_accuracy_drop"], important_weight=val_risk
    )
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
    logging.info("%s: %s", name, metrics)
    return head, metrics, tau_table, q_val


rows = relabeled["mismatch"].to_numpy()
relabels = relabeled["label_csi"].to_numpy()
heads = {
    "wisv_head": fit(
        "wisv_head", relabeled, rows, relabels, HEAD_USES_CSI["wisv_head"], relabel_split
    ),
    "no_csi_head": fit(
        "no_csi_head",
        table,
        np.arange(len(table)),
        table["label"].to_numpy(),
        HEAD_USES_CSI["no_csi_head"],
        (train_rows, val_rows),
    ),
    "relabel_no_csi_head": fit(
        "relabel_no_csi_head",
        relabeled,
        rows,
        relabels,
        HEAD_USES_CSI["relabel_no_csi_head"],
        relabel_split,
    ),
}
# Does the head use the CSI? Accept rate on the same mismatches at each evaluation channel's
# mean state (|h|^2 = 1).
accept_by_channel = {}
wisv_head, wisv_metrics = heads["wisv_head"][0], heads["wisv_head"][1]
for name, spec in params.channels.items():
    features = csi_features(ChannelCondition.from_dict(spec), 1.0)
    csi = np.tile([features[k] for k in wisv["csi_features"]], (len(table), 1)).astype(np.float32)
    q = head_accept_probability(wisv_head, draft_hidden, target_hidden, csi).numpy()
    accept_by_channel[name] = float((q >= wisv_metrics["tau"]).mean())
logging.info("WISV head accept rate by channel: %s", accept_by_channel)

paths = {
    "wisv_head": snakemake.output.wisv_head,
    "no_csi_head": snakemake.output.judge_head,
    "relabel_no_csi_head": snakemake.output.relabel_head,
}
for key, (head, metrics, _, _) in heads.items():
    extra = {"tau": metrics["tau"]}
    if head.d_csi:
        extra["csi_features"] = list(wisv["csi_features"])
    save_head(head, paths[key], extra)
write_json(
    {
        **{key: metrics for key, (_, metrics, _, _) in heads.items()},
        "validation": {
            "prompts": sorted(map(str, val_prompts)),
            "mismatches": len(val_rows),
            "important": int((val_y == 0).sum()),
            "csi_states": len(states),
            "max_accuracy_drop": hc["max_accuracy_drop"],
        },
        "accept_rate_by_channel": accept_by_channel,
        **{f"tau_table_{key}": t.to_dict(orient="list") for key, (_, _, t, _) in heads.items()},
    },
    snakemake.output.metrics,
)
labels = {
    "wisv_head": "WISV head (CSI, relabeled; mean over CSI states)",
    "no_csi_head": "no-CSI head (original labels)",
    "relabel_no_csi_head": "no-CSI head (relabeled labels)",
}
plots.head_calibration(
    {labels[key]: (q.mean(1) if q.ndim == 2 else q, val_y) for key, (_, _, _, q) in heads.items()},
    snakemake.output.figure,
)
