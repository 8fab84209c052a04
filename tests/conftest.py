"""Shared fixtures: tiny randomly initialised causal LMs built from a config (offline, seconds)."""

from __future__ import annotations

import pytest
import torch

from edgespec.models.tiny import build_tiny_model


@pytest.fixture(scope="session")
def tiny_target():
    return build_tiny_model(vocab_size=61, seed=0, dtype=torch.float64)


@pytest.fixture(scope="session")
def tiny_draft_independent():
    return build_tiny_model(vocab_size=61, seed=1, dtype=torch.float64, num_layers=1)


@pytest.fixture(scope="session")
def tiny_draft_close(tiny_target):
    """A draft that agrees with the target often but not always: the target's weights plus noise."""
    return build_tiny_model(
        vocab_size=61, seed=0, dtype=torch.float64, perturb=0.05, perturb_seed=7
    )
