"""Rule profile_batching (edgespec.profiling, edgespec.multidevice.edge): the target's batched
verification forwards timed on this machine (tokens per row x batch size), or the configured
table under latency.mode given, for the edge of the multi-device simulation."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import logging  # noqa: E402

from edgespec.artifacts import write_json  # noqa: E402
from edgespec.multidevice.edge import BatchTimes  # noqa: E402

batching = snakemake.params.batching
if batching["mode"] == "given":
    times = BatchTimes(batching["given"], "given")
else:
    from edgespec.data.records import read_jsonl
    from edgespec.profiling import measure_target_batch_times
    from edgespec.runconfig import chat_prompts, load_models

    params = snakemake.params
    _, target, tokenizer = load_models(params, snakemake.input, snakemake.threads)
    record = read_jsonl(snakemake.input.prompts)[0]
    prompt = chat_prompts(tokenizer, [record], params.prompting)[0]
    table = measure_target_batch_times(
        target, prompt, batching["tokens"], batching["sizes"], batching["repeats"]
    )
    times = BatchTimes(table, "measured")
# Measured seconds, and the factor a batch is charged (non-decreasing in the batch size).
for tokens, row in times.table.items():
    logging.info(
        "tokens %d per row: %s",
        tokens,
        ", ".join(
            f"batch {b} {s * 1e3:.1f} ms (x{times.factor(tokens, b):.2f})" for b, s in row.items()
        ),
    )
write_json(times.to_dict(), snakemake.output.times)
