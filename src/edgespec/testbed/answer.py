"""What device and edge agree on before one answer, and the rules both apply while it runs.

An :class:`AnswerJob` is one prompt under one method and channel: the prompt's ids, the wire
sizes, the decoding config (batch of one), the seed of the generator both sides hold (shared
randomness: each side draws its own numbers from it and skips the other side's, so the pair
consumes the stream exactly as the single-process decode does), the uplink rate and fading gain
of every block (the link's plan; the edge reads the gains as its CSI) and the limits.

:func:`cut` is the schedule's end rule for one row (EOS or the token budget); :class:`UplinkBudget`
is the testbed's size limit: an answer stops after the token or round whose modelled uplink time
(payload bits / the block's rate) takes the answer's total above ``max_uplink_s``, so a full
distribution over a deep fade does not hold the stage for minutes; the prediction is priced on
the same committed tokens, so the comparison stays paired. Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from edgespec.testbed.messages import WireSpec

TOKENWISE_METHODS = ("hlm", "cuhlm_online")
ROUND_METHODS = ("vanilla_sd", "wisv_fh", "wisv_sh")
METHODS = TOKENWISE_METHODS + ROUND_METHODS
"""The methods the testbed runs: CU-HLM family per token, WISV family per round."""


@dataclass(frozen=True)
class AnswerJob:
    """One answer (see the module docstring). ``cfg`` is a ``DecodingConfig`` (batch of one);
    ``policy`` the device's CU-HLM ``TokenPolicy`` (None for rounds); ``condition`` the channel's
    ``ChannelCondition`` fields (the CSI a head reads); ``draft_dtype`` the dtype the draft's
    hidden states are cast back to on the edge; timeouts in seconds."""

    method: str
    channel: str
    prompt_id: str
    prompt: tuple[int, ...]
    spec: WireSpec
    cfg: Any
    generator_seed: int
    rates_bps: tuple[float, ...]
    gains: tuple[float, ...]
    rtt_s: float
    max_uplink_s: float
    reply_timeout_s: float
    frame_s: float
    policy: Any = None
    condition: dict | None = None
    draft_dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"the testbed runs {METHODS}, not {self.method!r}")
        if len(self.rates_bps) < self.cfg.max_new_tokens:
            raise ValueError("the plan needs one rate per block (max_new_tokens blocks)")

    @property
    def label(self) -> str:
        return f"{self.method}/{self.channel}/{self.prompt_id}"

    def reply_wait_s(self, uplink_bytes: int, block: int) -> float:
        """How long the device waits for the reply to an uplink frame of ``uplink_bytes``: the
        reply timeout plus twice the frame's transit (rate and RTT), room for retransmissions."""
        transit = 8.0 * uplink_bytes / self.rates_bps[block] + self.rtt_s
        return self.reply_timeout_s + 2.0 * transit


def wire_sizes(provenance: Mapping[str, Any]) -> dict[str, int]:
    """|V| (the target's logits) and the draft's hidden size, from rule fetch_models'
    provenance (as ``edgespec.wisv.evaluate.protocol_params`` reads them)."""
    models = provenance["models"]
    return {
        "vocab_size": int(models["target"]["logits_size"]),
        "hidden_size": int(models["draft"]["hidden_size"]),
    }


def wire_spec(method: str, settings: Mapping[str, Any], sizes: Mapping[str, int]) -> WireSpec:
    """The wire sizes of ``method``'s answers: |V| and the draft's hidden size (``sizes``),
    bits per probability and per hidden value and gamma (config section ``testbed``; gamma 1
    for the CU-HLM family)."""
    return WireSpec(
        int(sizes["vocab_size"]),
        int(settings["prob_bits"]),
        int(sizes["hidden_size"]),
        int(settings["hidden_bits"]),
        1 if method in TOKENWISE_METHODS else int(settings["gamma"]),
    )


def cut(generated: list[int], tokens: Sequence[int], cfg) -> tuple[list[int], bool]:
    """Append ``tokens`` to ``generated`` up to EOS or the token budget (the decoding schedule's
    rule for one row); returns (the tokens kept, whether the answer is finished)."""
    kept = []
    room = cfg.max_new_tokens - len(generated)
    eos = set(cfg.eos_token_ids)
    done = False
    for tok in list(tokens)[: max(room, 0)]:
        kept.append(int(tok))
        if tok in eos:
            done = True
            break
    generated.extend(kept)
    return kept, done or len(generated) >= cfg.max_new_tokens


class UplinkBudget:
    """The modelled uplink seconds an answer has spent (model bits / the block's rate)."""

    def __init__(self, job: AnswerJob) -> None:
        self.job = job
        self.seconds = 0.0

    def charge(self, model_bits: float, block: int) -> None:
        self.seconds += model_bits / self.job.rates_bps[block]

    @property
    def spent(self) -> bool:
        return self.seconds > self.job.max_uplink_s
