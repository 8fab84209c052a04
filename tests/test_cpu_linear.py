"""float32 CPU linear layers through oneDNN (edgespec.models.cpu_linear): same results as
F.linear to float32 rounding, only where they apply, and undone for quantisation."""

from __future__ import annotations

import pytest
import torch

from edgespec.models import cpu_linear
from edgespec.models.cpu_linear import (
    OneDNNLinear,
    linear,
    onednn_available,
    plain_linear,
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
    bf16 = build_tiny_model(vocab_size=61, seed=0).to(torch.bfloat16)
    assert use_onednn_linear(bf16) == 0
    assert not any(type(m) is OneDNNLinear for m in bf16.modules())


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
