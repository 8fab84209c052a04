"""Sibling projections stacked into one product (edgespec.models.cpu_linear): each slice gives its
own layer's output whatever the order of the calls, the model decodes as before, and the
separate layers come back bit for bit for copies, quantisation and inspection."""

from __future__ import annotations

import copy

import pytest
import torch

from edgespec.models.cpu_linear import (
    FusedProjections,
    OneDNNLinear,
    ProjectionSlice,
    fuse_projections,
    onednn_available,
    plain_linear,
    plain_parameters,
    reorder_all_weights,
    unfuse_projections,
    use_onednn_linear,
)
from edgespec.models.tiny import build_tiny_model

pytestmark = pytest.mark.skipif(not onednn_available(), reason="PyTorch built without oneDNN")

IDS = torch.tensor([[3, 17, 29, 5], [40, 2, 11, 58]])


def _stacked_model(num_layers: int = 2):
    """A float32 tiny model with every weight reordered, so its siblings are stacked (float32
    reorders on every oneDNN CPU; bf16 only where it is native)."""
    model = build_tiny_model(vocab_size=61, seed=0, hidden_size=64, num_layers=num_layers)
    use_onednn_linear(model)
    reorder_all_weights(model)
    return model


def _reference():
    return build_tiny_model(vocab_size=61, seed=0, hidden_size=64)


def test_siblings_are_stacked_once_per_group_and_the_model_decodes_as_before():
    model, reference = _stacked_model(), _reference()
    stacked = [m for m in model.modules() if isinstance(m, FusedProjections)]
    assert sorted(s.members for s in stacked) == sorted(
        [("gate_proj", "up_proj"), ("q_proj", "k_proj", "v_proj")] * 2
    )
    attention = model.model.layers[0].self_attn
    assert isinstance(attention.k_proj, ProjectionSlice)
    assert attention.k_proj.fused is attention.qkv_proj
    assert attention.qkv_proj.weight.is_mkldnn and attention.qkv_proj.bias.shape == (128,)
    assert fuse_projections(model) == 0  # already stacked
    with torch.inference_mode():
        assert torch.allclose(model(IDS).logits, reference(IDS).logits, atol=1e-5)
        kwargs = {"max_new_tokens": 8, "do_sample": False, "pad_token_id": 0}
        assert torch.equal(model.generate(IDS, **kwargs), reference.generate(IDS, **kwargs))


def test_each_slice_gives_its_own_layers_output_in_any_call_order():
    model, reference = _stacked_model(), _reference()
    got, ref = model.model.layers[1].self_attn, reference.model.layers[1].self_attn
    gen = torch.Generator().manual_seed(3)
    x, y = torch.randn(2, 5, 64, generator=gen), torch.randn(2, 5, 64, generator=gen)

    def close(a, b):
        return torch.allclose(a, b, rtol=1e-5, atol=1e-5)

    with torch.inference_mode():
        # Out of order, and another input in between: each call answers for its own input.
        assert close(got.v_proj(x), ref.v_proj(x))
        assert close(got.q_proj(y), ref.q_proj(y))
        assert close(got.k_proj(x), ref.k_proj(x))
        assert close(got.q_proj(x), ref.q_proj(x))
        # Twice from one input: the second call computes again rather than finding nothing.
        assert close(got.k_proj(y), ref.k_proj(y))
        assert close(got.k_proj(y), ref.k_proj(y))
        # Another tensor while the stash still holds columns for x: computed for it afresh.
        z = x.clone()
        z[0, 0, 0] += 1.0
        assert close(got.v_proj(x), ref.v_proj(x))
        assert close(got.v_proj(z), ref.v_proj(z))
    # Once every slice has taken its columns, nothing is held.
    with torch.inference_mode():
        for name in ("q_proj", "k_proj", "v_proj"):
            getattr(got, name)(x)
    assert got.qkv_proj.stash.input is None and got.qkv_proj.stash.outputs == []


def test_a_copy_has_its_own_stacked_layers_and_stash():
    model, reference = _stacked_model(), _reference()
    clone = copy.deepcopy(model)
    original, copied = model.model.layers[0].mlp, clone.model.layers[0].mlp
    assert copied.gate_proj.fused is copied.gate_up_proj is not original.gate_up_proj
    assert copied.gate_up_proj.stash is not original.gate_up_proj.stash
    x = torch.randn(1, 3, 64, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        copied.gate_proj(x)  # leaves the copy's up columns waiting
        assert original.gate_up_proj.stash.input is None
        assert torch.allclose(clone(IDS).logits, reference(IDS).logits, atol=1e-5)


def test_separate_layers_come_back_bit_for_bit():
    model, reference = _stacked_model(), _reference()
    expected = {name: p.detach() for name, p in reference.named_parameters(remove_duplicate=False)}
    inspected = plain_parameters(model)  # still stacked: listed under the separate names
    assert set(inspected) == set(expected)
    for name, tensor in inspected.items():
        assert torch.equal(tensor, expected[name]), name
    assert unfuse_projections(model) == 4
    assert not any(isinstance(m, (FusedProjections, ProjectionSlice)) for m in model.modules())
    attention = model.model.layers[0].self_attn
    assert type(attention.q_proj) is OneDNNLinear and attention.q_proj.weight.is_mkldnn
    plain_linear(model)
    names = [name for name, _ in model.named_parameters(remove_duplicate=False)]
    assert names == list(expected)  # in the same order too
    for name, param in model.named_parameters():
        assert not param.is_mkldnn and torch.equal(param, expected[name]), name


def test_plain_linear_splits_stacked_layers_for_quantisation():
    from edgespec.models.precision import quantize_model

    quantized = quantize_model(_stacked_model(), "int8_dynamic")
    kinds = {type(m) for m in quantized.modules()}
    assert not kinds & {torch.nn.Linear, OneDNNLinear, FusedProjections, ProjectionSlice}
    with torch.inference_mode():
        assert quantized(IDS).logits.shape == (2, 4, 61)


def test_plain_float32_weights_are_not_stacked():
    model = build_tiny_model(vocab_size=61, seed=0, hidden_size=64)
    use_onednn_linear(model)  # float32 keeps its plain layout: stacking would only copy it
    assert not any(isinstance(m, FusedProjections) for m in model.modules())
    assert fuse_projections(model) == 0


def test_groups_that_differ_are_left_separate():
    model = build_tiny_model(vocab_size=61, seed=0, hidden_size=64)
    use_onednn_linear(model)
    layers = model.model.layers
    layers[0].self_attn.k_proj.bias = None  # q and v have biases, k has none
    del layers[1].mlp.up_proj  # a gate without its sibling
    assert reorder_all_weights(model) > 0
    stacked = {
        name.rpartition(".")[2]
        for name, m in model.named_modules()
        if isinstance(m, FusedProjections)
    }
    assert stacked == {"qkv_proj", "gate_up_proj"}
    assert isinstance(layers[0].self_attn.q_proj, OneDNNLinear)
    assert isinstance(layers[1].self_attn.q_proj, ProjectionSlice)
    assert isinstance(layers[0].mlp.gate_proj, ProjectionSlice)
    assert isinstance(layers[1].mlp.gate_proj, OneDNNLinear)


def test_the_models_forward_computes_each_stacked_product_once(monkeypatch):
    """The gain rests on the model's forward passing one tensor to all siblings: were they
    called with different tensors, each slice would compute the whole stacked product."""
    model = _stacked_model()
    calls = []
    real = FusedProjections.forward
    monkeypatch.setattr(
        FusedProjections, "forward", lambda self, x: calls.append(self.members) or real(self, x)
    )
    with torch.inference_mode():
        model(IDS)
    assert len(calls) == 4  # two layers, each one query/key/value and one gate/up product
