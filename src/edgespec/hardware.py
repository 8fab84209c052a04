"""Emulated latency profiles for stated hardware: memory bandwidth and model bytes per token
(methods §5, "papers' hardware"; the WISV testbed, :class:`WisvTestbed`); torch-free.

Decoding one token with batch 1 is memory-bound: every weight is read once per forward, so a
forward takes about (parameters x bytes per weight) / memory bandwidth (the roofline bound;
real kernels reach a fraction of the peak bandwidth, so this is the hardware at its best). The
profile puts the draft on a device-class SoC and the target on an edge-class GPU:

    tau_SLM = P_draft * b_w / BW_device          tau_LLM = P_target * b_w / BW_edge         [s]

and a verification forward over gamma + 1 tokens reads the weights once too, so
tau_LLM(gamma) = tau_LLM for the profiled gammas. The device's per-token vocabulary work is
charged as passes over the |V| logits (``logit_bytes`` each) at the device's bandwidth:
M passes for the uncertainty estimate (one per perturbed sample), ceil(log2 |V|) + 3 for the
online k(t) selection (a sort, a prefix sum, a search and a comparison) and one for a top-k
extraction.

Defaults (config ``latency.paper_hardware``) name the papers' setting: TinyLlama-1.1B (draft)
and Llama-2-7B (target) in fp16 (2 bytes per weight) on an NVIDIA Jetson AGX Orin-class SoC
(LPDDR5, 204.8 GB/s) and an A100-class GPU (40 GB HBM2, 1,555 GB/s), NVIDIA's published
figures; they give tau_SLM = 10.7 ms and tau_LLM = 8.7 ms.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from edgespec import checks
from edgespec.wireless.delay import LatencyProfile

PAPER_HARDWARE_SOURCE = "paper_hardware"


@dataclass(frozen=True)
class HardwareSpec:
    """Stated figures of a device/edge pair: bandwidths [GB/s, 1e9 bytes], model parameter
    counts, bytes per weight and per logit, and names for captions."""

    device_name: str
    device_bandwidth_gb_s: float
    edge_name: str
    edge_bandwidth_gb_s: float
    draft_params: float
    target_params: float
    bytes_per_weight: float = 2.0
    logit_bytes: float = 4.0

    def __post_init__(self) -> None:
        for key in (
            "device_bandwidth_gb_s",
            "edge_bandwidth_gb_s",
            "draft_params",
            "target_params",
            "bytes_per_weight",
            "logit_bytes",
        ):
            value = checks.positive_number(f"hardware figure {key}", getattr(self, key))
            object.__setattr__(self, key, value)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> HardwareSpec:
        """From config ``latency.paper_hardware`` (its ``enabled`` key is ignored here)."""
        known = {f for f in cls.__dataclass_fields__}
        fields = {k: v for k, v in d.items() if k != "enabled"}
        unknown = sorted(set(fields) - known)
        if unknown:
            raise ValueError(f"latency.paper_hardware: unknown key(s) {unknown}")
        return cls(**fields)


def roofline_profile(
    spec: HardwareSpec,
    vocab_size: int,
    uncertainty_samples: int,
    gammas: Sequence[int] = (),
    source: str = PAPER_HARDWARE_SOURCE,
) -> tuple[LatencyProfile, dict[str, Any]]:
    """The memory-bound latency profile of ``spec`` (module docstring) and its derivation
    (inputs and each term, for the report)."""
    if vocab_size < 2 or uncertainty_samples < 0:
        raise ValueError("vocab_size must be >= 2 and uncertainty_samples >= 0")
    device_bps = spec.device_bandwidth_gb_s * 1e9
    edge_bps = spec.edge_bandwidth_gb_s * 1e9
    draft_bytes = spec.draft_params * spec.bytes_per_weight
    target_bytes = spec.target_params * spec.bytes_per_weight
    vocab_pass_s = vocab_size * spec.logit_bytes / device_bps
    sort_passes = math.ceil(math.log2(vocab_size)) + 3
    draft_s = draft_bytes / device_bps
    target_s = target_bytes / edge_bps
    profile = LatencyProfile(
        draft_token_s=draft_s,
        target_token_s=target_s,
        target_verify_s={int(g): target_s for g in gammas},
        uncertainty_s=uncertainty_samples * vocab_pass_s,
        online_k_s=sort_passes * vocab_pass_s,
        topk_s={1: vocab_pass_s},
        source=source,
    )
    derivation = {
        **asdict(spec),
        "draft_bytes": draft_bytes,
        "target_bytes": target_bytes,
        "vocab_size": vocab_size,
        "vocab_pass_s": vocab_pass_s,
        "uncertainty_passes": uncertainty_samples,
        "online_k_passes": sort_passes,
        "topk_passes": 1,
    }
    return profile, derivation


WISV_TESTBED_SOURCE = "wisv_testbed"


@dataclass(frozen=True)
class WisvTestbed:
    """The WISV paper's hardware testbed, emulated (config key ``wisv.testbed``): a
    device-class SoC drafting with Llama-3.2-1B and an edge-class GPU verifying with
    Llama-3.1-8B, their memory bandwidths [GB/s] and peak half-precision throughputs
    [TFLOP/s], the models' parameter counts, the draft's hidden size and the vocabulary the
    uplink carries. Defaults: NVIDIA's published figures for a Jetson AGX Orin 64GB (LPDDR5,
    204.8 GB/s; 42.5 dense FP16 TFLOP/s) and an A40 (GDDR6, 696 GB/s; 149.7 dense FP16 tensor
    TFLOP/s); Meta's model cards (1.24e9 and 8.03e9 parameters, hidden size 2048, 128,256-token
    vocabulary)."""

    device_name: str = "Jetson AGX Orin-class SoC (LPDDR5)"
    device_bandwidth_gb_s: float = 204.8
    device_tflops: float = 42.5
    edge_name: str = "A40-class GPU (GDDR6)"
    edge_bandwidth_gb_s: float = 696.0
    edge_tflops: float = 149.7
    draft_params: float = 1.24e9
    target_params: float = 8.03e9
    bytes_per_weight: float = 2.0
    draft_hidden_size: int = 2048
    target_hidden_size: int = 4096
    vocab_size: int = 128256

    def __post_init__(self) -> None:
        for key in (
            "device_bandwidth_gb_s",
            "device_tflops",
            "edge_bandwidth_gb_s",
            "edge_tflops",
            "draft_params",
            "target_params",
            "bytes_per_weight",
            "draft_hidden_size",
            "target_hidden_size",
            "vocab_size",
        ):
            value = getattr(self, key)
            if isinstance(value, bool) or not (
                isinstance(value, int | float) and math.isfinite(value) and value > 0
            ):
                raise ValueError(f"wisv.testbed.{key} must be a finite number > 0, got {value!r}")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> WisvTestbed:
        """From config key ``wisv.testbed`` (None: the defaults)."""
        fields = dict(d or {})
        unknown = sorted(set(fields) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"wisv.testbed: unknown key(s) {unknown}")
        return cls(**fields)

    def hardware(self) -> HardwareSpec:
        """The memory-bandwidth part as a :class:`HardwareSpec` (for :func:`roofline_profile`)."""
        return HardwareSpec(
            self.device_name,
            self.device_bandwidth_gb_s,
            self.edge_name,
            self.edge_bandwidth_gb_s,
            self.draft_params,
            self.target_params,
            self.bytes_per_weight,
        )

    def profile(self, gammas: Sequence[int]) -> tuple[LatencyProfile, dict[str, Any]]:
        """The testbed's latency profile and its derivation: tau_SLM and tau_LLM(gamma) from
        the memory-bound roofline (:func:`roofline_profile`: one pass over the weights per
        forward, a verification of gamma + 1 tokens too), and the prompt prefill per token
        compute-bound, 2 P / peak FLOP/s on each side (the hardware at its best)."""
        base, derivation = roofline_profile(
            self.hardware(), self.vocab_size, 0, gammas, source=WISV_TESTBED_SOURCE
        )
        draft_prefill = 2.0 * self.draft_params / (self.device_tflops * 1e12)
        target_prefill = 2.0 * self.target_params / (self.edge_tflops * 1e12)
        profile = LatencyProfile(
            draft_token_s=base.draft_token_s,
            target_token_s=base.target_token_s,
            target_verify_s=dict(base.target_verify_s),
            source=WISV_TESTBED_SOURCE,
            draft_prefill_token_s=draft_prefill,
            target_prefill_token_s=target_prefill,
        )
        derivation = {**asdict(self), "draft_prefill_token_s": draft_prefill}
        derivation["target_prefill_token_s"] = target_prefill
        return profile, derivation

    def head_round_s(self, d_csi: int, hidden: int) -> float:
        """A decision head's time per round on the edge [s], memory-bound: its float32
        weights read once (one layer of d_in x max(hidden, 1), plus hidden x 1), d_in the two
        hidden sizes and ``d_csi`` CSI features."""
        d_in = self.draft_hidden_size + self.target_hidden_size + d_csi
        params = d_in * max(hidden, 1) + (hidden + 1 if hidden else 1)
        return params * 4.0 / (self.edge_bandwidth_gb_s * 1e9)
