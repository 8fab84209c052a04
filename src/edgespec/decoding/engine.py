"""Batched, KV-cached speculative decoding of a draft/target pair.

Two round shapes share one cache mechanism:

* **Per-token rounds** (gamma = 1, CU-HLM family, methods §3): the device drafts one token, a
  :class:`TokenPolicy` decides per row whether to keep it without verification (skip) or to
  upload the full or a top-k distribution, and the edge verifies against the distribution it
  received. Every round commits exactly one token per row, so rows stay aligned.
* **gamma-token rounds** (WISV, methods §4.1): the device drafts gamma tokens, the edge scores
  all of them in one forward pass, an :class:`AcceptanceRule` decides which to keep, and the round
  commits the longest accepted prefix plus a recovered (repair) or bonus token. Rows commit
  different numbers of tokens.

Rows advance at their own pace without re-padding: each model's cache keeps one slot per fed
token, and a per-row validity mask hides the slots of rejected drafts (and of padding) from
attention. Position ids count valid slots only, so a row's positions are those of an unpadded
sequence. Finished rows leave the batch, and their cache rows are dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from edgespec.decoding.compression import reconstruct_topk
from edgespec.decoding.sampling import (
    VerificationResult,
    greedy_verify,
    probabilities,
    rejection_sample,
    sample,
    verify_single_token,
)
from edgespec.decoding.uncertainty import perturbation_uncertainty


@dataclass
class DecodingConfig:
    """What every decoding run needs besides the models.

    ``temperature`` 0 means greedy (draft and target take their argmax); ``eos_token_ids`` end a
    row when committed; ``pad_token_id`` fills unused input slots (never attended to).
    """

    max_new_tokens: int
    temperature: float = 0.0
    eos_token_ids: Sequence[int] = ()
    pad_token_id: int = 0
    batch_size: int = 8
    keep_hidden: bool = False


class RaggedCachedModel:
    """One causal LM with a KV cache whose rows may hold invalid (masked) slots."""

    def __init__(self, model: torch.nn.Module, keep_hidden: bool = False):
        self.model = model
        self.keep_hidden = keep_hidden
        self.cache: DynamicCache | None = None
        self.slot_valid: torch.Tensor | None = None  # [B, S] bool, on the model's device
        self.next_position: torch.Tensor | None = None  # [B] long, on the model's device
        self.forward_calls = 0
        self.device = next(model.parameters()).device

    @torch.inference_mode()
    def feed(
        self, tokens: torch.Tensor, valid: torch.Tensor, logits_to_keep: int
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Append ``tokens`` [B, L] (``valid`` [B, L] marks real ones) to the cache.

        Returns the logits [B, logits_to_keep, V] at the last positions and, with
        ``keep_hidden``, the last-layer hidden states [B, logits_to_keep, H] there, both on
        the CPU: sampling and bookkeeping stay there whatever device the model runs on.
        """
        tokens = tokens.to(self.device)
        valid = valid.to(device=self.device, dtype=torch.bool)
        if self.cache is None:
            self.cache = DynamicCache()
            self.slot_valid = valid
            self.next_position = torch.zeros(
                tokens.shape[0], dtype=torch.long, device=tokens.device
            )
        else:
            self.slot_valid = torch.cat([self.slot_valid, valid], dim=1)
        positions = self.next_position.unsqueeze(1) + valid.long().cumsum(1) - 1
        positions = positions.clamp_min(0)
        out = self.model(
            input_ids=tokens,
            attention_mask=self.slot_valid.long(),
            position_ids=positions,
            cache=self.cache,
            use_cache=True,
            logits_to_keep=logits_to_keep,
            output_hidden_states=self.keep_hidden,
        )
        self.forward_calls += 1
        self.next_position = self.next_position + valid.long().sum(1)
        hidden = out.hidden_states[-1][:, -logits_to_keep:].cpu() if self.keep_hidden else None
        return out.logits.cpu(), hidden

    def invalidate_last(self, count: torch.Tensor, width: int) -> None:
        """Hide the last ``count[b]`` valid slots among the final ``width`` slots of row b."""
        tail = self.slot_valid[:, -width:]
        from_end = tail.flip(1).long().cumsum(1).flip(1)  # valid slots at or after each slot
        count = count.to(self.device)
        keep = tail & (from_end > count.unsqueeze(1))
        self.slot_valid = torch.cat([self.slot_valid[:, :-width], keep], dim=1)
        self.next_position = self.next_position - count

    def select_rows(self, rows: torch.Tensor) -> None:
        rows = rows.to(self.device)
        self.cache.batch_select_indices(rows)
        self.slot_valid = self.slot_valid[rows]
        self.next_position = self.next_position[rows]


def left_pad(
    sequences: Sequence[Sequence[int]], pad_id: int, device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack token lists right-aligned: ([B, L] ids, [B, L] validity)."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long, device=device)
    valid = torch.zeros((len(sequences), width), dtype=torch.bool, device=device)
    for row, seq in enumerate(sequences):
        if len(seq):
            ids[row, width - len(seq) :] = torch.as_tensor(list(seq), dtype=torch.long)
            valid[row, width - len(seq) :] = True
    return ids, valid


@dataclass
class RowState:
    """Bookkeeping for the rows of one batch; ``active`` maps batch rows to prompt indices."""

    prompts: list[int]
    generated: dict[int, list[int]] = field(default_factory=dict)
    active: list[int] = field(default_factory=list)

    def __post_init__(self):
        self.generated = {p: [] for p in self.prompts}
        self.active = list(self.prompts)


def _append_and_check(
    state: RowState, committed: list[list[int]], cfg: DecodingConfig
) -> tuple[list[list[int]], list[bool]]:
    """Append each active row's committed tokens, cut at EOS or the token budget."""
    kept, finished = [], []
    eos = set(cfg.eos_token_ids)
    for prompt_index, tokens in zip(state.active, committed, strict=True):
        out = state.generated[prompt_index]
        room = cfg.max_new_tokens - len(out)
        taken = []
        done = False
        for tok in tokens[:room]:
            taken.append(tok)
            if tok in eos:
                done = True
                break
        out.extend(taken)
        kept.append(taken)
        finished.append(done or len(out) >= cfg.max_new_tokens)
    return kept, finished


# ---------------------------------------------------------------------------------------------
# Per-token rounds (gamma = 1)
# ---------------------------------------------------------------------------------------------


@dataclass
class TokenStep:
    """What one per-token round saw, for the active rows (``prompt_indices``).

    ``draft_probs`` x(t) and ``target_probs`` y(t) are [B, V] at the sampling temperature
    (``None`` when that model was not run); ``draft_tokens`` d(t); ``uncertainty`` u(t);
    ``skipped`` rows kept d(t) without verification; ``upload_k`` entries sent (0 if skipped);
    ``committed`` the token each row emitted; ``draft_logits`` z(t).
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


def _draw(probs: torch.Tensor, logits: torch.Tensor, temperature: float, generator) -> torch.Tensor:
    return logits.argmax(-1) if temperature == 0 else sample(probs, generator)


@torch.inference_mode()
def generate_tokenwise(
    prompts: Sequence[Sequence[int]],
    cfg: DecodingConfig,
    generator: torch.Generator,
    draft: torch.nn.Module | None = None,
    target: torch.nn.Module | None = None,
    policy: TokenPolicy | None = None,
    on_step: Callable[[TokenStep], None] | None = None,
) -> list[list[int]]:
    """Decode ``prompts`` (token-id lists) in per-token rounds; returns the new tokens per prompt.

    With both models: hybrid decoding under ``policy`` (default :class:`UploadFull`). With only
    ``draft``: SLM-only (the target is never called). With only ``target``: LLM-only.
    """
    if draft is None and target is None:
        raise ValueError("need a draft model, a target model, or both")
    policy = policy or UploadFull()
    results: list[list[int]] = [[] for _ in prompts]
    for start in range(0, len(prompts), cfg.batch_size):
        indices = list(range(start, min(start + cfg.batch_size, len(prompts))))
        state = RowState(indices)
        ids, valid = left_pad([prompts[i] for i in indices], cfg.pad_token_id, "cpu")
        models = {
            name: RaggedCachedModel(m, cfg.keep_hidden)
            for name, m in (("draft", draft), ("target", target))
            if m is not None
        }
        outs = {name: m.feed(ids, valid, 1) for name, m in models.items()}
        position = torch.zeros(len(indices), dtype=torch.long)
        while state.active:
            z_draft = outs["draft"][0][:, -1] if "draft" in outs else None
            z_target = outs["target"][0][:, -1] if "target" in outs else None
            x = probabilities(z_draft, cfg.temperature) if z_draft is not None else None
            y = probabilities(z_target, cfg.temperature) if z_target is not None else None
            batch = len(state.active)
            u = d = None
            skipped = torch.zeros(batch, dtype=torch.bool)
            upload_k = torch.zeros(batch, dtype=torch.long)
            accepted = torch.zeros(batch, dtype=torch.bool)
            if x is not None and y is not None:
                d = _draw(x, z_draft, cfg.temperature, generator)
                u = (
                    perturbation_uncertainty(
                        z_draft,
                        d,
                        policy.uncertainty_samples,
                        policy.uncertainty_theta_max,
                        generator,
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
            elif x is not None:
                committed = d = _draw(x, z_draft, cfg.temperature, generator)
            else:
                committed = _draw(y, z_target, cfg.temperature, generator)
            if on_step is not None:
                on_step(
                    TokenStep(
                        prompt_indices=list(state.active),
                        position=position.clone(),
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
            _, finished = _append_and_check(state, [[int(t)] for t in committed], cfg)
            position += 1
            keep = torch.tensor([not f for f in finished])
            if not keep.any():
                break
            if not keep.all():
                rows = keep.nonzero().squeeze(1)
                for m in models.values():
                    m.select_rows(rows)
                state.active = [p for p, k in zip(state.active, keep.tolist(), strict=True) if k]
                committed = committed[rows]
                position = position[rows]
            step_valid = torch.ones((len(state.active), 1), dtype=torch.bool)
            outs = {
                name: m.feed(committed.unsqueeze(1), step_valid, 1) for name, m in models.items()
            }
        for i in indices:
            results[i] = state.generated[i]
    return results


# ---------------------------------------------------------------------------------------------
# gamma-token rounds
# ---------------------------------------------------------------------------------------------


@dataclass
class DraftRound:
    """One gamma-token round for the active rows, as the edge sees it.

    ``draft_tokens`` [B, G]; ``draft_probs`` [B, G, V] and ``target_probs`` [B, G+1, V] at the
    decoding temperature; ``target_logits`` [B, G+1, V]; hidden states [B, G, H], present when
    the decoding config keeps them: the *after-token* last-layer states of x_i, at x_i's own
    position after consuming it, so that a judge sees the token it judges (methods §4.1).
    The target's come from the verification pass (its positions 1..G); the draft's state of
    x_i (i < G) from the drafting step that consumed x_i, and that of x_G from one extra draft
    forward over x_G. ``prompt_indices`` name the rows' prompts.
    """

    prompt_indices: list[int]
    draft_tokens: torch.Tensor
    draft_probs: torch.Tensor
    target_probs: torch.Tensor
    target_logits: torch.Tensor
    draft_hidden: torch.Tensor | None
    target_hidden: torch.Tensor | None
    generated_lengths: torch.Tensor


AcceptanceRule = Callable[[DraftRound, torch.Generator], VerificationResult]
"""Maps a round to its verification outcome (which prefix is kept, which token repairs)."""


def strict_acceptance(temperature: float) -> AcceptanceRule:
    """Vanilla speculative decoding: greedy matching at temperature 0, rejection sampling above."""

    def rule(round_: DraftRound, generator: torch.Generator) -> VerificationResult:
        if temperature == 0:
            return greedy_verify(round_.draft_tokens, round_.target_logits)
        return rejection_sample(
            round_.draft_tokens, round_.draft_probs, round_.target_probs, generator
        )

    return rule


@dataclass
class RoundStats:
    """Per round and row: tokens drafted, accepted, committed (after EOS/budget cuts)."""

    prompt_index: int
    round_index: int
    num_drafted: int
    num_accepted: int
    num_committed: int
    num_mismatches: int


@torch.inference_mode()
def generate_rounds(
    prompts: Sequence[Sequence[int]],
    cfg: DecodingConfig,
    generator: torch.Generator,
    draft: torch.nn.Module,
    target: torch.nn.Module,
    gamma: int,
    acceptance: AcceptanceRule | None = None,
    on_round: Callable[[DraftRound, VerificationResult], None] | None = None,
) -> tuple[list[list[int]], list[RoundStats]]:
    """Decode in rounds of ``gamma`` draft tokens; returns new tokens per prompt and round stats.

    The default ``acceptance`` is strict (lossless) verification at ``cfg.temperature``.
    """
    if gamma < 1:
        raise ValueError(f"gamma must be >= 1, got {gamma}")
    acceptance = acceptance or strict_acceptance(cfg.temperature)
    results: list[list[int]] = [[] for _ in prompts]
    stats: list[RoundStats] = []
    for start in range(0, len(prompts), cfg.batch_size):
        indices = list(range(start, min(start + cfg.batch_size, len(prompts))))
        state = RowState(indices)
        for i in indices:
            if len(prompts[i]) < 1:
                raise ValueError(f"prompt {i} is empty")
        ids, valid = left_pad([prompts[i][:-1] for i in indices], cfg.pad_token_id, "cpu")
        dm, tm = (
            RaggedCachedModel(draft, cfg.keep_hidden),
            RaggedCachedModel(target, cfg.keep_hidden),
        )
        if ids.shape[1] > 0:
            dm.feed(ids, valid, 1)
            tm.feed(ids, valid, 1)
        draft_pending = [[prompts[i][-1]] for i in indices]
        target_pending = [[prompts[i][-1]] for i in indices]
        round_index = 0
        while state.active:
            batch = len(state.active)
            # Draft gamma tokens; the first step also consumes what the draft has not seen yet.
            pend_ids, pend_valid = left_pad(draft_pending, cfg.pad_token_id, "cpu")
            draft_width = pend_ids.shape[1] + gamma - 1
            tokens, probs_list, hidden_list = [], [], []
            step_ids, step_valid = pend_ids, pend_valid
            for step in range(gamma):
                logits, hidden = dm.feed(step_ids, step_valid, 1)
                z = logits[:, -1]
                p = probabilities(z, cfg.temperature)
                tok = _draw(p, z, cfg.temperature, generator)
                tokens.append(tok)
                probs_list.append(p)
                if hidden is not None and step > 0:
                    hidden_list.append(hidden[:, -1])  # after-token state of x_step
                step_ids, step_valid = tok.unsqueeze(1), torch.ones((batch, 1), dtype=torch.bool)
            if cfg.keep_hidden:
                # One extra draft forward over x_gamma gives its after-token state; the draft
                # cache then holds all gamma drafts.
                _, hidden = dm.feed(step_ids, step_valid, 1)
                hidden_list.append(hidden[:, -1])
                draft_width += 1
            draft_tokens = torch.stack(tokens, 1)
            t_ids, t_valid = left_pad(
                [tp + row for tp, row in zip(target_pending, draft_tokens.tolist(), strict=True)],
                cfg.pad_token_id,
                "cpu",
            )
            target_logits, target_hidden = tm.feed(t_ids, t_valid, gamma + 1)
            round_ = DraftRound(
                prompt_indices=list(state.active),
                draft_tokens=draft_tokens,
                draft_probs=torch.stack(probs_list, 1),
                target_probs=probabilities(target_logits, cfg.temperature),
                target_logits=target_logits,
                draft_hidden=torch.stack(hidden_list, 1) if hidden_list else None,
                target_hidden=target_hidden[:, 1:] if target_hidden is not None else None,
                generated_lengths=torch.tensor([len(state.generated[p]) for p in state.active]),
            )
            verdict = acceptance(round_, generator)
            if on_round is not None:
                on_round(round_, verdict)
            n = verdict.num_accepted
            committed = [
                row[: int(k) + 1] for row, k in zip(verdict.output_tokens.tolist(), n, strict=True)
            ]
            mismatches = (draft_tokens != target_logits[:, :gamma].argmax(-1)).sum(1)
            kept, finished = _append_and_check(state, committed, cfg)
            for row, p in enumerate(state.active):
                stats.append(
                    RoundStats(
                        p, round_index, gamma, int(n[row]), len(kept[row]), int(mismatches[row])
                    )
                )
            # Roll back: the target saw all gamma drafts, keep the accepted ones. The draft fed
            # gamma - 1 drafts (gamma with keep_hidden), keep the accepted ones among them; an
            # accepted x_gamma it has not fed yet goes into its pending tokens.
            tm.invalidate_last(gamma - n, t_ids.shape[1])
            fed = gamma if cfg.keep_hidden else gamma - 1
            dm.invalidate_last((fed - n).clamp_min(0), draft_width)
            final = [row[-1] for row in committed]
            target_pending = [[f] for f in final]
            draft_pending = [
                ([int(draft_tokens[r, -1])] if int(n[r]) > fed else []) + [final[r]]
                for r in range(batch)
            ]
            keep = torch.tensor([not f for f in finished])
            round_index += 1
            if not keep.any():
                break
            if not keep.all():
                rows = keep.nonzero().squeeze(1)
                dm.select_rows(rows)
                tm.select_rows(rows)
                state.active = [p for p, k in zip(state.active, keep.tolist(), strict=True) if k]
                target_pending = [target_pending[r] for r in rows.tolist()]
                draft_pending = [draft_pending[r] for r in rows.tolist()]
        for i in indices:
            results[i] = state.generated[i]
    return results, stats
