"""Rule mine_labels (WISV wing, edgespec.wisv.labels): AutoJudge-style safe/important labels of
draft-target mismatches on one shard's calibration prompts, with the after-token hidden states
of both models and a summary of the counts (rule join_labels joins the shards)."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import logging
import time

import numpy as np

from edgespec.artifacts import write_json, write_npz, write_parquet
from edgespec.models.cpu_linear import reorder_all_weights
from edgespec.runconfig import chat_prompts, decoding_config, load_models, prompt_split
from edgespec.scoring import semantic_similarity
from edgespec.wisv.labels import label_summary, mine_labels
from edgespec.wisv.mining import MiningConfig

params = snakemake.params
# Mining takes ~450 target steps one after another, mostly at 1-3 rows, where linear weights
# reordered for oneDNN run about twice as fast in float32 (default pair, one thread, AVX2:
# 439 -> 328 s of one-token target steps; the reordering's own time is logged); decode jobs,
# at 16 rows, do not earn the reordering back (cpu_linear.PACKED_DTYPES). The reordering reads
# the weights as stored, so they load in that layout.
draft, target, tokenizer = load_models(
    params, snakemake.input, snakemake.threads, linear_layout="plain"
)
start = time.perf_counter()
if reorder_all_weights(target):
    logging.info("target weights reordered for oneDNN in %.1f s", time.perf_counter() - start)
# this job's datasets: their head-training split where the data has one, else calibration
records = prompt_split(list(snakemake.input.prompts), "train") or prompt_split(
    list(snakemake.input.prompts), "calib"
)
cfg = decoding_config(params.decoding, tokenizer, target, temperature=0.0)
config = MiningConfig.from_settings(
    params.wisv,
    eos_token_ids=cfg.eos_token_ids,
    pad_token_id=cfg.pad_token_id,
    batch_size=cfg.batch_size,
    hidden_dtype=np.float16,
)
golds = [r.gold_answer for r in records]
start = time.perf_counter()
table, draft_hidden, target_hidden = mine_labels(
    draft,
    target,
    chat_prompts(tokenizer, records, params.prompting),
    [r.id for r in records],
    golds,
    config,
    lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
    semantic_similarity,
)
summary = label_summary(table, golds, config, time.perf_counter() - start)
logging.info("labels: %s", summary)
write_npz(snakemake.output.hidden, draft=draft_hidden, target=target_hidden)
write_parquet(table, snakemake.output.table)
write_json(summary, snakemake.output.summary)
