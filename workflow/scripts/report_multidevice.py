"""Rule report_multidevice (edgespec.multidevice.summary, edgespec.plots): every method's runs
against the number of devices with intervals over fading seeds, where each saturates the edge or
the band, the headline table and the figures."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import math  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from edgespec import plots  # noqa: E402
from edgespec.artifacts import atomic_path, read_json, write_csv  # noqa: E402
from edgespec.multidevice.edge import BatchTimes  # noqa: E402
from edgespec.multidevice.summary import (  # noqa: E402
    display_table,
    headline,
    saturation_table,
    summary_table,
)
from edgespec.report import markdown_table  # noqa: E402
from edgespec.wireless.delay import LatencyProfile  # noqa: E402

params = snakemake.params
runs = pd.concat([pd.read_parquet(p) for p in snakemake.input.runs], ignore_index=True)
prompt_counts = runs.groupby("method")["prompts"].first()
if prompt_counts.nunique() != 1:
    raise ValueError(
        f"the methods were decoded on different prompt sets: {prompt_counts.to_dict()}"
    )
level = params.seed_interval
summary = summary_table(runs, level)
saturation = saturation_table(
    runs, params.saturation["utilisation"], params.saturation["efficiency"], level
)
write_csv(summary, snakemake.output.summary)
write_csv(saturation, snakemake.output.saturation)
top = headline(summary, saturation, params.headline["uplink"], params.headline["channel"])
write_csv(top, snakemake.output.headline)

profile = LatencyProfile.from_dict(read_json(snakemake.input.profile))
batch_times = BatchTimes.from_dict(read_json(snakemake.input.batching))
provenance = read_json(snakemake.input.provenance)
subtitle = (
    f"{provenance.get('preset')} pair; compute: {profile.source} profile, batches: "
    f"{batch_times.source}; median and {level:.0%} interval over fading seeds"
)
plots.multidevice_scaling(summary, snakemake.output.scaling, subtitle=subtitle)
plots.multidevice_utilisation(summary, snakemake.output.utilisation, subtitle=subtitle)


def devices_text(point, low, high) -> str:
    def one(v):
        return f"> {int(runs['devices'].max())}" if math.isinf(v) else f"{v:g}"

    if not np.isfinite(point) and not math.isinf(point):
        return "n/a"
    return one(point) if low == high == point else f"{one(point)} [{one(low)}, {one(high)}]"


sat_rows = saturation[["method", "channel", "uplink", "seeds", "bottleneck"]].copy()
for name, label in (
    ("saturation_n", "edge or band saturated from N"),
    ("edge_saturation_n", "edge from N"),
    ("band_saturation_n", "band from N"),
    ("scaling_limit_n", f"per-device tokens/s < {params.saturation['efficiency']:.0%} from N"),
):
    sat_rows[label] = [
        devices_text(*v)
        for v in zip(
            saturation[name], saturation[f"{name}_lo"], saturation[f"{name}_hi"], strict=True
        )
    ]
columns = {
    "aggregate tokens/s": ("aggregate_tps", ".3g"),
    "per-device tokens/s": ("per_device_tps", ".3g"),
    "scaling vs 1 device": ("scaling", ".3g"),
    "p50 latency (s)": ("latency_p50_s", ".3g"),
    "p95 latency (s)": ("latency_p95_s", ".3g"),
    "edge busy": ("edge_utilisation", ".2f"),
    "mean batch": ("mean_batch", ".3g"),
    "queue wait (s)": ("edge_wait_mean_s", ".3g"),
    "band busy": ("uplink_utilisation", ".2f"),
}
steps = summary.groupby("method")["step"].first()
batch_rows = pd.DataFrame(
    [
        {
            "tokens per row": tokens,
            **{
                f"batch {b}": f"{s * 1e3:.1f} ms (x{batch_times.factor(tokens, b):.2f})"
                for b, s in row.items()
            },
        }
        for tokens, row in batch_times.table.items()
    ]
)
policy = params.batching
window = policy["window_s"]
lines = [
    "# Many devices, one edge: measured results",
    f"Model pair: {provenance.get('description', provenance.get('preset'))}. N devices share "
    "one uplink band and one edge. Each device decodes the evaluation split "
    f"({int(prompt_counts.iloc[0])} prompts) from its own starting prompt, on those prompts' own "
    "fading draws (the same draws for every method: common random numbers); with one device "
    "the simulation is the single-device evaluation, and the stage checks that it reproduces "
    "its delays.",
    "**What is shared.** The band: under `equal_split` the devices transmitting at the same "
    "moment split it equally; under `tdma` each device owns one slot of "
    f"{params.tdma_slot_s * 1e3:g} ms in a frame of N slots (0 = a fixed 1/N share). Every "
    "device keeps its own fading (one gain per token or round) and transmits at the same power "
    "spectral density, so its rate is its share of the band times its own spectral efficiency. "
    "**What is queued.** Verification requests at the edge: when idle, it runs one batched "
    "target forward over the waiting requests "
    f"(max batch {policy['max_batch'] or 'N'}, waiting window {window * 1e3:g} ms); a prompt's "
    "prefill is an edge job of its own. **Where batch times come from.** A batch of b requests "
    "costs the single-request time of the latency profile "
    f"({profile.source}) times t(b) / t(1) of the target's batched forwards "
    f"({batch_times.source}, below; interpolated linearly between timed batch sizes). Devices' "
    "own compute and propagation (RTT / 2 each way) contend for nothing.",
    "CU-HLM methods are priced per token, WISV ones per round (latency: "
    + ", ".join(f"{m} per {s}" for m, s in steps.items())
    + "). Every figure: the median over fading seeds with its "
    f"{level:.0%} interval; `scaling` is aggregate tokens/s over the single device's, seed by "
    "seed. The CSI-reading WISV variants exist only under the fading seeds they were decoded in.",
    "## Target forward batch times",
    "Seconds as timed or given, and (x) the factor a batch is charged: t(b) / t(1), made "
    "non-decreasing in the batch size.",
    markdown_table(batch_rows),
    "## Where each method saturates",
    f"The edge or the band counts as saturated from the smallest N at which it is busy at least "
    f"{params.saturation['utilisation']:.0%} of the time.",
    markdown_table(sat_rows),
    "## Every method, channel, uplink scheme and device count",
    markdown_table(display_table(summary, columns)),
]
with atomic_path(snakemake.output.markdown) as tmp:
    tmp.write_text("\n\n".join(lines) + "\n")
