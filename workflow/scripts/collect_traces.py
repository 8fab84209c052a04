"""Rule collect_traces: standard-HLM per-token traces of the calibration prompts."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import logging  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from edgespec.artifacts import write_json, write_npz, write_parquet  # noqa: E402
from edgespec.datasets import chat_token_ids, read_jsonl  # noqa: E402
from edgespec.engine import DecodingConfig  # noqa: E402
from edgespec.models import load_pair_from_dir, stop_token_ids  # noqa: E402
from edgespec.seeding import torch_generator  # noqa: E402
from edgespec.traces import collect_traces  # noqa: E402

params = snakemake.params
draft, target, tokenizer = load_pair_from_dir(params.model_dir, params.models, snakemake.threads)
records = [r for r in read_jsonl(snakemake.input.prompts) if r.split == "calib"]
prompts = [chat_token_ids(tokenizer, r.prompt, params.system_prompt) for r in records]
dec = params.decoding
cfg = DecodingConfig(
    max_new_tokens=dec["max_new_tokens"],
    temperature=dec["temperature"],
    eos_token_ids=stop_token_ids(tokenizer, target),
    pad_token_id=tokenizer.pad_token_id or 0,
    batch_size=dec["batch_size"],
    keep_hidden=params.traces["store_hidden"],
)
start = time.perf_counter()
result = collect_traces(
    draft,
    target,
    prompts,
    [r.id for r in records],
    cfg,
    params.traces["k_grid"],
    params.uncertainty["num_samples"],
    params.uncertainty["theta_max"],
    torch_generator(params.seed, "traces", snakemake.wildcards.dataset),
    hidden_dtype=np.dtype(params.traces["hidden_dtype"]),
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
        "decoding": dec,
        "uncertainty": params.uncertainty,
        "completions": {
            r.id: tokenizer.decode(g, skip_special_tokens=True)
            for r, g in zip(records, result.generated, strict=True)
        },
    },
    snakemake.output.meta,
)
logging.info("%d tokens from %d prompts in %.1f s", len(result.tokens), len(records), elapsed)
