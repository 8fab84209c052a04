"""The two pricing regimes of the WISV study (methods §4.2, §5); torch-free.

Whether the channel can change what a repair costs depends on how a round's compute compares
with its communication. On a 2-core CPU a round's draft and target forwards take about half a
second and dwarf the uplink, so no label, head or decision can move with the channel; on the
paper's testbed (a Jetson AGX Orin-class device, an A40-class edge) a round's compute is tens
of milliseconds and the uplink of hidden states and the retransmissions are of the same order.
The study is therefore priced twice, each regime with its own relabeled labels, head, tau,
CSI-reading decodes and evaluation:

- ``measured``: the latency profile measured on this machine (rule profile_latency), the
  decision heads' measured time per round (rule profile_head) and the decoded pair's sizes
  (the draft's hidden size and the target's vocabulary) on the uplink;
- ``testbed``: the emulated testbed (``edgespec.hardware.WisvTestbed``: the memory-bound
  roofline for Llama-3.2-1B on the device and Llama-3.1-8B on the edge, their prefill at the
  stated peak FLOP/s, the heads' weights read once on the edge) and the paper's sizes on the
  uplink (hidden size 2048, 128,256-token vocabulary): the regime the paper's figures belong
  to.

Decoding itself (which tokens are accepted) does not depend on the regime, so the decodes of
the channel-blind variants that do not read a regime's head are shared and only re-priced.
:func:`regime_pricing` writes what every later stage reads of a regime (rule wisv_pricing's
``pricing.json``); :class:`Pricing` reads it back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from edgespec.hardware import WisvTestbed
from edgespec.wireless.delay import LatencyProfile
from edgespec.wisv.evaluate import protocol_params

REGIMES = ("measured", "testbed")
"""Every pricing regime, in report order (the first is the reference for shared decodes)."""

REGIME_TITLES = {
    "measured": "measured profile (this machine)",
    "testbed": "emulated testbed (the paper's hardware class)",
}


def check_regimes(regimes: Sequence[str]) -> list[str]:
    """The configured regimes (config key wisv.regimes) in ``REGIMES`` order, ``measured``
    always included (the multi-device study and the shared decodes use it); ValueError for an
    unknown one."""
    unknown = sorted(set(regimes) - set(REGIMES))
    if unknown:
        raise ValueError(f"config key 'wisv.regimes': unknown regime(s) {unknown}; known {REGIMES}")
    wanted = {"measured", *regimes}
    return [r for r in REGIMES if r in wanted]


@dataclass(frozen=True)
class Pricing:
    """What a regime prices with: its latency profile, the uplink's sizes (``protocol``:
    vocab_size, hidden_size of the draft, bits_per_value) and the decision heads' time per
    round (``head_times``: ``head_round_s`` by head key, its source and gamma)."""

    regime: str
    profile: LatencyProfile
    protocol: Mapping[str, int]
    head_times: Mapping[str, Any]
    description: str

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Pricing:
        """From :func:`regime_pricing`'s mapping (a ``pricing.json``)."""
        return cls(
            d["regime"],
            LatencyProfile.from_dict(d["profile"]),
            dict(d["protocol"]),
            dict(d["head_times"]),
            d["description"],
        )


def regime_pricing(
    regime: str,
    *,
    hidden_bits: int,
    gammas: Sequence[int],
    measured_profile: Mapping[str, Any] | None = None,
    head_times: Mapping[str, Any] | None = None,
    provenance: Mapping[str, Any] | None = None,
    testbed: Mapping[str, Any] | None = None,
    head_hidden: int = 0,
    csi_features: int = 0,
) -> dict[str, Any]:
    """Rule wisv_pricing: the JSON-ready pricing of ``regime`` (:class:`Pricing` reads it).

    ``measured``: ``measured_profile`` (rule profile_latency's profile.json), ``head_times``
    (rule profile_head's head.json) and the pair's sizes from ``provenance`` (rule
    fetch_models). ``testbed``: ``testbed`` (config key wisv.testbed,
    ``hardware.WisvTestbed``) at ``gammas`` (every priced gamma), its heads' times for heads of
    ``head_hidden`` hidden units (config key wisv.head.hidden) reading ``csi_features`` CSI
    features. ``hidden_bits`` (config key wisv.hidden_bits) per uploaded hidden value.
    """
    if regime == "measured":
        if measured_profile is None or head_times is None or provenance is None:
            raise ValueError("the measured regime needs the profile, head times and provenance")
        return {
            "regime": regime,
            "profile": LatencyProfile.from_dict(measured_profile).to_dict(),
            "protocol": protocol_params(provenance, int(hidden_bits)),
            "head_times": dict(head_times),
            "description": f"{REGIME_TITLES[regime]}: {provenance.get('preset')} pair",
        }
    if regime != "testbed":
        raise ValueError(f"unknown regime {regime!r}; known {REGIMES}")
    spec = WisvTestbed.from_dict(testbed)
    profile, derivation = spec.profile(sorted(set(int(g) for g in gammas)))
    heads = {
        "wisv_head": spec.head_round_s(csi_features, head_hidden),
        "no_csi_head": spec.head_round_s(0, head_hidden),
        "relabel_no_csi_head": spec.head_round_s(0, head_hidden),
    }
    return {
        "regime": regime,
        "profile": profile.to_dict(),
        "protocol": {
            "vocab_size": int(spec.vocab_size),
            "hidden_size": int(spec.draft_hidden_size),
            "bits_per_value": int(hidden_bits),
        },
        "head_times": {
            "head_round_s": heads,
            "head_time_source": "memory-bound roofline on the edge (testbed)",
            "head_time_gamma": max(int(g) for g in gammas),
        },
        "description": (
            f"{REGIME_TITLES[regime]}: {spec.device_name} ({spec.device_bandwidth_gb_s:g} GB/s) "
            f"drafting with {spec.draft_params / 1e9:.2f}B parameters, {spec.edge_name} "
            f"({spec.edge_bandwidth_gb_s:g} GB/s) verifying with "
            f"{spec.target_params / 1e9:.2f}B; tau_SLM {profile.draft_token_s * 1e3:.1f} ms, "
            f"tau_LLM {profile.target_token_s * 1e3:.1f} ms"
        ),
        "derivation": derivation,
    }
