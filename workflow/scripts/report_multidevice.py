"""Rule report_multidevice (edgespec.multidevice.summary, .capacity, .report, edgespec.plots):
every method's runs against the number of devices with intervals over replicates, the knee,
peak and service-level capacity, the ranking and crossovers, the headline and the figures."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import logging  # noqa: E402

import pandas as pd  # noqa: E402

from edgespec import plots  # noqa: E402
from edgespec.artifacts import atomic_path, read_json, write_csv  # noqa: E402
from edgespec.multidevice import capacity as cap  # noqa: E402
from edgespec.multidevice import report  # noqa: E402
from edgespec.multidevice.batchprofile import BatchProfile  # noqa: E402
from edgespec.multidevice.summary import headline, summary_table  # noqa: E402
from edgespec.wireless.delay import LatencyProfile  # noqa: E402

params, out = snakemake.params, snakemake.output
runs = pd.concat([pd.read_parquet(p) for p in snakemake.input.runs], ignore_index=True)
level, settings = params.seed_interval, params.settings
summary = summary_table(runs, level)
capacity = cap.capacity_table(runs, summary, settings["capacity"], level)
ranking = cap.ranking(runs, settings["capacity"], level)
crossovers = cap.crossovers(runs[runs["policy"] == "base"], level)
top = headline(
    summary, capacity, params.headline["uplink"], params.headline["channel"], settings["capacity"]
)
profile = BatchProfile.from_dict(read_json(snakemake.input.batching))
latency = LatencyProfile.from_dict(read_json(snakemake.input.profile))
provenance = read_json(snakemake.input.provenance)
notes = report.warnings(ranking, capacity, summary, profile)
for note in notes:
    logging.warning(note)
for frame, path in (
    (summary, out.summary),
    (capacity, out.capacity),
    (ranking, out.ranking),
    (crossovers, out.crossovers),
    (top, out.headline),
):
    write_csv(frame, path)
subtitle = (
    f"{provenance.get('preset')} pair; compute: {latency.source} profile, batches: "
    f"{profile.source}; median and {level:.0%} interval over replicates"
)
plots.multidevice_scaling(summary, out.scaling, subtitle=subtitle)
plots.multidevice_utilisation(summary, out.utilisation, subtitle=subtitle)
plots.multidevice_policies(summary, out.policies, params.headline["channel"], subtitle=subtitle)
pair = provenance.get("description", provenance.get("preset"))
text = report.document(
    report.intro(pair, report.prompt_count(runs), settings, latency.source, profile, level),
    ranking,
    notes,
    report.report_tables(summary, capacity, crossovers, profile),
)
with atomic_path(out.markdown) as tmp:
    tmp.write_text(text)
