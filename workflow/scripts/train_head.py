"""Rule train_head (WISV wing, edgespec.wisv.head): the WISV head (hidden states + CSI, relabeled)
and the no-CSI judge head."""

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
    HeadConfig,
    choose_threshold,
    head_accept_probability,
    save_head,
    split_by_group,
    train_head,
)

params = snakemake.params
wisv, seed = params.wisv, params.seed
hc = wisv["head"]
torch.set_num_threads(snakemake.threads)
table = pd.read_parquet(snakemake.input.table)
relabeled = pd.read_parquet(snakemake.input.train)
with np.load(snakemake.input.hidden) as hidden:
    draft_hidden, target_hidden = (
        hidden["draft"].astype(np.float32),
        hidden["target"].astype(np.float32),
    )
feature_cols = [f"phi_{name}" for name in wisv["csi_features"]]


def fit(xd, xt, csi, y_safe, groups, use_csi, risk):
    cfg = HeadConfig(
        hidden=hc["hidden"],
        epochs=hc["epochs"],
        lr=hc["lr"],
        weight_decay=hc["weight_decay"],
        patience=hc["patience"],
        seed=seed,
        use_csi=use_csi,
    )
    head, metrics = train_head(xd, xt, csi, y_safe, groups, cfg, val_fraction=hc["val_fraction"])
    _, val = split_by_group(groups, hc["val_fraction"], cfg.seed, labels=y_safe)
    q_val = head_accept_probability(head, xd[val], xt[val], None if csi is None else csi[val])
    q_val = q_val.numpy()
    tau, tau_table = choose_threshold(
        q_val, y_safe[val], max_accuracy_drop=hc["max_accuracy_drop"], important_weight=risk[val]
    )
    metrics = {k: v for k, v in metrics.items() if k != "history"}
    return head, {**metrics, "tau": float(tau)}, tau_table, q_val, y_safe[val]


rows = relabeled["mismatch"].to_numpy()
wisv_head, wisv_metrics, wisv_tau, wisv_q, wisv_y = fit(
    draft_hidden[rows],
    target_hidden[rows],
    relabeled[feature_cols].to_numpy(np.float32),
    1 - relabeled["label_csi"].to_numpy(),
    relabeled["prompt_id"].to_numpy(),
    True,
    relabeled["risk"].to_numpy(),
)
judge_head, judge_metrics, judge_tau, judge_q, judge_y = fit(
    draft_hidden,
    target_hidden,
    None,
    1 - table["label"].to_numpy(),
    table["prompt_id"].to_numpy(),
    False,
    table["risk"].to_numpy(),
)
# Does the head use the CSI? Accept rate on the same mismatches at each evaluation channel's
# mean state (|h|^2 = 1).
accept_by_channel = {}
for name, spec in params.channels.items():
    features = csi_features(ChannelCondition.from_dict(spec), 1.0)
    csi = np.tile([features[k] for k in wisv["csi_features"]], (len(table), 1)).astype(np.float32)
    q = head_accept_probability(wisv_head, draft_hidden, target_hidden, csi).numpy()
    accept_by_channel[name] = float((q >= wisv_metrics["tau"]).mean())
logging.info("WISV head accept rate by channel: %s", accept_by_channel)
save_head(
    wisv_head,
    snakemake.output.wisv_head,
    {"tau": wisv_metrics["tau"], "csi_features": list(wisv["csi_features"])},
)
save_head(judge_head, snakemake.output.judge_head, {"tau": judge_metrics["tau"]})
write_json(
    {
        "wisv_head": wisv_metrics,
        "no_csi_head": judge_metrics,
        "accept_rate_by_channel": accept_by_channel,
        "tau_table_wisv": wisv_tau.to_dict(orient="list"),
        "tau_table_no_csi": judge_tau.to_dict(orient="list"),
    },
    snakemake.output.metrics,
)
plots.head_calibration(
    {
        "WISV head (CSI, relabeled)": (wisv_q, wisv_y),
        "no-CSI head (original labels)": (judge_q, judge_y),
    },
    snakemake.output.figure,
)
