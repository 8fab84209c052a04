"""Rule prefill_prompts (edgespec.decoding.prefill_store): both models' prefill of one shard's
evaluation prompts, stored for every decoding job of them."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

from edgespec.decoding.prefill_store import PrefillStore
from edgespec.decoding.progress import DecodeProgress
from edgespec.runconfig import chat_prompts, decoding_config, load_models, prompt_split

params = snakemake.params
draft, target, tokenizer = load_models(params, snakemake.input, snakemake.threads)
records = prompt_split(list(snakemake.input.prompts), "eval")  # this shard's datasets
prompts = chat_prompts(tokenizer, records, params.prompting)
cfg = decoding_config(
    {"max_new_tokens": 1, "temperature": 0.0, "batch_size": params.batch_size}, tokenizer, target
)
# both models' prefills of every prompt: tokens/s counts prompt tokens fed
progress = DecodeProgress(
    f"prefill {snakemake.wildcards.shard} (draft and target)",
    2 * sum(len(p) for p in prompts),
    2 * len(prompts),
)
PrefillStore.compute(
    {"draft": draft, "target": target},
    prompts,
    cfg.pad_token_id,
    cfg.batch_size,
    snakemake.output.store,
    progress=progress,
)
progress.close()
