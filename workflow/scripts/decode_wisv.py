"""Rule decode_wisv / decode_wisv_csi (WISV wing, edgespec.wisv.decode): greedy gamma-token rounds
of one WISV-study variant, channel-free or (the CSI-reading head) under one channel and fading
seed."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import logging
import time

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
from edgespec.wisv.acceptance import head_acceptance, topk_acceptance
from edgespec.wisv.decode import csi_vector_encoder, decode_wisv
from edgespec.wisv.evaluate import fading_seed
from edgespec.wisv.head import load_head

params = snakemake.params
wisv = params.wisv
variant = snakemake.wildcards.get("wvariant", "wisv")
gamma = int(snakemake.wildcards.gamma)
condition = seed = None
if variant == "wisv":
    # Decisions read the CSI: decoded under one channel and one fading realisation, whose draws
    # evaluate_wisv prices with too.
    channel = snakemake.wildcards.wchannel
    condition = ChannelCondition.from_dict(params.channels[channel])
    seed = fading_seed(params.seed, int(snakemake.wildcards.fseed))
acceptance, encoder = None, None
if variant == "topk_accept":
    acceptance = topk_acceptance(wisv["top_k"])
elif variant in ("head_no_csi", "head_relabel_no_csi", "wisv"):
    head, extra = load_head(snakemake.input.heads[0])
    acceptance = head_acceptance(head, extra["tau"])
    if head.d_csi:
        encoder = csi_vector_encoder(extra["csi_features"])
draft, target, tokenizer = load_models(params, snakemake.input, snakemake.threads)
records = prompt_split(snakemake.input.prompts, "eval")
cfg = decoding_config(
    {**params.decoding, "max_new_tokens": wisv["max_new_tokens"]},
    tokenizer,
    target,
    keep_hidden=acceptance is not None and variant != "topk_accept",
    temperature=0.0,
)
prompts = chat_prompts(tokenizer, records, params.prompting)
prefilled = PrefillStore.load(snakemake.input.prefill)  # every shard's evaluation prompts
start = time.perf_counter()
rounds, completions = decode_wisv(
    "wisv_fh" if variant == "wisv" else variant,
    draft,
    target,
    prompts,
    [r.id for r in records],
    cfg,
    gamma,
    acceptance,
    condition,
    fading_seed=seed,
    csi_encoder=encoder,
    progress=decode_progress(f"decode {variant} g{gamma}", len(records), cfg.max_new_tokens),
    prefilled=prefilled,
)
elapsed = time.perf_counter() - start
if "greedy_check_tie_margin" in wisv:  # vanilla SD at the smallest gamma
    # Losslessness on the real pair: vanilla greedy SD must give the target's greedy tokens.
    from edgespec.wisv.decode import check_greedy_equivalence

    check_start = time.perf_counter()
    check = check_greedy_equivalence(
        target,
        prompts,
        completions,
        wisv["greedy_check_tie_margin"],
        prefilled=prefilled,
        pad_token_id=cfg.pad_token_id,
    )
    logging.info(
        "greedy SD vs the target's greedy choices, teacher-forced (%.1f s): %s",
        time.perf_counter() - check_start,
        check,
    )
tokens = int(rounds["num_committed"].sum())
logging.info(
    "%s g%d %s: %d tokens, %d rounds in %.1f s",
    variant,
    gamma,
    "channel-free" if condition is None else f"{condition.name}, fading seed {seed}",
    tokens,
    len(rounds),
    elapsed,
)
write_parquet(rounds, snakemake.output.rounds)
write_completions(snakemake.output.completions, records, completions, tokenizer)
