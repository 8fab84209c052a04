"""Who the N devices are in one replicate of the multi-device simulation: which prompts each
decodes, on which channel and which fading draws (methods §10); torch-free.

**Prompts** (:func:`device_prompts`). The evaluation split's P prompts, in the order of their
ids (:func:`prompt_order`); device i decodes ``prompts_per_device`` of them (default P: the
whole split) in a cyclic order that starts at prompt i mod P. Devices i and i + P, which start
on the same prompt, step through the split with different strides (1, P - 1, 3, P - 3, ...
coprime to P). With one device the program is the whole split in order: the single-device
evaluation.

**Replicates** (:class:`Replicate`). Every figure is computed in R replicates (R =
``evaluation.fading_seeds``), the same for every method (common random numbers). Replicate r:

- prompts: r = 0 the split itself; r >= 1 a bootstrap resample of its P prompts (with
  replacement, :func:`bootstrap_prompts`, drawn from a generator seeded by the configured seed
  and r), which the devices then decode as above;
- fading: a channel-blind method uses fading seed r, on device stream d for device d (so no two
  devices share draws); a CSI-reading WISV variant exists only on the draws it was decoded on
  (``wisv.csi_decode_seeds``, K of them): device d uses decoded seed ``(r + d) mod K``, and with
  K = 1 every device of a channel shares those draws;
- the batch profile: r = 0 its fit, r >= 1 bootstrap draw r (``batchprofile.BatchProfile.draw``).

**Channels** (:func:`device_channels`): a simulated channel is a wisv channel (every device on
it) or a population, a list of wisv channels cycled over the devices (``multidevice.populations``;
device d on entry d mod len): each device has its own mean SNR, bandwidth and RTT; devices share
the band's time as before, each at its own full-band rate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from edgespec.seeding import numpy_rng


def coprime_strides(num_prompts: int) -> list[int]:
    """1, P - 1, 3, P - 3, ... reduced mod P, those coprime to P, each once (P = 1: [1])."""
    if num_prompts < 1:
        raise ValueError("need at least one prompt")
    if num_prompts == 1:
        return [1]
    out: list[int] = []
    for odd in range(1, num_prompts + 1, 2):
        for stride in (odd % num_prompts, (-odd) % num_prompts):
            if stride and math.gcd(stride, num_prompts) == 1 and stride not in out:
                out.append(stride)
    for stride in range(1, num_prompts):  # even P has no even strides; odd P may have more
        if math.gcd(stride, num_prompts) == 1 and stride not in out:
            out.append(stride)
    return out


def device_prompts(
    num_prompts: int, devices: int, prompts_per_device: int | None = None
) -> list[list[int]]:
    """Per device, the indices (into the prompt list) it decodes, in order (module docstring)."""
    if devices < 1:
        raise ValueError(f"need at least one device, got {devices}")
    per_device = num_prompts if prompts_per_device is None else int(prompts_per_device)
    if per_device < 1:
        raise ValueError(f"prompts_per_device must be >= 1, got {prompts_per_device}")
    strides = coprime_strides(num_prompts)
    out = []
    for device in range(devices):
        replica, start = divmod(device, num_prompts)
        stride = strides[replica % len(strides)]
        out.append([(start + stride * j) % num_prompts for j in range(per_device)])
    return out


def prompt_order(table: pd.DataFrame) -> list[Any]:
    """The split's prompt ids in the order devices are assigned them: sorted by id."""
    return sorted(pd.unique(table["prompt_id"]), key=str)


def bootstrap_prompts(prompts: Sequence[Any], replicate: int, seed: int) -> list[Any]:
    """Replicate ``replicate``'s prompt list: the split itself for 0, else P prompts drawn with
    replacement (generator seeded by ``seed`` and the replicate, the same for every method)."""
    if replicate == 0:
        return list(prompts)
    rng = numpy_rng(seed, "multidevice-prompts", int(replicate))
    return [prompts[int(i)] for i in rng.integers(0, len(prompts), size=len(prompts))]


def device_channels(population: Sequence[str], devices: int) -> list[str]:
    """The channel of each of ``devices`` devices: ``population`` cycled (module docstring)."""
    if not population:
        raise ValueError("a population names at least one channel")
    return [population[d % len(population)] for d in range(devices)]


@dataclass(frozen=True)
class Replicate:
    """Replicate ``index`` of a method (module docstring): ``prompts`` the prompt list the
    devices are assigned from, ``decoded_seeds`` the CSI variants' decoded seeds (empty for a
    channel-blind method)."""

    index: int
    prompts: list[Any]
    decoded_seeds: tuple[int, ...] = ()

    def fading(self, device: int) -> tuple[int, int]:
        """(fading seed index, device stream) device ``device`` is priced on."""
        if self.decoded_seeds:
            k = len(self.decoded_seeds)
            return int(self.decoded_seeds[(self.index + device) % k]), 0
        return int(self.index), int(device)

    def assignment(self, devices: int, prompts_per_device: int | None) -> list[list[Any]]:
        """Per device, the prompt ids it decodes, in order."""
        return [
            [self.prompts[i] for i in order]
            for order in device_prompts(len(self.prompts), devices, prompts_per_device)
        ]


def replicates(
    prompts: Sequence[Any], count: int, seed: int, decoded_seeds: Sequence[int] = ()
) -> list[Replicate]:
    """The ``count`` replicates of a method (module docstring)."""
    if int(count) < 1:
        raise ValueError(f"need at least one replicate, got {count}")
    return [
        Replicate(
            r, bootstrap_prompts(list(prompts), r, seed), tuple(int(s) for s in decoded_seeds)
        )
        for r in range(int(count))
    ]


def profile_rng(seed: int, replicate: int) -> np.random.Generator:
    """The generator of replicate ``replicate``'s batch-profile draw."""
    return numpy_rng(seed, "multidevice-profile", int(replicate))
