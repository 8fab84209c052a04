"""Seeds for every random draw, derived from the one configured seed and a stage's name.

Each stage gets its own stream (so adding a dataset does not change another's draws), and the
same configuration always gives the same draws.
"""

from __future__ import annotations

import hashlib

import numpy as np


def derive_seed(base: int, *parts: object) -> int:
    """A 63-bit seed from ``base`` and a path of names, stable across runs and platforms."""
    text = "/".join([str(base), *map(str, parts)])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


def numpy_rng(base: int, *parts: object) -> np.random.Generator:
    return np.random.default_rng(derive_seed(base, *parts))


def torch_generator(base: int, *parts: object):
    """A seeded ``torch.Generator`` (torch is imported here so that torch-free stages stay so)."""
    import torch

    return torch.Generator().manual_seed(derive_seed(base, *parts))
