"""Rule decode_cuhlm (CU-HLM wing, edgespec.cuhlm.decode): decode one shard's evaluation prompts
(a dataset, or small datasets together) under one CU-HLM family variant."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import logging
import time

import pandas as pd

from edgespec.artifacts import read_json, write_parquet
from edgespec.cuhlm.calibration import LinearFit
from edgespec.cuhlm.decode import decode_variant
from edgespec.cuhlm.policies import build_policy
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

params = snakemake.params
variant, shard = snakemake.wildcards.variant, snakemake.wildcards.shard
# Only what this variant's policy reads (edgespec.variants.CUHLM_POLICY_READS): the rule passes
# the config keys in params.policy and the calibration artifacts it needs as inputs.
policy_params = dict(params.policy)
if snakemake.input.get("fit"):
    fit_info = read_json(snakemake.input.fit)
    policy_params["fit"] = LinearFit(
        fit_info["a"], fit_info["b"], fit_info["r2"], fit_info["pearson_r"], fit_info["n"]
    )
    policy_params["u_th_risk_averse"] = fit_info["u_th_risk_averse"]
    policy_params["u_th_risk_prone"] = fit_info["u_th_risk_prone"]
    policy_params["u_th"] = fit_info["u_th"] if fit_info["u_th"] is not None else -1.0
if snakemake.input.get("kstar"):
    kstar = read_json(snakemake.input.kstar)
    policy_params["k_star"] = kstar["k_star"]
    # the joint (u_th, k) programme's solution at cuhlm.kstar_channel (variant cuhlm_joint)
    policy_params["u_th_joint"] = kstar["joint"]["u_th"]
    policy_params["k_joint"] = kstar["joint"]["k_star"]
if variant == "random_skip":
    reference = pd.read_parquet(snakemake.input.reference)
    policy_params["random_skip_rate"] = float(reference["skipped"].mean())
    logging.info("random skip at the measured rate %.4f", policy_params["random_skip_rate"])
policy = build_policy(variant, policy_params)

draft, target, tokenizer = load_models(params, snakemake.input, snakemake.threads)
records = prompt_split(list(snakemake.input.prompts), "eval")  # this job's datasets
cfg = decoding_config(params.decoding, tokenizer, target)
start = time.perf_counter()
# One generator seed for every variant of a shard: equal draws wherever the variants agree
# (common random numbers), so differences between variants are not sampling noise of separate
# seeds; each shard its own stream, as each is decoded by its own job.
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
    prefilled=PrefillStore.load([snakemake.input.prefill]),
)
elapsed = time.perf_counter() - start
logging.info(
    "%s %s: %d tokens in %.1f s (%.2f tokens/s)",
    variant,
    shard,
    len(tokens),
    elapsed,
    len(tokens) / elapsed,
)
write_parquet(tokens, snakemake.output.tokens)
write_completions(snakemake.output.completions, records, completions, tokenizer)
