"""Rule decode_cuhlm (CU-HLM wing, edgespec.cuhlm.decode, edgespec.cuhlm.policies): one shard's
evaluation prompts (a dataset, or small datasets together) decoded under one variant."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import logging
import time

import pandas as pd

from edgespec.artifacts import read_json, write_parquet
from edgespec.cuhlm.decode import decode_variant
from edgespec.cuhlm.policies import policy_from_artifacts
from edgespec.decoding.prefill_store import PrefillStore
from edgespec.runconfig import (
    chat_prompts,
    decode_progress,
    decoding_config,
    load_models,
    prompt_split,
    write_completions,
)
from edgespec.seeding import torch_generator

params, inputs = snakemake.params, snakemake.input
variant, shard = snakemake.wildcards.variant, snakemake.wildcards.shard
# Only what this variant's policy reads (edgespec.variants.CUHLM_POLICY_READS): the rule passes
# the config keys in params.policy and the calibration artifacts it needs as inputs.
policy = policy_from_artifacts(
    variant,
    params.policy,
    fit=read_json(inputs.fit) if inputs.get("fit") else None,
    kstar=read_json(inputs.kstar) if inputs.get("kstar") else None,
    reference=pd.read_parquet(inputs.reference) if inputs.get("reference") else None,
)
draft, target, tokenizer = load_models(params, inputs, snakemake.threads)
records = prompt_split(list(inputs.prompts), "eval")  # this job's datasets
cfg = decoding_config(params.decoding, tokenizer, target)
start = time.perf_counter()
# One generator seed for every variant of a shard: equal draws wherever the variants agree
# (common random numbers); each shard its own stream, as each is decoded by its own job.
tokens, completions = decode_variant(
    variant,
    draft,
    target,
    chat_prompts(tokenizer, records, params.prompting),
    [r.id for r in records],
    cfg,
    policy,
    torch_generator(params.seed, "cuhlm", "decode", shard),
    progress=decode_progress(f"decode {variant} {shard}", len(records), cfg.max_new_tokens),
    prefilled=PrefillStore.load([inputs.prefill]),
)
elapsed = time.perf_counter() - start
rate = f"{len(tokens) / elapsed:.2f} tokens/s"
logging.info("%s %s: %d tokens in %.1f s (%s)", variant, shard, len(tokens), elapsed, rate)
write_parquet(tokens, snakemake.output.tokens)
write_completions(snakemake.output.completions, records, completions, tokenizer)
