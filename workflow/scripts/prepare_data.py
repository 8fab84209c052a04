"""Rule prepare_data (edgespec.data.prepare): draw one configured prompt set and split it into
calib/eval."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import logging  # noqa: E402

from edgespec.data.prepare import assign_splits, load_records
from edgespec.data.records import write_jsonl
from edgespec.seeding import numpy_rng  # noqa: E402

spec = snakemake.params.spec
name = snakemake.wildcards.dataset
rng = numpy_rng(snakemake.params.seed, "data", name)
records = load_records(spec["source"], spec["n"], rng, path=spec.get("path"), label=name)
records = assign_splits(records, snakemake.params.calib_fraction, rng, spec.get("train_fraction"))
write_jsonl(records, snakemake.output.prompts)
logging.info("%s: %d prompts (%s)", name, len(records), spec["source"])
