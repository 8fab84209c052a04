"""One ``simulate_multidevice`` job: a method's pricing under each channel of a population, its
decoded tables, its replicates and the sweep (methods §10); torch-free.

A job is one method under one simulated channel, which is a wisv channel or a population of
them (``devices.device_channels``). A CU-HLM method prices its one token table on each
channel; a channel-blind WISV method its one round table; a CSI-reading WISV variant the table
decoded under each (channel, decoded fading seed).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from edgespec.multidevice.batchprofile import BatchProfile
from edgespec.multidevice.devices import prompt_order, replicates
from edgespec.multidevice.edge import BatchingPolicy
from edgespec.multidevice.sweep import SweepSettings, sweep
from edgespec.multidevice.workload import CuhlmPricing, WisvPricing, family
from edgespec.variants import RECONSTRUCTION_SAMPLING_VARIANTS
from edgespec.wireless.channel import ChannelCondition
from edgespec.wireless.delay import LatencyProfile
from edgespec.wisv.evaluate import CSI_VARIANTS, HEAD_OF_VARIANT, HEAD_VARIANTS

log = logging.getLogger(__name__)


def method_pricing(
    method: str,
    condition: ChannelCondition,
    profile: LatencyProfile,
    extras: Mapping[str, Any],
    pricing: Mapping[str, Any],
    seed: int,
    prompt_tokens: Mapping[Any, int] | None,
):
    """``method``'s pricing under ``condition``. ``extras``: the JSON the method reads
    (``kstar``: k* and |V| for CU-HLM; ``provenance`` and, for head variants, ``head`` for
    WISV); ``pricing``: ``prob_bits``, or ``gamma`` and ``hidden_bits``, and ``prefill``."""
    if family(method) == "cuhlm":
        kstar = extras["kstar"]
        return CuhlmPricing(
            method,
            condition,
            profile,
            kstar["vocab_size"],
            pricing["prob_bits"],
            seed,
            sampling_k=kstar["k_star"] if method in RECONSTRUCTION_SAMPLING_VARIANTS else None,
            prompt_tokens=prompt_tokens,
            prefill=pricing["prefill"],
        )
    models = extras["provenance"]["models"]
    head_s = 0.0
    if method in HEAD_VARIANTS:
        head_s = float(extras["head"]["head_round_s"][HEAD_OF_VARIANT[method]])
    return WisvPricing(
        method,
        condition,
        profile,
        pricing["gamma"],
        {
            "vocab_size": models["target"]["logits_size"],
            "hidden_size": models["draft"]["hidden_size"],
            "bits_per_value": pricing["hidden_bits"],
        },
        seed,
        head_s=head_s,
        prefill=pricing["prefill"],
    )


def run_job(
    method: str,
    channel: str,
    conditions: Mapping[str, ChannelCondition],
    population: Sequence[str],
    tables: Mapping[tuple[str, int], pd.DataFrame],
    profile: LatencyProfile,
    batch_profile: BatchProfile,
    extras: Mapping[str, Any],
    params: Mapping[str, Any],
) -> pd.DataFrame:
    """Every run of ``method`` under simulated channel ``channel`` (its ``population`` of
    ``conditions``): ``sweep``'s rows with ``method``, ``channel``, ``family`` and ``step``.

    ``tables``: (channel, decoded fading seed) -> decoded table, for a CSI-reading variant;
    any single key for the others. ``params``: ``pricing`` (:func:`method_pricing`),
    ``prompt_tokens``, ``sweep`` (``device_counts``, ``uplink``, ``tdma_slot_s``,
    ``batching``, ``prompts_per_device``, ``policy_sweep``), ``replicates`` and ``seed``."""
    csi = method in CSI_VARIANTS
    if not tables:
        raise ValueError(f"{method}: no decoded table")
    pricings = {
        name: method_pricing(
            method,
            conditions[name],
            profile,
            extras,
            params["pricing"],
            params["seed"],
            params.get("prompt_tokens"),
        )
        for name in dict.fromkeys(population)
    }
    one = next(iter(tables.values()))

    def table_of(name: str, seed_index: int) -> pd.DataFrame:
        if not csi:
            return one
        if (name, seed_index) not in tables:
            raise ValueError(f"{method}: no decode for channel {name!r}, fading seed {seed_index}")
        return tables[(name, seed_index)]

    prompts = prompt_order(one)
    for key, table in tables.items():
        if prompt_order(table) != prompts:
            raise ValueError(f"{method}: the table of {key} has other prompts than {prompts[:3]}")
    decoded = sorted({seed for _, seed in tables}) if csi else ()
    sw = params["sweep"]
    settings = SweepSettings(
        device_counts=sw["device_counts"],
        uplink=sw["uplink"],
        slot_s=sw["tdma_slot_s"],
        policy=BatchingPolicy.from_dict(sw["batching"]),
        prompts_per_device=sw["prompts_per_device"],
        max_batch_sweep=sw["policy_sweep"]["max_batch"],
        window_sweep=sw["policy_sweep"]["window_s"],
    )
    reps = replicates(prompts, params["replicates"], params["seed"], decoded)
    runs = sweep(table_of, pricings, population, reps, batch_profile, settings, params["seed"])
    step = next(iter(pricings.values())).step
    runs.insert(0, "step", step)
    runs.insert(0, "family", family(method))
    runs.insert(0, "channel", channel)
    runs.insert(0, "method", method)
    return runs
