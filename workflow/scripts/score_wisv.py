"""Rule score_wisv (WISV wing, edgespec.wisv.scores): per-prompt text scores of one decoded WISV
run against the dataset and vanilla SD (MiniLM embeddings: the only torch in WISV evaluation)."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import logging

from edgespec.artifacts import write_parquet
from edgespec.runconfig import completion_texts, prompt_split
from edgespec.wisv.scores import text_scores

records = prompt_split(snakemake.input.prompts, "eval")
scores = text_scores(
    completion_texts(snakemake.input.completions, records),
    records,
    completion_texts(snakemake.input.vanilla, records),
)
logging.info("%s: %s", snakemake.wildcards.wdecode, scores.mean(numeric_only=True).to_dict())
write_parquet(scores, snakemake.output.scores)
