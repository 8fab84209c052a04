"""Rule collect_traces (CU-HLM wing, edgespec.cuhlm.traces): standard-HLM per-token traces of the
calibration prompts."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import logging
import time

import numpy as np

from edgespec.artifacts import write_json, write_npz, write_parquet
from edgespec.cuhlm.traces import collect_traces
from edgespec.runconfig import (
    chat_prompts,
    decode_progress,
    decoding_config,
    load_models,
    prompt_split,
)
from edgespec.seeding import torch_generator

params, dataset = snakemake.params, snakemake.wildcards.dataset
draft, target, tokenizer = load_models(params, snakemake.input, snakemake.threads)
records = prompt_split([snakemake.input.prompts], "calib")
cfg = decoding_config(params.decoding, tokenizer, target, keep_hidden=params.traces["store_hidden"])
start = time.perf_counter()
result = collect_traces(
    draft,
    target,
    chat_prompts(tokenizer, records, params.prompting),
    [r.id for r in records],
    cfg,
    params.traces["k_grid"],
    params.uncertainty["num_samples"],
    params.uncertainty["theta_max"],
    torch_generator(params.seed, "traces", dataset),
    hidden_dtype=np.dtype(params.traces["hidden_dtype"]),
    progress=decode_progress(f"traces {dataset}", len(records), cfg.max_new_tokens),
)
elapsed = time.perf_counter() - start
write_npz(snakemake.output.hidden, **result.hidden_arrays())
write_parquet(result.tokens, snakemake.output.tokens)
meta = result.meta(
    dataset, records, elapsed, tokenizer, decoding=params.decoding, uncertainty=params.uncertainty
)
write_json(meta, snakemake.output.meta)
logging.info("%d tokens from %d prompts in %.1f s", len(result.tokens), len(records), elapsed)
