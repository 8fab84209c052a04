"""Rule profile_batching (edgespec.profiling, edgespec.multidevice.batchprofile): the target's
batched verification forwards timed on this machine (context x tokens per row x batch size,
interleaved repeats, outliers re-timed), or the configured table under latency.mode given, and
the evaluation prompts' lengths (the prefill each answer costs the edge)."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import logging  # noqa: E402

from edgespec.artifacts import write_json  # noqa: E402
from edgespec.multidevice.batchprofile import BatchProfile  # noqa: E402
from edgespec.multidevice.report import profile_table  # noqa: E402
from edgespec.runconfig import chat_prompts, prompt_split  # noqa: E402

params = snakemake.params
batching = params.batching
records = prompt_split(list(snakemake.input.prompts), "eval")
if batching["mode"] == "given":
    from edgespec.models.load import load_tokenizer

    tokenizer = load_tokenizer(f"{params.model_dir}/target", role="target")
    profile = BatchProfile.given(batching["given"])
else:
    from edgespec.multidevice.batchprofile import measure
    from edgespec.profiling import BatchedForwardTimer
    from edgespec.runconfig import load_models
    from edgespec.seeding import numpy_rng

    _, target, tokenizer = load_models(params, snakemake.input, snakemake.threads)
    prompt = chat_prompts(tokenizer, records[:1], params.prompting)[0]
    profile = measure(
        lambda contexts: BatchedForwardTimer(
            target, prompt, contexts, batching["sizes"], warm_tokens=batching["tokens"]
        ),
        len(prompt),
        batching["contexts"],
        batching["tokens"],
        batching["sizes"],
        batching["repeats"],
        numpy_rng(params.seed, "profile-batching"),
    )
prompts = chat_prompts(tokenizer, records, params.prompting)
for warning in profile.warnings:
    logging.warning("batch profile: %s", warning)
logging.info("batch profile:\n%s", profile_table(profile).to_string(index=False))
lengths = {r.id: len(p) for r, p in zip(records, prompts, strict=True)}
write_json({**profile.to_dict(), "prompt_tokens": lengths}, snakemake.output.times)
