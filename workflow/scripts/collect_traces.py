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

params = snakemake.params
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
    torch_generator(params.seed, "traces", snakemake.wildcards.dataset),
    hidden_dtype=np.dtype(params.traces["hidden_dtype"]),
    progress=decode_progress(
        f"traces {snakemake.wildcards.dataset}", len(records), cfg.max_new_tokens
    ),
)
elapsed = time.perf_counter() - start
empty = np.zeros((len(result.tokens), 0), dtype=np.float16)
write_npz(
    snakemake.output.hidden,
    draft=result.draft_hidden if result.draft_hidden is not None else empty,
    target=result.target_hidden if result.target_hidden is not None else empty,
)
write_parquet(result.tokens, snakemake.output.tokens)
write_json(
    {
        "dataset": snakemake.wildcards.dataset,
        "prompts": len(records),
        "tokens": len(result.tokens),
        "k_grid": result.tokens.attrs["k_grid"],
        "vocab_size": result.tokens.attrs["k_grid"][-1],
        "decode_seconds": elapsed,
        "tokens_per_second": len(result.tokens) / elapsed if elapsed > 0 else None,
        "decoding": params.decoding,
        "uncertainty": params.uncertainty,
        "completions": {
            r.id: tokenizer.decode(g, skip_special_tokens=True)
            for r, g in zip(records, result.generated, strict=True)
        },
    },
    snakemake.output.meta,
)
logging.info("%d tokens from %d prompts in %.1f s", len(result.tokens), len(records), elapsed)
