"""Rule score_wisv (WISV wing, edgespec.wisv.scores): per-prompt text scores of every decoded
WISV run against the dataset and vanilla SD at its gamma (MiniLM embeddings: the only torch in
WISV evaluation)."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import logging

from edgespec.artifacts import write_parquet
from edgespec.runconfig import completion_texts, prompt_split
from edgespec.wisv.report import parse_stem
from edgespec.wisv.scores import text_scores

records = prompt_split(snakemake.input.prompts, "eval")
vanilla = {
    f"g{gamma}": completion_texts(path, records)
    for gamma, path in zip(snakemake.params.gammas, snakemake.input.vanilla, strict=True)
}
decodes = zip(
    snakemake.params.decodes, snakemake.input.completions, snakemake.output.scores, strict=True
)
for stem, completions, out in decodes:
    gamma = f"g{parse_stem(stem)['gamma']}"
    scores = text_scores(completion_texts(completions, records), records, vanilla[gamma])
    logging.info("%s: %s", stem, scores.mean(numeric_only=True).to_dict())
    write_parquet(scores, out)
