"""An emulated latency profile for stated hardware: memory bandwidth and model bytes per token
(methods §5, "papers' hardware"); torch-free.

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
