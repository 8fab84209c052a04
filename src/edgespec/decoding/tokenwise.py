"""Per-token rounds (gamma = 1, CU-HLM family, methods §3).

The device drafts one token, a :class:`TokenPolicy` decides per row whether to keep it without
verification (skip) or to upload the full or a top-k distribution, and the edge verifies
against the distribution it received. Every round commits exactly one token per row.
:func:`generate_tokenwise` also decodes with a single model (SLM-only, LLM-only).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from edgespec.decoding.cache import RaggedCachedModel
from edgespec.decoding.compression import reconstruct_topk
from edgespec.decoding.config import DecodingConfig
from edgespec.decoding.prefill import Prefills, prefill_newcomers
from edgespec.decoding.progress import DecodeProgress
from edgespec.decoding.sampling import draw_tokens, probabilities, verify_single_token
from edgespec.decoding.schedule import Schedule
from edgespec.decoding.uncertainty import perturbation_uncertainty


@dataclass
class TokenStep:
    """What one per-token round saw, for the active rows (``prompt_indices``).

    ``draft_probs`` x(t) and ``target_probs`` y(t) are [B, V] at the sampling temperature
    (``None`` when that model was not run, or for a single model decoding greedily);
    ``draft_tokens`` d(t); ``uncertainty`` u(t); ``skipped`` rows kept d(t) without
    verification; ``upload_k`` entries sent (0 if skipped); ``committed`` the token each row
    emitted; ``draft_logits`` z(t).
    """

    prompt_indices: list[int]
    position: torch.Tensor
    draft_logits: torch.Tensor | None
    draft_probs: torch.Tensor | None
    target_probs: torch.Tensor | None
    draft_tokens: torch.Tensor | None
    uncertainty: torch.Tensor | None
    skipped: torch.Tensor
    upload_k: torch.Tensor
    accepted: torch.Tensor
    committed: torch.Tensor
    draft_hidden: torch.Tensor | None = None
    target_hidden: torch.Tensor | None = None


class TokenPolicy:
    """Device-side per-token decision of methods §3: skip or upload top-k.

    Subclasses see only what the device knows (x, d, u, z) and return, per row, whether to
    skip verification and how many distribution entries to upload (k = |V| is standard HLM).
    ``uncertainty_samples`` > 0 asks the engine to compute u(t) with that many samples.
    """

    uncertainty_samples: int = 0
    uncertainty_theta_max: float = 2.0

    def sampling_distribution(
        self, draft_logits: torch.Tensor, draft_probs: torch.Tensor
    ) -> torch.Tensor:
        """The distribution [B, V] the device draws d(t) from; by default x itself.

        A policy that returns another law (e.g. the top-k reconstruction it will upload) makes
        verification against that upload exact. It consumes no random numbers, so the default
        leaves every draw of the engine unchanged.
        """
        return draft_probs

    def decide(
        self,
        draft_logits: torch.Tensor,
        draft_probs: torch.Tensor,
        draft_tokens: torch.Tensor,
        uncertainty: torch.Tensor,
        generator: torch.Generator,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError


class UploadFull(TokenPolicy):
    """Standard HLM: every token uploads its full distribution."""

    def __init__(self, uncertainty_samples: int = 0, theta_max: float = 2.0):
        self.uncertainty_samples = uncertainty_samples
        self.uncertainty_theta_max = theta_max

    def decide(self, draft_logits, draft_probs, draft_tokens, uncertainty, generator):
        batch, vocab = draft_probs.shape
        return torch.zeros(batch, dtype=torch.bool), torch.full((batch,), vocab, dtype=torch.long)


def _join_outputs(old, new):
    """Stack the (logits, hidden) of running rows and of newly admitted rows."""
    if old is None:
        return new
    logits = torch.cat([old[0], new[0]])
    hidden = None if old[1] is None else torch.cat([old[1], new[1]])
    return logits, hidden


def _select_outputs(outs, rows: torch.Tensor):
    return outs[0][rows], None if outs[1] is None else outs[1][rows]


@torch.inference_mode()
def generate_tokenwise(
    prompts: Sequence[Sequence[int]],
    cfg: DecodingConfig,
    generator: torch.Generator,
    draft: torch.nn.Module | None = None,
    target: torch.nn.Module | None = None,
    policy: TokenPolicy | None = None,
    on_step: Callable[[TokenStep], None] | None = None,
    progress: DecodeProgress | None = None,
    prefilled: Prefills | None = None,
) -> list[list[int]]:
    """Decode ``prompts`` (token-id lists) in per-token rounds; returns the new tokens per prompt.

    With both models: hybrid decoding under ``policy`` (default :class:`UploadFull`). With only
    ``draft``: SLM-only (the target is never called). With only ``target``: LLM-only.
    ``progress`` counts the committed tokens and finished prompts, and is closed at the end
    (which logs the final tokens/s). ``prefilled`` serves the prompts' prefills (a
    :class:`Prefills`) instead of computing them.
    """
    if draft is None and target is None:
        raise ValueError("need a draft model, a target model, or both")
    for i, prompt in enumerate(prompts):
        if len(prompt) < 1:
            raise ValueError(f"prompt {i} is empty")
    policy = policy or UploadFull()
    hybrid = draft is not None and target is not None
    # A single model decoding greedily needs no probabilities, only argmaxes.
    needs_probs = hybrid or cfg.temperature > 0
    schedule = Schedule(prompts, cfg)
    models = {
        name: RaggedCachedModel(m, cfg.keep_hidden)
        for name, m in (("draft", draft), ("target", target))
        if m is not None
    }
    outs: dict[str, tuple | None] = {name: None for name in models}
    while schedule.queue or schedule.active:
        new = schedule.admit()
        if new:
            for name, m in models.items():
                newcomer, first = prefill_newcomers(
                    prefilled, name, m.model, [prompts[i] for i in new], cfg, with_outputs=True
                )
                outs[name] = _join_outputs(outs[name], first)
                m.join(newcomer)
        z_draft = outs["draft"][0][:, -1] if "draft" in outs else None
        z_target = outs["target"][0][:, -1] if "target" in outs else None
        x = probabilities(z_draft, cfg.temperature) if z_draft is not None and needs_probs else None
        y = (
            probabilities(z_target, cfg.temperature)
            if z_target is not None and needs_probs
            else None
        )
        batch = len(schedule.active)
        u = d = None
        skipped = torch.zeros(batch, dtype=torch.bool)
        upload_k = torch.zeros(batch, dtype=torch.long)
        accepted = torch.zeros(batch, dtype=torch.bool)
        if hybrid:
            d = draw_tokens(
                policy.sampling_distribution(z_draft, x), z_draft, cfg.temperature, generator
            )
            u = (
                perturbation_uncertainty(
                    z_draft, d, policy.uncertainty_samples, policy.uncertainty_theta_max, generator
                )
                if policy.uncertainty_samples > 0
                else torch.zeros(batch)
            )
            skipped, upload_k = policy.decide(z_draft, x, d, u, generator)
            received = reconstruct_topk(x, upload_k.clamp_min(1))
            verified, accepted = verify_single_token(d, received, y, generator)
            committed = torch.where(skipped, d, verified)
            accepted = accepted | skipped
            upload_k = torch.where(skipped, 0, upload_k)
        elif z_draft is not None:
            committed = d = draw_tokens(x, z_draft, cfg.temperature, generator)
        else:
            committed = draw_tokens(y, z_target, cfg.temperature, generator)
        position = torch.tensor([len(schedule.generated[p]) for p in schedule.active])
        if on_step is not None:
            on_step(
                TokenStep(
                    prompt_indices=list(schedule.active),
                    position=position,
                    draft_logits=z_draft,
                    draft_probs=x,
                    target_probs=y,
                    draft_tokens=d,
                    uncertainty=u,
                    skipped=skipped,
                    upload_k=upload_k,
                    accepted=accepted,
                    committed=committed,
                    draft_hidden=outs["draft"][1][:, -1]
                    if "draft" in outs and cfg.keep_hidden
                    else None,
                    target_hidden=outs["target"][1][:, -1]
                    if "target" in outs and cfg.keep_hidden
                    else None,
                )
            )
        _, finished = schedule.commit([[int(t)] for t in committed])
        if progress is not None:
            progress.advance(len(finished), sum(finished))
        rows = schedule.keep(finished)
        if rows is not None:
            committed = committed[rows]
            for name, m in models.items():
                m.select_rows(rows)
                outs[name] = _select_outputs(outs[name], rows)
        if not schedule.active:
            for name in outs:
                outs[name] = None
            for m in models.values():
                m.start(0)
            continue
        step_valid = torch.ones((len(schedule.active), 1), dtype=torch.bool)
        for name, m in models.items():
            m.compact()
            outs[name] = m.feed(committed.unsqueeze(1), step_valid, 1)
    if progress is not None:
        progress.close()
    return schedule.results()
