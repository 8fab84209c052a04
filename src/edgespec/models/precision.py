"""Which weight dtype decodes fastest on this machine (``models.dtype: auto``).

Decoding on a CPU is bound by matrix products whose speed in bfloat16 depends on the
instruction set, not only on the bytes moved:

- CPUs with native bf16 arithmetic (AVX-512 BF16, AMX) and CUDA GPUs run bf16 faster than
  float32 at every batch size (half the bytes, native dot products): they take bfloat16.
- Other CPUs (AVX2, plain AVX-512) emulate bf16 products by widening to float32. bf16 can
  still win on one row (memory-bound, half the bytes) and lose 2-4x on a batch of 16
  (compute-bound); measured on a 2-core AMD EPYC with AVX2 only, Qwen2.5-Coder-1.5B: 4.5
  against 2.2 tokens/s at 1 x 1, 6.2 against 11.7 at 16 x 1. So the choice there is a short
  timed probe of both dtypes on products of the target's own shapes at the workflow's
  decoding shapes (``batch_size`` rows x 1 token and x gamma + 1 tokens), about a second.

An explicit ``models.dtype`` always wins. The choice and its measured reason are written to
the run's precision record (rule ``select_dtype``), which every model stage reads.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

NATIVE_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
"""/proc/cpuinfo flags of CPUs with bf16 arithmetic in hardware."""

CHOICES = ("float32", "bfloat16")
"""The dtypes ``auto`` chooses between (float16 is slow on CPUs and not offered)."""


@dataclass
class DtypeChoice:
    """The dtype a run decodes in, why, and the probe timings (seconds) where one ran."""

    dtype: str
    reason: str
    setting: str
    probe_s: dict[str, float] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> set[str]:
    """The CPU feature flags the kernel reports (empty where /proc/cpuinfo does not exist)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


def machine_summary(flags: set[str] | None = None) -> dict[str, Any]:
    """Processor, core count and the SIMD features that matter for the dtype choice."""
    flags = cpu_flags() if flags is None else flags
    simd = sorted(f for f in flags if f.startswith(("avx", "amx", "fma", "sse4")))
    return {
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "simd": simd,
    }


ONEDNN_ISAS_WITHOUT_BF16 = (
    "SSE41",
    "AVX",
    "AVX2",
    "AVX2_VNNI",
    "AVX2_VNNI_2",
    "AVX512_CORE",
    "AVX512_CORE_VNNI",
)
"""Values of ONEDNN_MAX_CPU_ISA that keep oneDNN (torch's CPU matmuls) off bf16 instructions."""


def native_bf16(device: str, flags: set[str], environ: dict | None = None) -> str | None:
    """Why bf16 is native here (a sentence), or None where it would be emulated.

    A CPU with the instructions still emulates bf16 when ``ONEDNN_MAX_CPU_ISA`` caps oneDNN
    below AVX512_CORE_BF16 (which is also how an AVX2-only machine can be emulated).
    """
    if device.startswith("cuda"):
        return "CUDA device: bf16 runs natively on the GPU"
    environ = os.environ if environ is None else environ
    cap = environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    if cap in ONEDNN_ISAS_WITHOUT_BF16:
        return None
    have = [f for f in NATIVE_BF16_CPU_FLAGS if f in flags]
    if have:
        return f"CPU has native bf16 arithmetic ({', '.join(have)})"
    return None


def time_products(
    dtype: str,
    rows: Sequence[int],
    in_features: int,
    out_features: int,
    layers: int = 4,
    repeats: int = 3,
    layout: str = "plain",
) -> float:
    """Seconds for ``x @ W.T`` through ``layers`` distinct [out, in] weights (more than the
    caches hold), summed over the row counts ``rows``; median of ``repeats`` after a warm-up.
    The products take the route the loaded models' linear layers take (weights reordered where
    they would be, or stored transposed for ``layout`` transposed, then
    ``edgespec.models.cpu_linear.linear``)."""
    return median_seconds(
        product_workload(dtype, rows, in_features, out_features, layers, layout), repeats
    )


def product_workload(
    dtype: str,
    rows: Sequence[int],
    in_features: int,
    out_features: int,
    layers: int = 4,
    layout: str = "plain",
) -> Callable[[], None]:
    """The products :func:`time_products` times, as a call: its weights are made once."""
    import torch

    from edgespec.models.cpu_linear import linear, pack_weight, transposed_weight

    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    torch_dtype = getattr(torch, dtype)
    store = transposed_weight if layout == "transposed" else pack_weight
    gen = torch.Generator().manual_seed(0)
    weights = [
        store((torch.randn(out_features, in_features, generator=gen) * 0.02).to(torch_dtype))
        for _ in range(layers)
    ]
    inputs = [torch.randn(m, in_features, generator=gen).to(torch_dtype) for m in rows]

    def run() -> None:
        with torch.inference_mode():
            for x in inputs:
                for w in weights:
                    linear(x, w)

    return run


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Median wall seconds of ``repeats`` calls of ``fn`` after one untimed warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


Prober = Callable[[str], float]
"""A dtype (or layout) name -> seconds of the probe workload in that dtype (or layout)."""


def choose_dtype(
    setting: str,
    device: str,
    hidden_size: int,
    intermediate_size: int,
    batch_size: int,
    gamma: int,
    flags: set[str] | None = None,
    prober: Prober | None = None,
    environ: dict | None = None,
    quantize: str = "none",
) -> DtypeChoice:
    """The decoding dtype for ``setting`` (``models.dtype``: auto or an explicit dtype).

    ``auto``: bfloat16 where bf16 is native (:func:`native_bf16`), else whichever of float32
    and bfloat16 runs the probe faster: products of the target's MLP shape
    (``hidden_size`` -> ``intermediate_size``) at ``batch_size`` rows x 1 token and x
    ``gamma + 1`` tokens (``prober`` replaces the timing in tests).
    """
    flags = cpu_flags() if flags is None else flags
    environ = os.environ if environ is None else environ
    machine = {
        **machine_summary(flags),
        "device": device,
        "onednn_max_cpu_isa": environ.get("ONEDNN_MAX_CPU_ISA"),
    }
    if "target" in quantized_roles(quantize):
        if setting not in ("auto", "float32"):
            raise ValueError(
                f"models.quantize: {quantize} runs on float32 weights, but models.dtype is "
                f"{setting}; set models.dtype to auto or float32"
            )
        return DtypeChoice(
            "float32",
            f"models.quantize {quantize} quantises float32 weights",
            setting,
            machine=machine,
        )
    if setting != "auto":
        return DtypeChoice(setting, "configured (models.dtype)", setting, machine=machine)
    native = native_bf16(device, flags, environ)
    if native is not None:
        return DtypeChoice("bfloat16", native, setting, machine=machine)
    rows = (int(batch_size), int(batch_size) * (int(gamma) + 1))
    if prober is None:

        def prober(dtype: str) -> float:
            return time_products(dtype, rows, int(hidden_size), int(intermediate_size))

    probe = {dtype: float(prober(dtype)) for dtype in CHOICES}
    best = min(CHOICES, key=lambda d: probe[d])
    other = next(d for d in CHOICES if d != best)
    reason = (
        f"no native bf16 on this CPU; timed probe at {rows[0]} and {rows[1]} rows x "
        f"{hidden_size}->{intermediate_size}: {best} {probe[best]:.3f} s against {other} "
        f"{probe[other]:.3f} s ({probe[other] / max(probe[best], 1e-12):.1f}x slower)"
    )
    return DtypeChoice(best, reason, setting, probe_s=probe, machine=machine)


LAYOUTS = ("plain", "transposed")
"""How float32 linear weights are stored for a run's model jobs: as the checkpoint stores them
([out, in], multiplied through oneDNN) or transposed ([in, out], multiplied by numpy's BLAS;
``edgespec.models.cpu_linear``, ``edgespec.models.layout``)."""

TRANSPOSED_MIN_GAIN = 0.03
"""The transposed layout is chosen only where its probe takes at most 1 - this of the plain
one's: it costs a copy of the weights on disk and in the page cache, which a gain within timing
noise does not pay for. On the AVX2 EPYC the probe's products gained 9-16% per row count (one
thread) and whole decode jobs 12-14%, so a margin near those would make the choice flip from
one run to the next (a probe of 0.90x and one of 0.83x, the same machine an hour apart)."""

LAYOUT_PROBE_ROUNDS = 5
"""Rounds of the layout probe, each timing both layouts once in alternating order; the choice
takes the median of the rounds' ratios. The VM's speed drifts within seconds: one product timed
for eight fresh sets of weights in a row took 47-51 ms four times, then 39-42 ms four times, and
four probes of one layout after the other in one process gave 0.74x, 0.75x, 1.06x and 0.86x
(a cold run's one probe gave 1.02x and kept the weights plain), so the two layouts are timed
side by side, round after round, and no one round decides."""


@dataclass
class LayoutChoice:
    """How a run stores its float32 linear weights, why, and the probe timings (seconds)."""

    layout: str
    reason: str
    probe_s: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def choose_linear_layout(
    dtype: str,
    device: str,
    hidden_size: int,
    intermediate_size: int,
    batch_size: int,
    gamma: int,
    quantize: str = "none",
    prober: Callable[[str], float] | None = None,
) -> LayoutChoice:
    """The layout of the float32 linear weights (:data:`LAYOUTS`): plain unless the run decodes
    in float32 on the CPU with a model left unquantised and the timed probe finds transposed
    weights faster by :data:`TRANSPOSED_MIN_GAIN`. The probe multiplies by the target's MLP
    weights in both directions (``hidden_size`` -> ``intermediate_size`` and back) at
    ``batch_size`` rows x 1 and x ``gamma + 1`` tokens and one row, with the threads set for
    the model jobs. The layouts are timed in :data:`LAYOUT_PROBE_ROUNDS` interleaved rounds and
    the median of the rounds' ratios decides (``prober``, layout -> seconds of one timing,
    replaces the timing in tests)."""
    if dtype != "float32" or not str(device).startswith("cpu"):
        return LayoutChoice("plain", f"{dtype} on {device}: weights as stored")
    if len(quantized_roles(quantize)) == 2:
        return LayoutChoice("plain", f"models.quantize {quantize}: no float32 linear layer")
    rows = (1, int(batch_size), int(batch_size) * (int(gamma) + 1))
    if prober is None:
        prober = _layout_prober(rows, int(hidden_size), int(intermediate_size))
    rounds = []
    for index in range(LAYOUT_PROBE_ROUNDS):
        order = LAYOUTS if index % 2 == 0 else LAYOUTS[::-1]
        rounds.append({layout: float(prober(layout)) for layout in order})
    ratios = sorted(r["transposed"] / max(r["plain"], 1e-12) for r in rounds)
    ratio = statistics.median(ratios)
    probe = {layout: statistics.median(r[layout] for r in rounds) for layout in LAYOUTS}
    layout = "transposed" if ratio <= 1.0 - TRANSPOSED_MIN_GAIN else "plain"
    reason = (
        f"timed probe at {', '.join(map(str, rows))} rows x {hidden_size}<->"
        f"{intermediate_size}, {len(rounds)} interleaved rounds: oneDNN on the stored weights "
        f"{probe['plain']:.3f} s, numpy's BLAS on transposed weights {probe['transposed']:.3f} s "
        f"(median ratio {ratio:.2f}x, rounds {ratios[0]:.2f}x to {ratios[-1]:.2f}x)"
    )
    return LayoutChoice(layout, reason, probe)


def _layout_prober(rows: Sequence[int], hidden: int, intermediate: int) -> Prober:
    """layout -> seconds of one timing of the MLP products in that layout, both directions; each
    layout's weights are made, and warmed up, on its first timing."""
    workloads: dict[str, Callable[[], None]] = {}

    def prober(layout: str) -> float:
        if layout not in workloads:
            up = product_workload("float32", rows, hidden, intermediate, layout=layout)
            down = product_workload("float32", rows, intermediate, hidden, layout=layout)

            def both() -> None:
                up()
                down()

            both()
            workloads[layout] = both
        start = time.perf_counter()
        workloads[layout]()
        return time.perf_counter() - start

    return prober


QUANTIZE_MODES = ("none", "int8_dynamic", "int8_dynamic_draft")
"""``models.quantize``: none; int8 dynamic quantisation of every linear layer of both models
(int8_dynamic) or of the draft alone (int8_dynamic_draft): per-channel weight scales,
activations quantised on the fly, fbgemm/x86 kernels. Opt-in: it changes the quantised models,
and :func:`quantization_fidelity` measures by how much. A quantised draft leaves speculative
decoding's output the target's; it changes the draft's proposals, and so acceptance and every
draft-side signal (CU-HLM's uncertainty, WISV's hidden states)."""

QUANTIZED_ROLES = {
    "none": (),
    "int8_dynamic": ("draft", "target"),
    "int8_dynamic_draft": ("draft",),
}
"""``models.quantize`` mode -> the models it quantises."""


def quantized_roles(mode: str) -> tuple[str, ...]:
    """The models (draft, target) that ``models.quantize`` ``mode`` quantises."""
    if mode not in QUANTIZED_ROLES:
        raise ValueError(f"models.quantize must be one of {QUANTIZE_MODES}, got {mode!r}")
    return QUANTIZED_ROLES[mode]


def weights_dtype(role: str, mode: str, dtype: str) -> str:
    """The dtype ``role``'s weights load in: float32 where ``mode`` quantises it (int8 dynamic
    quantisation starts from float32 weights), else the run's ``dtype``."""
    return "float32" if role in quantized_roles(mode) else dtype


def quantize_for_role(model, role: str, mode: str):
    """``model`` int8 dynamic-quantised where ``models.quantize`` ``mode`` quantises ``role``
    (draft or target), else unchanged."""
    return quantize_model(model, "int8_dynamic" if role in quantized_roles(mode) else "none")


def quantize_model(model, scheme: str):
    """``model`` with its linear layers replaced, in place, by int8 dynamic-quantised ones
    (``scheme`` int8_dynamic), or unchanged (none); a caller that still needs the float model
    quantises a copy. Needs float32 weights and a CPU. Which models a run quantises is
    :func:`quantize_for_role`'s business."""
    if scheme == "none":
        return model
    if scheme != "int8_dynamic":
        raise ValueError(f"quantisation scheme must be none or int8_dynamic, got {scheme!r}")
    import torch
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    param = next(model.parameters())
    if param.dtype != torch.float32 or param.device.type != "cpu":
        raise ValueError(
            "models.quantize: int8 dynamic quantisation needs float32 weights on the CPU "
            f"(got {param.dtype} on {param.device}); set models.dtype to float32 or auto"
        )
    from edgespec.models.cpu_linear import plain_linear

    plain_linear(model)  # quantize_dynamic maps layers by their exact class
    return quantize_dynamic(
        model, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8, inplace=True
    ).eval()


def stepped_logits(model, prompt: Sequence[int], tokens: Sequence[int]):
    """``model``'s next-token logits after ``prompt`` and after each of ``tokens``
    ([len(tokens) + 1, V]), computed as decoding does: the prompt in one forward, then one token
    per forward with the KV cache. For a dynamically quantised model this is not the same as
    one forward over the whole sequence, which scales every token's activations together."""
    import torch

    device = next(model.parameters()).device
    out = model(input_ids=torch.tensor([list(prompt)], device=device), use_cache=True)
    rows = [out.logits[0, -1:].cpu()]
    for token in tokens:
        out = model(
            input_ids=torch.tensor([[int(token)]], device=device),
            past_key_values=out.past_key_values,
            use_cache=True,
        )
        rows.append(out.logits[0, -1:].cpu())
    return torch.cat(rows)


def quantization_fidelity(reference, quantized, prompts: Sequence[Sequence[int]], new_tokens: int):
    """How much quantisation changes the next-token distributions, on the reference's own
    greedy continuations of ``prompts``: top-1 agreement and the mean total variation between
    the two softmaxes at every continuation position. The quantised model reads the prompt in
    one forward and the continuation a token at a time, as it decodes: dynamic quantisation
    scales a forward's activations together, so one forward over the whole continuation would
    quantise every token more coarsely than decoding does."""
    import torch

    agree = total = 0
    tv_sum = 0.0
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([list(prompt)])
            continuation = reference.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new_tokens,
                do_sample=False,
            )
            positions = slice(len(prompt) - 1, continuation.shape[1] - 1)
            p = torch.softmax(reference(continuation).logits[0, positions].float(), -1)
            completion = continuation[0, len(prompt) : -1].tolist()
            q = torch.softmax(stepped_logits(quantized, prompt, completion).float(), -1)
            agree += int((p.argmax(-1) == q.argmax(-1)).sum())
            tv_sum += float(0.5 * (p - q).abs().sum(-1).sum())
            total += p.shape[0]
    return {
        "positions": total,
        "top1_agreement": agree / total if total else math.nan,
        "mean_tv": tv_sum / total if total else math.nan,
    }
