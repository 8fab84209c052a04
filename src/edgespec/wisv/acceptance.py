"""WISV acceptance rules (methods §4.1): which draft tokens of a gamma-token round the edge keeps.

Decoding is greedy (temperature 0), as in AutoJudge, so accepting a draft token reduces to
*match or judge*: position i of a round is accepted iff x_i = y_i (the target's argmax) or the
rule accepts the mismatch. The round commits the longest accepted prefix, then the target's
argmax at the first rejected position (repair) or, when all gamma drafts are accepted, the
target's argmax after them (bonus); see ``edgespec.decoding.sampling.accept_by_rule``. Each
rule here is an ``edgespec.decoding.rounds.AcceptanceRule``: top-k acceptance, and the learned
decision head with or without the channel state.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from edgespec import checks
from edgespec.decoding.rounds import AcceptanceRule, DraftRound
from edgespec.decoding.sampling import VerificationResult, accept_by_rule, greedy_tokens
from edgespec.wisv.head import DecisionHead, head_accept_probability


@dataclass
class ChannelRound(DraftRound):
    """A ``DraftRound`` with the block-fading channel of the round (``decode_wisv``).

    ``round_indices`` [B] each row's round number (0-based); ``gains`` [B] |h|^2 and
    ``rates_bps`` [B] the uplink rate of that round; ``csi`` [B, d_csi] the encoded CSI
    features phi(c) (None without a CSI encoder).
    """

    round_indices: torch.Tensor | None = None
    gains: torch.Tensor | None = None
    rates_bps: torch.Tensor | None = None
    csi: torch.Tensor | None = None


def round_csi(round_: DraftRound) -> torch.Tensor:
    """The default ``csi_provider``: the CSI features ``decode_wisv`` attached to the round."""
    csi = getattr(round_, "csi", None)
    if csi is None:
        raise ValueError(
            "this head needs CSI features but the round carries none: decode with "
            "decode_wisv(..., csi_encoder=...) or pass a csi_provider"
        )
    return csi


def target_choice(round_: DraftRound) -> torch.Tensor:
    return greedy_tokens(round_.target_logits)


def topk_acceptance(k: int) -> AcceptanceRule:
    """Accept x_i iff it is among the target's top-k at position i (ties: ``torch.topk``'s
    choice, and the argmax is always in); repair and bonus are the target's argmax."""
    k = checks.integer("k", k)

    def rule(round_: DraftRound, generator: torch.Generator) -> VerificationResult:
        gamma = round_.draft_tokens.shape[1]
        logits = round_.target_logits[:, :gamma]
        choice = target_choice(round_)
        accepted = round_.draft_tokens == choice[:, :gamma]
        kk = min(k, logits.shape[-1])
        if kk > 1:
            top = logits.topk(kk, dim=-1).indices
            accepted = accepted | (top == round_.draft_tokens.unsqueeze(-1)).any(-1)
        return accept_by_rule(round_.draft_tokens, accepted, choice)

    return rule


def head_acceptance(
    head: DecisionHead,
    tau: float,
    csi_provider: Callable[[DraftRound], torch.Tensor | None] | None = None,
) -> AcceptanceRule:
    """accept_i = (x_i == y_i) or (q_i >= tau), q_i = head(h_draft_i, h_target_i, csi of the row).

    ``csi_provider(round_)`` gives [B, d_csi] (the round's CSI per row) or None; by default a
    CSI head reads ``ChannelRound.csi`` (``round_csi``) and a no-CSI head (d_csi = 0) reads
    nothing. Repair and bonus are the target's argmax. Needs the rounds' hidden states
    (``DecodingConfig.keep_hidden=True``). tau above every q (e.g. ``head.REJECT_ALL_TAU``)
    is vanilla SD; tau = 0 accepts every draft token.
    """
    if not math.isfinite(tau):
        raise ValueError(f"tau must be finite, got {tau}")
    if csi_provider is None and head.d_csi > 0:
        csi_provider = round_csi

    def rule(round_: DraftRound, generator: torch.Generator) -> VerificationResult:
        if round_.draft_hidden is None or round_.target_hidden is None:
            raise ValueError(
                "head_acceptance needs the rounds' hidden states: decode with "
                "DecodingConfig(keep_hidden=True)"
            )
        gamma = round_.draft_tokens.shape[1]
        choice = target_choice(round_)
        match = round_.draft_tokens == choice[:, :gamma]
        accepted = match
        if not bool(match.all()):
            csi = csi_provider(round_) if (csi_provider is not None and head.d_csi > 0) else None
            device = head.mean.device
            if csi is not None:
                csi = torch.as_tensor(csi).to(device)
                if csi.ndim == 2:
                    csi = csi.unsqueeze(1)  # one CSI per row, shared by its gamma positions
            q = head_accept_probability(
                head, round_.draft_hidden.to(device), round_.target_hidden.to(device), csi
            ).to(match.device)
            accepted = match | (q >= tau)
        return accept_by_rule(round_.draft_tokens, accepted, choice)

    return rule
