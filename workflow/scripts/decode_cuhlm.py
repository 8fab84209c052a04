"""Rule decode_cuhlm (CU-HLM wing, edgespec.cuhlm.decode): decode the evaluation prompts under one
CU-HLM family variant."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import logging
import time

import pandas as pd

from edgespec.artifacts import read_json, write_parquet
from edgespec.cuhlm.calibration import LinearFit
from edgespec.cuhlm.decode import decode_variant
from edgespec.cuhlm.policies import build_policy
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
variant = snakemake.wildcards.variant
cuhlm = params.cuhlm
fit_info = read_json(snakemake.input.fit)
kstar = read_json(snakemake.input.kstar)
fit = LinearFit(fit_info["a"], fit_info["b"], fit_info["r2"], fit_info["pearson_r"], fit_info["n"])
u_th = fit_info["u_th"]
policy_params = {
    "uncertainty_samples": params.uncertainty["num_samples"],
    "theta_max": params.uncertainty["theta_max"],
    "u_th_risk_averse": fit_info["u_th_risk_averse"],
    "u_th_risk_prone": fit_info["u_th_risk_prone"],
    "u_th": u_th if u_th is not None else -1.0,
    "fit": fit,
    "theta_tv": cuhlm["theta_tv"],
    "k_star": kstar["k_star"],
    "u_th_joint": kstar["joint"]["u_th"],
    "k_joint": kstar["joint"]["k_star"],
    "fixed_k": cuhlm["fixed_k"],
    "online_k_max": cuhlm["online_k_max"],
}
if variant == "random_skip":
    reference = pd.read_parquet(snakemake.input.reference)
    policy_params["random_skip_rate"] = float(reference["skipped"].mean())
    logging.info("random skip at the measured rate %.4f", policy_params["random_skip_rate"])
policy = build_policy(variant, policy_params)

draft, target, tokenizer = load_models(params, snakemake.input, snakemake.threads)
records = prompt_split(snakemake.input.prompts, "eval")
cfg = decoding_config(params.decoding, tokenizer, target)
start = time.perf_counter()
# One generator seed for every variant: equal draws wherever the variants agree (common
# random numbers), so differences between variants are not sampling noise of separate seeds.
tokens, completions = decode_variant(
    variant,
    draft,
    target,
    chat_prompts(tokenizer, records, params.prompting),
    [r.id for r in records],
    cfg,
    policy,
    torch_generator(params.seed, "cuhlm", "decode"),
    progress=decode_progress(f"decode {variant}", len(records), cfg.max_new_tokens),
)
elapsed = time.perf_counter() - start
logging.info(
    "%s: %d tokens in %.1f s (%.2f tokens/s)", variant, len(tokens), elapsed, len(tokens) / elapsed
)
write_parquet(tokens, snakemake.output.tokens)
write_completions(snakemake.output.completions, records, completions, tokenizer)
