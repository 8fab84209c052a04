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
from edgespec.wisv.labels import criterion_counts, mine_labels

params = snakemake.params
wisv = params.wisv
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
records = prompt_split(list(snakemake.input.prompts), "calib")  # this job's datasets
cfg = decoding_config(params.decoding, tokenizer, target, temperature=0.0)
start = time.perf_counter()
table, draft_hidden, target_hidden = mine_labels(
    draft,
    target,
    chat_prompts(tokenizer, records, params.prompting),
    [r.id for r in records],
    [r.gold_answer for r in records],
    max_new_tokens=wisv["max_new_tokens"],
    eos_token_ids=cfg.eos_token_ids,
    pad_token_id=cfg.pad_token_id,
    batch_size=cfg.batch_size,
    decode_text=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
    similarity=semantic_similarity,
    similarity_threshold=wisv["similarity_threshold"],
    max_mismatches_per_prompt=wisv["max_mismatches_per_prompt"],
    hidden_dtype=np.float16,
    label_max_new_tokens=wisv["label_max_new_tokens"],
    answer_marker=wisv["answer_marker"],
)
counts = criterion_counts(table)
summary = {
    "prompts": len(records),
    "answer_task_prompts": sum(r.gold_answer is not None for r in records),
    "mismatches": len(table),
    "important": int(table["label"].sum()),
    "safe": int((table["label"] == 0).sum()),
    "criterion": counts,
    "label_max_new_tokens": wisv["label_max_new_tokens"],
    "seconds": time.perf_counter() - start,
}
logging.info(
    "%d mismatches from %d prompts, %.1f%% important; by criterion: %s (%.0f s)",
    len(table),
    len(records),
    100 * table["label"].mean() if len(table) else float("nan"),
    counts,
    summary["seconds"],
)
write_npz(snakemake.output.hidden, draft=draft_hidden, target=target_hidden)
write_parquet(table, snakemake.output.table)
write_json(summary, snakemake.output.summary)
