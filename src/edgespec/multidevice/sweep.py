"""One method under one channel: every device count, uplink scheme and fading seed of the
multi-device simulation, as one row of metrics each (methods §10); torch-free.

Per run (method, channel, uplink scheme, N devices, fading seed s) :func:`run_metrics` gives:

- ``aggregate_tps``: tokens committed by all devices / the time the last one finished;
- ``per_device_tps``: the mean over devices of its tokens / its finishing time;
- ``latency_p50_s``, ``latency_p95_s``, ``latency_mean_s``: over every token (CU-HLM) or round
  (WISV) of every device, the time from its start to its commit (prefills excluded);
- ``edge_utilisation``: seconds the edge computed / the makespan; ``mean_batch``: mean
  verification batch size; ``edge_wait_mean_s``: mean time a request waited in the queue;
- ``uplink_utilisation``: seconds the band carried data / the makespan.

With N = 1 the run is the single-device evaluation: :func:`sweep` checks that its per-step
delays equal those of ``apply_channel`` / ``round_latencies`` (and raises otherwise).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from edgespec.multidevice.edge import BatchingPolicy, BatchTimes
from edgespec.multidevice.simulate import SimulationResult, simulate
from edgespec.multidevice.uplink import UPLINK_SCHEMES
from edgespec.multidevice.workload import DeviceProgram, device_programs, prompt_order

log = logging.getLogger(__name__)

SINGLE_DEVICE_RTOL = 1e-9
"""How close one simulated device must come to the single-device evaluation (rounding only)."""


@dataclass(frozen=True)
class SweepSettings:
    """``device_counts`` N; ``uplink`` schemes; ``slot_s`` of TDMA; ``policy`` of the edge;
    ``prompts_per_device`` (None: the whole split)."""

    device_counts: Sequence[int]
    uplink: Sequence[str]
    slot_s: float
    policy: BatchingPolicy
    prompts_per_device: int | None = None

    def __post_init__(self) -> None:
        counts = [int(n) for n in self.device_counts]
        if not counts or min(counts) < 1 or len(set(counts)) != len(counts):
            raise ValueError(f"device_counts must be distinct integers >= 1, got {counts}")
        object.__setattr__(self, "device_counts", sorted(counts))
        unknown = sorted(set(self.uplink) - set(UPLINK_SCHEMES))
        if unknown or not self.uplink:
            raise ValueError(f"uplink schemes must be among {UPLINK_SCHEMES}, got {self.uplink}")


def run_metrics(result: SimulationResult, programs: Sequence[DeviceProgram]) -> dict[str, float]:
    """The metrics of one run (module docstring)."""
    tokens = np.array([p.tokens for p in programs], dtype=float)
    finish = result.finish_s
    makespan = result.makespan_s
    latencies = np.concatenate(
        [result.step_latencies(i)[p.step_counted] for i, p in enumerate(programs)]
    )
    requests = len(result.served)
    p50, p95 = np.quantile(latencies, [0.5, 0.95]) if latencies.size else (np.nan, np.nan)
    return {
        "devices": len(programs),
        "tokens": float(tokens.sum()),
        "steps": int(latencies.size),
        "makespan_s": makespan,
        "aggregate_tps": float(tokens.sum() / makespan) if makespan > 0 else np.nan,
        "per_device_tps": float(np.mean(tokens / finish)) if np.all(finish > 0) else np.nan,
        "latency_p50_s": float(p50),
        "latency_p95_s": float(p95),
        "latency_mean_s": float(latencies.mean()) if latencies.size else np.nan,
        "edge_utilisation": result.edge_busy_s / makespan if makespan > 0 else np.nan,
        "mean_batch": float(np.mean(result.batch_sizes)) if result.batch_sizes else np.nan,
        "max_batch": int(max(result.batch_sizes)) if result.batch_sizes else 0,
        "edge_requests": requests,
        "edge_wait_mean_s": result.edge_wait_s / requests if requests else 0.0,
        "uplink_utilisation": result.uplink_busy_s / makespan if makespan > 0 else np.nan,
        "transmissions": int(result.transmissions),
    }


def check_single_device(
    result: SimulationResult, program: DeviceProgram, reference: Mapping[Any, np.ndarray]
) -> float:
    """The largest relative difference between one simulated device's step delays and the
    single-device evaluation's (``reference``: per prompt, its delays in step order);
    ValueError above :data:`SINGLE_DEVICE_RTOL`."""
    expected = np.concatenate([reference[p] for p in program.prompts])
    got = result.step_latencies(0)
    if got.shape != expected.shape:
        raise ValueError(f"one device ran {got.size} steps, the evaluation has {expected.size}")
    scale = np.maximum(np.abs(expected), 1e-12)
    worst = float(np.max(np.abs(got - expected) / scale)) if got.size else 0.0
    if worst > SINGLE_DEVICE_RTOL:
        raise ValueError(
            f"one simulated device differs from the single-device evaluation by {worst:.3g} "
            "(relative): the simulation no longer prices what the evaluation prices"
        )
    return worst


def sweep(
    tables_by_seed: Mapping[int, pd.DataFrame],
    pricing,
    batch_times: BatchTimes,
    settings: SweepSettings,
) -> pd.DataFrame:
    """Every (uplink scheme, device count, fading seed) run of one method: one row each, with
    ``uplink``, ``devices``, ``seed``, ``prompts`` and the :func:`run_metrics` columns.

    ``tables_by_seed``: fading seed index -> the decoded table priced under it (the same table
    for every seed of a channel-blind method; a CSI-reading one's per-seed decodes);
    ``pricing``: a ``workload.CuhlmPricing`` or ``WisvPricing``. Every method decodes the same
    split, so every method's device i decodes the same prompts in the same order.
    """
    if not tables_by_seed:
        raise ValueError("no fading seed to simulate")
    prompts = None
    rows = []
    for seed_index, table in sorted(tables_by_seed.items()):
        order = prompt_order(table)
        if prompts is None:
            prompts = order
        elif order != prompts:
            raise ValueError(f"fading seed {seed_index}'s table has other prompts than the first")
        per_prompt = pricing.prompt_programs(table, seed_index)
        for devices in settings.device_counts:
            programs = device_programs(per_prompt, prompts, devices, settings.prompts_per_device)
            for scheme in settings.uplink:
                result = simulate(
                    programs,
                    scheme,
                    batch_times,
                    pricing.verify_tokens,
                    settings.policy,
                    slot_s=settings.slot_s,
                )
                row = {
                    "uplink": scheme,
                    "seed": int(seed_index),
                    "prompts": len(prompts),
                    **run_metrics(result, programs),
                }
                if devices == 1 and settings.prompts_per_device in (None, len(prompts)):
                    reference = pricing.single_device_delays(table, seed_index)
                    row["single_device_rel_diff"] = check_single_device(
                        result, programs[0], reference
                    )
                rows.append(row)
        log.info(
            "fading seed %d: %d device counts x %d schemes",
            seed_index,
            len(settings.device_counts),
            len(settings.uplink),
        )
    return pd.DataFrame(rows)
