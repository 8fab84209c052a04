"""Rule decode_wisv / decode_wisv_csi (WISV wing, edgespec.wisv.decode): greedy gamma-token rounds
of one WISV-study variant, channel-free or (the CSI-reading head) under one channel and fading
seed."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

from edgespec.artifacts import write_parquet
from edgespec.decoding.prefill_store import PrefillStore
from edgespec.runconfig import (
    chat_prompts,
    decode_progress,
    decoding_config,
    load_models,
    prompt_split,
    write_completions,
)
from edgespec.wireless.channel import ChannelCondition
from edgespec.wisv.decode import CSI_DECODE, decode_job, variant_rule
from edgespec.wisv.evaluate import fading_seed

params, wisv, wildcards = snakemake.params, snakemake.params.wisv, snakemake.wildcards
variant, gamma = wildcards.get("wvariant", CSI_DECODE), int(wildcards.gamma)
condition = seed = None
if variant == CSI_DECODE:
    # Decisions read the CSI: decoded under one channel and one fading realisation, whose draws
    # evaluate_wisv prices with too.
    condition = ChannelCondition.from_dict(params.channels[wildcards.wchannel])
    seed = fading_seed(params.seed, int(wildcards.fseed))
heads = snakemake.input.heads
rule = variant_rule(variant, heads[0] if heads else None, wisv.get("top_k"))
draft, target, tokenizer = load_models(params, snakemake.input, snakemake.threads)
records = prompt_split(snakemake.input.prompts, "eval")
settings = {**params.decoding, "max_new_tokens": wisv["max_new_tokens"]}
cfg = decoding_config(settings, tokenizer, target, keep_hidden=rule.keep_hidden, temperature=0.0)
rounds, completions = decode_job(
    variant,
    (draft, target),
    chat_prompts(tokenizer, records, params.prompting),
    [r.id for r in records],
    cfg,
    gamma,
    rule,
    condition=condition,
    seed=seed,
    progress=decode_progress(f"decode {variant} g{gamma}", len(records), cfg.max_new_tokens),
    prefilled=PrefillStore.load(snakemake.input.prefill),  # every shard's evaluation prompts
    # Losslessness on the real pair (vanilla SD at the smallest gamma only).
    greedy_tie_margin=wisv.get("greedy_check_tie_margin"),
)
write_parquet(rounds, snakemake.output.rounds)
write_completions(snakemake.output.completions, records, completions, tokenizer)
