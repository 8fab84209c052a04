"""Shared fixtures: tiny randomly initialised causal LMs built from a config (offline, seconds)."""

from __future__ import annotations

import pytest
import torch

from edgespec.decoding.cache import RaggedCachedModel
from edgespec.models.tiny import build_tiny_model


@pytest.fixture
def fed_tokens(monkeypatch):
    """The valid tokens of every forward through the ragged cache's one feed
    (``RaggedCachedModel.forward``: engine caches and branch batches) from now on, in order."""
    fed = []
    real_forward = RaggedCachedModel.forward

    def counting_forward(self, tokens, valid, logits_to_keep, output_hidden_states):
        fed.append(int(valid.sum()))
        return real_forward(self, tokens, valid, logits_to_keep, output_hidden_states)

    monkeypatch.setattr(RaggedCachedModel, "forward", counting_forward)
    return fed


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


@pytest.fixture(scope="session")
def tiny_draft_int8():
    """The close draft built in float32 and int8 dynamic-quantised (models.quantize
    int8_dynamic_draft): other kernels, another dtype than the float64 target."""
    from edgespec.models.precision import quantize_model

    float_draft = build_tiny_model(
        vocab_size=61, seed=0, dtype=torch.float32, perturb=0.05, perturb_seed=7
    )
    return quantize_model(float_draft, "int8_dynamic")


CACHE_CORPUS = ["def add(a, b):\n    return a + b", "x = [i * i for i in range(10)]", "print('hi')"]


@pytest.fixture()
def float32_cache(tmp_path):
    """A fetched tiny_random pair (stored in float32) in a model cache folder of its own."""
    from edgespec.models.pair import fetch_pair

    out = tmp_path / "cache" / "tiny_random"
    fetch_pair("tiny_random", out, corpus=CACHE_CORPUS, progress=False)
    return out
