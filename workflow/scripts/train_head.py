"""Rule train_head (WISV wing, edgespec.wisv.training): the WISV head (hidden states + CSI,
relabeled labels) and its ablations (no CSI on the original labels; no CSI on the relabeled
labels), each tau chosen by one rule against the same original labels of the same validation
prompts under the same budget; their held-out AUCs, the CSI head's accept rate by CSI state and
the learning curves. The heads' time per round is rule wisv_pricing's."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import logging

import numpy as np
import pandas as pd
import torch

from edgespec import plots
from edgespec.artifacts import write_json
from edgespec.wisv.training import (
    LabeledSet,
    accept_rate_by_channel,
    calibration_curves,
    heldout_quality,
    save_heads,
    train_heads,
    training_metrics,
)

params = snakemake.params
wisv = params.wisv
torch.set_num_threads(snakemake.threads)
with np.load(snakemake.input.hidden) as hidden:
    draft_hidden = hidden["draft"].astype(np.float32)
    target_hidden = hidden["target"].astype(np.float32)
data = LabeledSet(
    pd.read_parquet(snakemake.input.table),
    pd.read_parquet(snakemake.input.train),
    draft_hidden,
    target_hidden,
    tuple(wisv["csi_features"]),
)
data.check_features(snakemake.input.train)
heads, validation = train_heads(data, wisv["head"], params.seed)
accept_by_channel = accept_rate_by_channel(heads["wisv_head"], params.channels, data)
logging.info("WISV head accept rate by channel: %s", accept_by_channel)
out = snakemake.output
save_heads(
    heads,
    {
        "wisv_head": out.wisv_head,
        "no_csi_head": out.judge_head,
        "relabel_no_csi_head": out.relabel_head,
    },
    wisv["csi_features"],
)
metrics = training_metrics(heads, validation, accept_by_channel, wisv["head"]["max_accuracy_drop"])
metrics.update(heldout_quality(heads, data, validation, wisv["head"], params.seed))
write_json(metrics, out.metrics)
plots.head_calibration(calibration_curves(heads, validation), out.figure)
