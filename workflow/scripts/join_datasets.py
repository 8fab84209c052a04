"""Rules join_cuhlm_decode, join_wisv_decode and join_labels (edgespec.shards): join the
per-dataset outputs of a model stage; each named output is joined from the input of the same
name."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import logging

from edgespec.shards import join_shards

# Keys of a JSON summary that are settings (equal in every shard), not counts to sum.
settings = snakemake.params.get("summary_settings", [])
for name, out in snakemake.output.items():
    shards = snakemake.input[name]
    shards = [shards] if isinstance(shards, str) else list(shards)
    join_shards(shards, out, settings)
    logging.info("%s: joined %d shard(s) into %s", name, len(shards), out)
