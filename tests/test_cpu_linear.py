"""CPU linear layers through oneDNN (edgespec.models.cpu_linear): float32 ones give the same
results as F.linear to float32 rounding, bf16 ones with reordered weights the same bits; only
where they apply, and undone for quantisation, copies and moves."""

from __future__ import annotations

import copy
import gc
from pathlib import Path

import pytest
import torch

from edgespec.models import cpu_linear
from edgespec.models.cpu_linear import (
    FusedProjections,
    OneDNNLinear,
    linear,
    onednn_available,
    own_storage,
    pack_weight,
    packing_supported,
    plain_linear,
    plain_parameters,
    reorder_all_weights,
    use_onednn_linear,
)
from edgespec.models.tiny import build_tiny_model

pytestmark = pytest.mark.skipif(not onednn_available(), reason="PyTorch built without oneDNN")


@pytest.mark.parametrize("shape", [(1, 24), (3, 24), (16, 24), (2, 5, 24)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_equals_f_linear_to_float32_rounding(shape, with_bias):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen)
    weight = torch.randn(40, 24, generator=gen)
    bias = torch.randn(40, generator=gen) if with_bias else None
    exact = torch.nn.functional.linear(
        x.double(), weight.double(), None if bias is None else bias.double()
    )
    with torch.inference_mode():
        out = linear(x, weight, bias)
    assert out.shape == (*shape[:-1], 40) and out.dtype is torch.float32
    assert torch.allclose(out.double(), exact, rtol=1e-5, atol=1e-5)


def test_linear_takes_onednn_only_for_float32_cpu_inference(monkeypatch):
    calls = []
    real = torch.ops.mkldnn._linear_pointwise

    class Spy:
        def _linear_pointwise(self, *args):
            calls.append(args[0].dtype)
            return real(*args)

    monkeypatch.setattr(cpu_linear.torch.ops, "mkldnn", Spy())
    x, weight = torch.randn(3, 8), torch.randn(5, 8)
    with torch.inference_mode():
        linear(x, weight)
        linear(x.bfloat16(), weight.bfloat16())
    assert calls == [torch.float32]
    grad_weight = weight.clone().requires_grad_()
    out = linear(x, grad_weight)  # training keeps autograd's F.linear
    out.sum().backward()
    assert calls == [torch.float32] and grad_weight.grad is not None


def test_a_float32_model_keeps_its_outputs_and_greedy_tokens():
    reference = build_tiny_model(vocab_size=61, seed=0, hidden_size=64)
    routed = build_tiny_model(vocab_size=61, seed=0, hidden_size=64)
    changed = use_onednn_linear(routed)
    assert changed == sum(isinstance(m, torch.nn.Linear) for m in reference.modules()) > 0
    assert all(type(m) is not torch.nn.Linear for m in routed.modules())
    ids = torch.tensor([[3, 17, 29, 5], [40, 2, 11, 58]])
    with torch.inference_mode():
        assert torch.allclose(routed(ids).logits, reference(ids).logits, atol=1e-5)
        kwargs = {"max_new_tokens": 8, "do_sample": False, "pad_token_id": 0}
        assert torch.equal(routed.generate(ids, **kwargs), reference.generate(ids, **kwargs))


def test_other_models_are_left_alone():
    fp16 = build_tiny_model(vocab_size=61, seed=0).to(torch.float16)
    assert use_onednn_linear(fp16) == 0
    assert not any(type(m) is OneDNNLinear for m in fp16.modules())
    assert not packing_supported(torch.float32)  # float32 weights keep their layout
    weight = torch.randn(5, 8)
    assert pack_weight(weight) is weight


def test_bf16_where_weights_cannot_be_reordered_is_left_alone(monkeypatch):
    monkeypatch.setattr(cpu_linear, "packing_supported", lambda dtype: False)
    bf16 = build_tiny_model(vocab_size=61, seed=0).to(torch.bfloat16)
    assert use_onednn_linear(bf16) == 0
    assert not any(type(m) is OneDNNLinear for m in bf16.modules())


needs_bf16_packing = pytest.mark.skipif(
    not packing_supported(torch.bfloat16), reason="this CPU cannot reorder bf16 weights"
)


def _bf16_pair():
    plain = build_tiny_model(vocab_size=61, seed=0, hidden_size=64).to(torch.bfloat16)
    packed = build_tiny_model(vocab_size=61, seed=0, hidden_size=64).to(torch.bfloat16)
    return plain, packed


@needs_bf16_packing
@pytest.mark.parametrize("shape", [(1, 24), (5, 24), (2, 5, 24)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_a_reordered_bf16_weight_gives_f_linears_bits(shape, with_bias):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen).bfloat16()
    weight = torch.randn(40, 24, generator=gen).bfloat16()
    bias = torch.randn(40, generator=gen).bfloat16() if with_bias else None
    packed = pack_weight(weight)
    assert packed.is_mkldnn and packed.shape == weight.shape
    with torch.inference_mode():
        assert torch.equal(linear(x, packed, bias), torch.nn.functional.linear(x, weight, bias))


@needs_bf16_packing
def test_bf16_weights_reordered_once_give_the_same_bits():
    plain, packed = _bf16_pair()
    changed = use_onednn_linear(packed)
    assert changed == sum(type(m) is torch.nn.Linear for m in plain.modules()) > 0
    # Query/key/value and gate/up are stacked into one product each (fuse_projections).
    layers = [m for m in packed.modules() if isinstance(m, OneDNNLinear)]
    stacked = [m for m in layers if isinstance(m, FusedProjections)]
    assert len(stacked) == 2 * len(packed.model.layers)
    assert len(layers) - len(stacked) + sum(len(m.members) for m in stacked) == changed
    assert all(m.weight.is_mkldnn for m in layers)
    # The tied output embedding got its own reordered copy; the input embedding stays plain.
    assert packed.lm_head.weight.is_mkldnn and not packed.model.embed_tokens.weight.is_mkldnn
    ids = torch.tensor([[3, 17, 29, 5], [40, 2, 11, 58]])
    with torch.inference_mode():
        assert torch.equal(packed(ids).logits, plain(ids).logits)
        kwargs = {"max_new_tokens": 8, "do_sample": False, "pad_token_id": 0}
        assert torch.equal(packed.generate(ids, **kwargs), plain.generate(ids, **kwargs))


@needs_bf16_packing
def test_reordered_weights_copy_and_come_back_plain_bit_for_bit():
    plain, packed = _bf16_pair()
    use_onednn_linear(packed)
    ids = torch.tensor([[3, 17, 29, 5]])
    clone = copy.deepcopy(packed)
    assert clone.lm_head.weight is not packed.lm_head.weight and clone.lm_head.weight.is_mkldnn
    with torch.inference_mode():
        assert torch.equal(clone(ids).logits, plain(ids).logits)
    plain_linear(packed)
    assert not any(type(m) is OneDNNLinear for m in packed.modules())
    reference = plain_parameters(plain)
    for name, param in packed.named_parameters():
        assert not param.is_mkldnn and torch.equal(param, reference[name]), name
    as_float = packed.to(torch.float32)  # plain again, so it can change dtype (or device)
    with torch.inference_mode():
        assert torch.allclose(as_float(ids).logits, plain.float()(ids).logits)


def test_quantisation_sees_plain_linear_layers_again():
    from edgespec.models.precision import quantize_model

    model = build_tiny_model(vocab_size=61, seed=0, hidden_size=64)
    use_onednn_linear(model)
    quantized = quantize_model(model, "int8_dynamic")
    assert not any(type(m) in (torch.nn.Linear, OneDNNLinear) for m in quantized.modules())
    plain = build_tiny_model(vocab_size=61, seed=0)
    use_onednn_linear(plain)
    plain_linear(plain)
    assert not any(type(m) is OneDNNLinear for m in plain.modules())


def test_the_dtype_probe_times_the_route_the_models_take(monkeypatch):
    from edgespec.models.precision import time_products

    calls = []
    real = cpu_linear.linear
    monkeypatch.setattr(
        cpu_linear, "linear", lambda x, w, b=None: calls.append(x.dtype) or real(x, w, b)
    )
    time_products("float32", (2, 4), 32, 48, layers=2, repeats=1)
    assert calls and set(calls) == {torch.float32}
    weights = []
    monkeypatch.setattr(
        cpu_linear, "linear", lambda x, w, b=None: weights.append(w.is_mkldnn) or real(x, w, b)
    )
    time_products("bfloat16", (2,), 32, 48, layers=2, repeats=1)
    assert weights and set(weights) == {packing_supported(torch.bfloat16)}


def test_float32_weights_reordered_on_request_keep_outputs_and_greedy_tokens():
    reference = build_tiny_model(vocab_size=61, seed=0, hidden_size=64)
    routed = build_tiny_model(vocab_size=61, seed=0, hidden_size=64)
    use_onednn_linear(routed)
    layers = [m for m in routed.modules() if type(m) is OneDNNLinear]
    assert not any(m.weight.is_mkldnn for m in layers)  # the workflow's float32 layout: plain
    assert reorder_all_weights(routed) == len(layers) > 0
    assert all(m.weight.is_mkldnn for m in routed.modules() if isinstance(m, OneDNNLinear))
    ids = torch.tensor([[3, 17, 29, 5], [40, 2, 11, 58]])
    with torch.inference_mode():
        assert torch.allclose(routed(ids).logits, reference(ids).logits, atol=1e-5)
        kwargs = {"max_new_tokens": 8, "do_sample": False, "pad_token_id": 0}
        assert torch.equal(routed.generate(ids, **kwargs), reference.generate(ids, **kwargs))
    assert reorder_all_weights(routed) == 0


def test_reordered_weights_hold_no_view_of_the_checkpoint(tmp_path):
    """Loaded from safetensors and reordered, the tensors left plain (embeddings, norms,
    biases) are copies: no tensor keeps the memory-mapped file, so its pages are not held
    beside the reordered weights."""
    from edgespec.models.load import load_model

    maps = Path("/proc/self/maps")
    if not maps.exists():
        pytest.skip("needs /proc/self/maps (Linux)")
    build_tiny_model(vocab_size=61, seed=0, hidden_size=64).save_pretrained(tmp_path)
    checkpoint = str(tmp_path / "model.safetensors")
    model = load_model(tmp_path, "float32")
    reorder_all_weights(model)
    gc.collect()
    assert checkpoint not in maps.read_text()
    assert model.lm_head.weight.is_mkldnn and not model.model.embed_tokens.weight.is_mkldnn
    reference = build_tiny_model(vocab_size=61, seed=0, hidden_size=64)
    ids = torch.tensor([[3, 17, 29, 5]])
    with torch.inference_mode():
        assert torch.allclose(model(ids).logits, reference(ids).logits, atol=1e-5)


def test_own_storage_copies_every_plain_tensor_and_keeps_ties():
    model = build_tiny_model(vocab_size=61, seed=0)
    model.lm_head.weight = model.model.embed_tokens.weight  # tied, as the config says
    before = dict(model.state_dict(keep_vars=True))
    own_storage(model)
    after = model.state_dict(keep_vars=True)
    for name, tensor in after.items():
        assert tensor is not before[name] and torch.equal(tensor, before[name]), name
        assert tensor.untyped_storage().data_ptr() != before[name].untyped_storage().data_ptr()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert all(isinstance(p, torch.nn.Parameter) for p in model.parameters())
