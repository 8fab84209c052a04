"""One method under one channel or population: every replicate, edge policy, uplink scheme and
device count of the multi-device simulation, as one row of metrics each (methods §10);
torch-free.

Per run :func:`run_metrics` gives, with the units of its column names:

- ``aggregate_tps``: tokens committed by all devices / the time the last one finished;
  ``per_device_tps``: the mean over devices of its tokens / its finishing time;
  ``min_device_tps``: the slowest device's;
- ``token_latency_p50_s``, ``token_latency_p95_s``, ``token_latency_mean_s``: over every
  generated token of every device, the latency of the step that committed it divided by the
  tokens that step committed (a CU-HLM token's own latency; a WISV round's time per token), so
  every method is on one axis; ``step_latency_p95_s``: over steps (tokens or rounds). Prefill
  steps are excluded; quantiles are numpy's linear ones;
- ``edge_utilisation``: seconds the edge computed / the makespan (``prefill_share``: the part
  of them spent on prefills); ``mean_batch``, ``max_batch``: verification batch sizes;
  ``edge_wait_mean_s``: mean time a request waited in the queue; ``extrapolated_batches``: the
  fraction of batches priced above the largest timed tokens per row;
- ``uplink_utilisation``: seconds the band carried data / the makespan.

The scenarios (:meth:`SweepSettings.scenarios`): every uplink scheme under the configured
policy ("base"), and at the first scheme each ``max_batch`` and each ``window_s`` of the policy
sweep, one knob at a time. With N = 1, replicate 0 is the single-device evaluation plus the
edge work it leaves out (``workload``): :func:`sweep` checks that its per-step delays equal
those and raises otherwise.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from edgespec.multidevice.batchprofile import BatchProfile
from edgespec.multidevice.devices import Replicate, device_channels, profile_rng
from edgespec.multidevice.edge import BatchingPolicy, EdgeCost
from edgespec.multidevice.simulate import SimulationResult, simulate
from edgespec.multidevice.uplink import UPLINK_SCHEMES
from edgespec.multidevice.workload import DeviceProgram

log = logging.getLogger(__name__)

SINGLE_DEVICE_RTOL = 1e-9
"""How close one simulated device must come to the single-device evaluation (rounding only)."""


@dataclass(frozen=True)
class Scenario:
    """One edge policy under one uplink scheme; ``label`` names it in the tables."""

    uplink: str
    policy: BatchingPolicy
    label: str = "base"


@dataclass(frozen=True)
class SweepSettings:
    """``device_counts`` N; ``uplink`` schemes; ``slot_s`` of TDMA; ``policy`` of the edge;
    ``prompts_per_device`` (None: the whole split); ``max_batch_sweep`` and
    ``window_sweep``: the policy sweep's values (module docstring)."""

    device_counts: Sequence[int]
    uplink: Sequence[str]
    slot_s: float
    policy: BatchingPolicy
    prompts_per_device: int | None = None
    max_batch_sweep: Sequence[int] = field(default_factory=tuple)
    window_sweep: Sequence[float] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        counts = [int(n) for n in self.device_counts]
        if not counts or min(counts) < 1 or len(set(counts)) != len(counts):
            raise ValueError(f"device_counts must be distinct integers >= 1, got {counts}")
        object.__setattr__(self, "device_counts", sorted(counts))
        unknown = sorted(set(self.uplink) - set(UPLINK_SCHEMES))
        if unknown or not self.uplink:
            raise ValueError(f"uplink schemes must be among {UPLINK_SCHEMES}, got {self.uplink}")

    def scenarios(self) -> list[Scenario]:
        out = [Scenario(scheme, self.policy) for scheme in self.uplink]
        first = self.uplink[0]
        for cap in self.max_batch_sweep:
            if cap != self.policy.max_batch:
                policy = BatchingPolicy(cap, self.policy.window_s)
                out.append(Scenario(first, policy, f"max_batch={int(cap)}"))
        for window in self.window_sweep:
            if float(window) != self.policy.window_s:
                policy = BatchingPolicy(self.policy.max_batch, window)
                out.append(Scenario(first, policy, f"window={float(window) * 1e3:g} ms"))
        return out


def token_latencies(result: SimulationResult, programs: Sequence[DeviceProgram]) -> np.ndarray:
    """Every generated token's latency [s]: its step's latency over the step's tokens, once per
    token (prefill steps, which commit none, drop out)."""
    parts = []
    for i, program in enumerate(programs):
        counted = program.step_counted
        steps = result.step_latencies(i)[counted]
        tokens = program.step_tokens[counted]
        if np.any(tokens < 1):
            raise ValueError(f"device {i} has a counted step that commits no token")
        parts.append(np.repeat(steps / tokens, tokens))
    return np.concatenate(parts) if parts else np.zeros(0)


def _quantiles(values: np.ndarray) -> tuple[float, float, float]:
    if not values.size:
        return np.nan, np.nan, np.nan
    p50, p95 = np.quantile(values, [0.5, 0.95])
    return float(p50), float(p95), float(values.mean())


def run_metrics(result: SimulationResult, programs: Sequence[DeviceProgram]) -> dict[str, float]:
    """The metrics of one run (module docstring)."""
    tokens = np.array([p.tokens for p in programs], dtype=float)
    finish = result.finish_s
    makespan = result.makespan_s
    steps = np.concatenate(
        [result.step_latencies(i)[p.step_counted] for i, p in enumerate(programs)]
    )
    per_token = token_latencies(result, programs)
    requests = len(result.served)
    p50, p95, mean = _quantiles(per_token)
    busy = result.edge_busy_s
    batches = len(result.batch_sizes)
    with np.errstate(divide="ignore", invalid="ignore"):
        device_tps = np.where(finish > 0, tokens / finish, np.nan)
    return {
        "devices": len(programs),
        "tokens": float(tokens.sum()),
        "steps": int(steps.size),
        "makespan_s": makespan,
        "aggregate_tps": float(tokens.sum() / makespan) if makespan > 0 else np.nan,
        "per_device_tps": float(np.mean(device_tps)),
        "min_device_tps": float(np.min(device_tps)),
        "token_latency_p50_s": p50,
        "token_latency_p95_s": p95,
        "token_latency_mean_s": mean,
        "step_latency_p95_s": _quantiles(steps)[1],
        "edge_utilisation": busy / makespan if makespan > 0 else np.nan,
        "prefill_share": result.prefill_busy_s / busy if busy > 0 else 0.0,
        "mean_batch": float(np.mean(result.batch_sizes)) if batches else np.nan,
        "max_batch": int(max(result.batch_sizes)) if batches else 0,
        "edge_requests": requests,
        "edge_wait_mean_s": result.edge_wait_s / requests if requests else 0.0,
        "extrapolated_batches": result.extrapolated_batches / batches if batches else 0.0,
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


def _programs(
    replicate: Replicate,
    devices: int,
    channels: Sequence[str],
    pricings: Mapping[str, Any],
    table_of: Callable[[str, int], pd.DataFrame],
    prompts_per_device: int | None,
) -> list[DeviceProgram]:
    """The programs of devices 0..``devices``-1 in ``replicate``."""
    cache: dict[tuple[str, int, int], dict] = {}
    out = []
    for device, ids in enumerate(replicate.assignment(devices, prompts_per_device)):
        channel = channels[device]
        seed_index, stream = replicate.fading(device)
        key = (channel, seed_index, stream)
        if key not in cache:
            table = table_of(channel, seed_index)
            cache[key] = pricings[channel].prompt_programs(table, seed_index, stream)
        per_prompt = cache[key]
        out.append(DeviceProgram.concatenate(ids, [per_prompt[p] for p in ids]))
    return out


def sweep(
    table_of: Callable[[str, int], pd.DataFrame],
    pricings: Mapping[str, Any],
    population: Sequence[str],
    replicates: Sequence[Replicate],
    profile: BatchProfile,
    settings: SweepSettings,
    seed: int,
) -> pd.DataFrame:
    """Every (replicate, scenario, device count) run of one method: one row each, with
    ``replicate``, ``fading_seeds``, ``uplink``, ``policy``, ``max_batch_cap``, ``window_s``,
    ``prompts`` and the :func:`run_metrics` columns.

    ``table_of(channel, seed_index)``: the decoded table priced under that fading seed (the same
    for every seed of a channel-blind method); ``pricings``: channel -> a
    ``workload.CuhlmPricing`` or ``WisvPricing`` under it; ``population``: the channels cycled
    over the devices (``devices.device_channels``); ``replicates``: ``devices.replicates``;
    ``profile``: the batch profile (replicate 0 its fit, r >= 1 draw r, generator seeded by
    ``seed``)."""
    if not replicates:
        raise ValueError("no replicate to simulate")
    top = max(settings.device_counts)
    channels = device_channels(list(population), top)
    anchors = {p.anchor for p in pricings.values()}
    if len(anchors) != 1:
        raise ValueError(f"one method's pricings disagree on the verification anchor: {anchors}")
    anchor = anchors.pop()
    fading = {rep.fading(d)[0] for rep in replicates for d in range(top)}
    rows = []
    for rep in replicates:
        times = profile.times() if rep.index == 0 else profile.draw(profile_rng(seed, rep.index))
        edge = EdgeCost(times, *anchor)
        programs = _programs(rep, top, channels, pricings, table_of, settings.prompts_per_device)
        for scenario in settings.scenarios():
            for devices in settings.device_counts:
                result = simulate(
                    programs[:devices],
                    scenario.uplink,
                    edge,
                    scenario.policy,
                    slot_s=settings.slot_s,
                )
                row = {
                    "replicate": rep.index,
                    "fading_seeds": len(fading),
                    "uplink": scenario.uplink,
                    "policy": scenario.label,
                    "max_batch_cap": scenario.policy.max_batch or 0,
                    "window_s": scenario.policy.window_s,
                    "prompts": len(rep.prompts),
                    **run_metrics(result, programs[:devices]),
                }
                whole = settings.prompts_per_device in (None, len(rep.prompts))
                if devices == 1 and rep.index == 0 and whole:
                    seed_index, _ = rep.fading(0)
                    reference = pricings[channels[0]].single_device_delays(
                        table_of(channels[0], seed_index), seed_index, edge
                    )
                    row["single_device_rel_diff"] = check_single_device(
                        result, programs[0], reference
                    )
                rows.append(row)
        log.info("replicate %d: %d scenarios", rep.index, len(settings.scenarios()))
    return pd.DataFrame(rows)
