"""Rule score_cuhlm (CU-HLM wing, edgespec.cuhlm.scores): per-prompt text scores of every decoded
CU-HLM variant."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])


import pandas as pd

from edgespec.artifacts import write_parquet
from edgespec.cuhlm.scores import text_scores
from edgespec.runconfig import completion_texts, prompt_split

records = prompt_split(snakemake.input.prompts, "eval")


outputs = dict(
    zip(
        snakemake.params.variants,
        (completion_texts(p, records) for p in snakemake.input.completions),
        strict=True,
    )
)
frames = []
for variant, variant_texts in outputs.items():
    scores = text_scores(variant_texts, records, outputs["llm_only"])
    scores.insert(0, "variant", variant)
    frames.append(scores)
write_parquet(pd.concat(frames, ignore_index=True), snakemake.output.scores)
