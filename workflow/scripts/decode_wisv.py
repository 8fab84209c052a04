"""Rule decode_wisv (WISV wing, edgespec.wisv.decode): greedy gamma-token rounds under one
WISV-study variant."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import logging
import time

from edgespec.artifacts import write_parquet
from edgespec.models.load import load_pair_from_dir
from edgespec.runconfig import chat_prompts, decoding_config, prompt_split, write_completions
from edgespec.seeding import numpy_rng, torch_generator
from edgespec.wireless.channel import ChannelCondition
from edgespec.wisv.acceptance import head_acceptance, topk_acceptance
from edgespec.wisv.decode import csi_vector_encoder, decode_wisv
from edgespec.wisv.head import load_head

params = snakemake.params
wisv = params.wisv
variant, channel = snakemake.wildcards.wvariant, snakemake.wildcards.wchannel
gamma = int(snakemake.wildcards.gamma)
# Decisions of the channel-blind variants do not depend on the channel ("any"): any condition
# serves for decoding, and evaluate_wisv prices the rounds under each channel.
condition = ChannelCondition.from_dict(
    params.channels[channel] if channel != "any" else next(iter(params.channels.values()))
)
acceptance, encoder = None, None
if variant == "topk_accept":
    acceptance = topk_acceptance(wisv["top_k"])
elif variant == "head_no_csi":
    head, extra = load_head(snakemake.input.heads[0])
    acceptance = head_acceptance(head, extra["tau"])
elif variant == "wisv":
    head, extra = load_head(snakemake.input.heads[0])
    acceptance = head_acceptance(head, extra["tau"])
    encoder = csi_vector_encoder(extra["csi_features"])
draft, target, tokenizer = load_pair_from_dir(params.model_dir, params.models, snakemake.threads)
records = prompt_split(snakemake.input.prompts, "eval")
cfg = decoding_config(
    {**params.decoding, "max_new_tokens": wisv["max_new_tokens"]},
    tokenizer,
    target,
    keep_hidden=variant in ("head_no_csi", "wisv"),
    temperature=0.0,
)
start = time.perf_counter()
rounds, completions = decode_wisv(
    "wisv_fh" if variant == "wisv" else variant,
    draft,
    target,
    chat_prompts(tokenizer, records, params.prompting),
    [r.id for r in records],
    cfg,
    gamma,
    acceptance,
    condition,
    numpy_rng(params.seed, "wisv-channel", channel),
    csi_encoder=encoder,
)
elapsed = time.perf_counter() - start
if "greedy_check_tie_margin" in wisv:  # vanilla SD at the smallest gamma
    # Losslessness on the real pair: vanilla greedy SD must give the target's greedy tokens.
    from edgespec.decoding.engine import generate_tokenwise
    from edgespec.wisv.decode import check_greedy_equivalence

    prompts = chat_prompts(tokenizer, records, params.prompting)
    alone = generate_tokenwise(prompts, cfg, torch_generator(params.seed, "check"), target=target)
    check = check_greedy_equivalence(
        target, prompts, completions, alone, tie_margin=wisv["greedy_check_tie_margin"]
    )
    logging.info("greedy SD vs target-only greedy: %s", check)
tokens = int(rounds["num_committed"].sum())
logging.info(
    "%s g%d %s: %d tokens, %d rounds in %.1f s",
    variant,
    gamma,
    channel,
    tokens,
    len(rounds),
    elapsed,
)
write_parquet(rounds, snakemake.output.rounds)
write_completions(snakemake.output.completions, records, completions, tokenizer)
