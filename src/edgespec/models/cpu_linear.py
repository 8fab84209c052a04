"""float32 linear layers on the CPU through oneDNN's inner product instead of MKL's GEMM.

PyTorch computes a float32 ``F.linear`` on the CPU with a BLAS GEMM (MKL in the PyPI wheels)
and only bf16/fp16 products with oneDNN. On the 2-core AMD EPYC measured here the GEMM is
the slow one: oneDNN's inner product (``torch.ops.mkldnn._linear_pointwise``, the kernel
PyTorch's own compiler uses for CPU linear layers) gives the same float32 results, rounding
apart, 1.3-4.6x faster at decoding shapes. Medians of 30, 2 threads, Qwen2.5-Coder-1.5B's
shapes, ``F.linear`` against oneDNN in milliseconds:

- MLP up-projection 1536 -> 8960: 4.1 / 2.7 at 1 row, 13.7 / 3.3 at 3 rows, 13.7 / 5.2 at
  16 rows, 30.8 / 13.7 at 80 rows (a batch of 16 verifying 4 drafted tokens);
- LM head 1536 -> 151936: 69 / 31, 214 / 46, 226 / 76, 531 / 246.

Whole target forwards (1 new token per row after a 150-token cache, 2 threads) went
500 -> 299 ms at 1 row, 1368 -> 461 ms at 3 rows and 1089 -> 684 ms at 16 rows; with oneDNN
and MKL capped at AVX2 (an AVX2-only CPU emulated) the products gain alike. Against a
float64 product the largest relative error was 1.4e-6 (``F.linear``: 1.2e-6).

bf16 already goes through oneDNN, and GPUs and models that need gradients keep ``F.linear``.
"""

from __future__ import annotations

import functools

import torch


@functools.cache
def onednn_available() -> bool:
    """Whether this PyTorch build has oneDNN and its linear primitive (asked once: every
    routed layer's forward asks)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, through oneDNN for float32 CPU tensors without gradients."""
    if (
        x.dtype is torch.float32
        and x.device.type == "cpu"
        and weight.dtype is torch.float32
        and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
        and onednn_available()
    ):
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return torch.nn.functional.linear(x, weight, bias)


class OneDNNLinear(torch.nn.Linear):
    """``torch.nn.Linear`` whose float32 CPU inference goes through :func:`linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


def use_onednn_linear(model: torch.nn.Module) -> int:
    """Route every ``torch.nn.Linear`` of a float32 CPU ``model`` through oneDNN (in place,
    parameters untouched); other models are left as they are. Returns how many layers
    changed."""
    param = next(model.parameters(), None)
    if param is None or param.dtype is not torch.float32 or param.device.type != "cpu":
        return 0
    if not onednn_available():
        return 0
    changed = 0
    for module in model.modules():
        if type(module) is torch.nn.Linear:
            module.__class__ = OneDNNLinear
            changed += 1
    return changed


def plain_linear(model: torch.nn.Module) -> None:
    """Undo :func:`use_onednn_linear` (in place): tools that map layers by their exact class,
    such as dynamic quantisation, and moves to another device see ``torch.nn.Linear``."""
    for module in model.modules():
        if type(module) is OneDNNLinear:
            module.__class__ = torch.nn.Linear
