"""Batched, KV-cached speculative decoding of a draft/target pair.

Two round shapes share one cache mechanism:

* **Per-token rounds** (gamma = 1, CU-HLM family, methods §3): the device drafts one token, a
  :class:`TokenPolicy` decides per row whether to keep it without verification (skip) or to
  upload the full or a top-k distribution, and the edge verifies against the distribution it
  received. Every round commits exactly one token per row.
* **gamma-token rounds** (WISV, methods §4.1): the device drafts gamma tokens, the edge scores
  all of them in one forward pass, an :class:`AcceptanceRule` decides which to keep, and the
  round commits the longest accepted prefix plus a recovered (repair) or bonus token. Rows commit
  different numbers of tokens.

Rows advance at their own pace without re-padding: each model's cache keeps one slot per fed
token, and a per-row validity mask hides the slots of rejected drafts (and of padding) from
attention. Position ids count valid slots only, so a row's positions are those of an unpadded
sequence. Where the hidden slots take up a quarter of the cache, it is compacted (each row's
valid slots gathered to the right), so attention and memory track the valid tokens.

Scheduling (continuous batching): prompts are admitted in order of length, at most
``batch_size`` rows decode together, a finished row leaves the batch, and free rows are
refilled from the queue (the newcomers are prefilled on their own and their cache rows joined
to the running batch) instead of letting the last rounds of a batch run nearly empty. A prefill
(:func:`prefill`) computes the beginning that its prompts share once and feeds the rest in
chunks of similar length; a run may instead read its prefills from a store computed once for
every run on the same prompts (``prefilled=``, :class:`Prefills`). The
decoded tokens do not depend on the schedule for greedy decoding; sampled decoding draws from
one generator in schedule order, so it is reproducible for a given configuration.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from transformers import DynamicCache

from edgespec.decoding.compression import reconstruct_topk
from edgespec.decoding.progress import DecodeProgress
from edgespec.decoding.sampling import (
    VerificationResult,
    greedy_tokens,
    greedy_verify,
    probabilities,
    rejection_sample,
    sample,
    verify_single_token,
)
from edgespec.decoding.uncertainty import perturbation_uncertainty

COMPACT_MIN_WASTE = 16
"""Compact a cache once at least this many slots, and a quarter of all slots, are hidden."""


@dataclass
class DecodingConfig:
    """What every decoding run needs besides the models.

    ``temperature`` 0 means greedy (draft and target take their argmax); ``eos_token_ids`` end a
    row when committed; ``pad_token_id`` fills unused input slots (never attended to);
    ``batch_size`` rows decode together; ``keep_hidden`` asks for last-layer hidden states.
    """

    max_new_tokens: int
    temperature: float = 0.0
    eos_token_ids: Sequence[int] = ()
    pad_token_id: int = 0
    batch_size: int = 8
    keep_hidden: bool = False


def _cache_layers(cache: DynamicCache) -> list:
    layers = getattr(cache, "layers", None)
    if layers is None or any(getattr(layer, "sliding_window", None) for layer in layers):
        raise NotImplementedError(
            "the ragged cache needs full-attention DynamicCache layers (no sliding window)"
        )
    return layers


class RaggedCachedModel:
    """One causal LM with a KV cache whose rows may hold invalid (masked) slots."""

    def __init__(self, model: torch.nn.Module, keep_hidden: bool = False):
        self.model = model
        self.keep_hidden = keep_hidden
        self.cache: DynamicCache | None = None
        self.slot_valid: torch.Tensor | None = None  # [B, S] bool, on the model's device
        self.next_position: torch.Tensor | None = None  # [B] long, on the model's device
        self.forward_calls = 0
        self.compactions = 0
        self.device = next(model.parameters()).device

    @property
    def num_rows(self) -> int:
        return 0 if self.next_position is None else int(self.next_position.shape[0])

    @property
    def num_slots(self) -> int:
        return 0 if self.slot_valid is None else int(self.slot_valid.shape[1])

    def start(self, rows: int) -> None:
        """An empty cache for ``rows`` rows (nothing fed yet)."""
        self.cache = None
        self.slot_valid = torch.zeros((rows, 0), dtype=torch.bool, device=self.device)
        self.next_position = torch.zeros(rows, dtype=torch.long, device=self.device)

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
        if self.slot_valid is None:
            self.start(tokens.shape[0])
        if self.cache is None:
            self.cache = DynamicCache()
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
        if self.cache is not None:
            self.cache.batch_select_indices(rows)
        self.slot_valid = self.slot_valid[rows]
        self.next_position = self.next_position[rows]

    def compact(self, min_waste: int = COMPACT_MIN_WASTE) -> bool:
        """Drop hidden slots when at least ``min_waste`` and a quarter of all slots are hidden.

        Each row's valid slots keep their order and move to the right end (keys already carry
        their rotary positions, so attention is unchanged); returns whether it compacted.
        """
        if self.cache is None or self.num_rows == 0:
            return False
        slots = self.num_slots
        counts = self.slot_valid.long().sum(1)
        width = int(counts.max()) if counts.numel() else 0
        waste = slots - width
        if waste < min_waste or 4 * waste < slots:
            return False
        # Sorting the validity (stable) lists each row's hidden slots first, then its valid
        # slots in their original order: the last ``width`` entries are the new layout.
        order = torch.sort(self.slot_valid.to(torch.int8), dim=1, stable=True).indices
        index = order[:, slots - width :]
        for layer in _cache_layers(self.cache):
            gather = index[:, None, :, None].expand(
                layer.keys.shape[0], layer.keys.shape[1], width, layer.keys.shape[-1]
            )
            layer.keys = layer.keys.gather(2, gather)
            layer.values = layer.values.gather(2, gather)
        self.slot_valid = self.slot_valid.gather(1, index)
        self.compactions += 1
        return True

    def take_rows(self, rows: torch.Tensor) -> RaggedCachedModel:
        """A new cache (same model) whose row i is a copy of this cache's row ``rows[i]``;
        repeating an index repeats the row. This cache is unchanged."""
        rows = rows.to(self.device)
        other = RaggedCachedModel(self.model, self.keep_hidden)
        other.start(int(rows.shape[0]))
        if self.cache is not None:
            other.cache = DynamicCache()
            for index, layer in enumerate(_cache_layers(self.cache)):
                other.cache.update(
                    layer.keys.index_select(0, rows), layer.values.index_select(0, rows), index
                )
        other.slot_valid = self.slot_valid[rows]
        other.next_position = self.next_position[rows]
        return other

    def join(self, other: RaggedCachedModel) -> None:
        """Append ``other``'s rows (same model) below this cache's, left-padding the narrower
        with hidden slots; ``other`` is consumed."""
        if other.num_rows == 0:
            return
        if self.num_rows == 0:
            self.cache, self.slot_valid = other.cache, other.slot_valid
            self.next_position = other.next_position
            return
        width = max(self.num_slots, other.num_slots)
        template = self.cache if self.cache is not None else other.cache
        if template is not None:
            layers = _cache_layers(template)
            mine, theirs = self._padded_layers(width, layers), other._padded_layers(width, layers)
            for layer, (k1, v1), (k2, v2) in zip(layers, mine, theirs, strict=True):
                layer.keys = torch.cat([k1, k2])
                layer.values = torch.cat([v1, v2])
            self.cache = template
        self.slot_valid = torch.cat(
            [_left_pad_mask(self.slot_valid, width), _left_pad_mask(other.slot_valid, width)]
        )
        self.next_position = torch.cat([self.next_position, other.next_position])

    def _padded_layers(self, width: int, like: list) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(keys, values) of each layer left-padded with zeros to ``width`` slots; all zeros
        (shaped like the layers ``like``) where this cache holds nothing yet."""
        own = _cache_layers(self.cache) if self.cache is not None else None
        out = []
        for i, ref in enumerate(like):
            pair = []
            for name in ("keys", "values"):
                if own is not None:
                    tensor = getattr(own[i], name)
                else:
                    shape = getattr(ref, name).shape
                    tensor = getattr(ref, name).new_zeros((self.num_rows, shape[1], 0, shape[3]))
                missing = width - tensor.shape[2]
                if missing:
                    pad = tensor.new_zeros((*tensor.shape[:2], missing, tensor.shape[3]))
                    tensor = torch.cat([pad, tensor], dim=2)
                pair.append(tensor)
            out.append((pair[0], pair[1]))
        return out


def _left_pad_mask(mask: torch.Tensor, width: int) -> torch.Tensor:
    missing = width - mask.shape[1]
    if missing == 0:
        return mask
    return torch.cat([mask.new_zeros((mask.shape[0], missing)), mask], dim=1)


def left_pad(
    sequences: Sequence[Sequence[int]], pad_id: int, device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack token lists right-aligned: ([B, L] ids, [B, L] validity)."""
    width = max((len(s) for s in sequences), default=0)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long, device=device)
    valid = torch.zeros((len(sequences), width), dtype=torch.bool, device=device)
    for row, seq in enumerate(sequences):
        if len(seq):
            ids[row, width - len(seq) :] = torch.as_tensor(list(seq), dtype=torch.long)
            valid[row, width - len(seq) :] = True
    return ids, valid


MIN_SHARED_PREFIX = 8
"""Prompts that start with at least this many equal tokens are prefilled as one shared prefix
(a chat template's system turn, typically) and their own suffixes."""

PREFILL_PAD_SLACK = 1.25
"""A prefill chunk's padded size stays within this factor of its real tokens (plus a few):
prefilling is compute-bound on a CPU, so padding costs as much as real tokens."""


def _common_prefix_length(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    n = min(len(a), len(b), limit)
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _shared_prefix_groups(
    prompts: Sequence[Sequence[int]], keep_last: int
) -> list[tuple[int, list[int]]]:
    """(shared prefix length, row indices) groups covering every row once.

    Rows sorted by their tokens put prompts with a common beginning side by side; a row joins
    the group before it while the group's common prefix stays at least
    :data:`MIN_SHARED_PREFIX` long. The prefix leaves each member at least ``keep_last`` tokens
    of its own. Rows left in a group of one, or in one whose prefix is too short, form the
    first group, which shares nothing (length 0).
    """
    order = sorted(range(len(prompts)), key=lambda i: tuple(prompts[i]))
    groups: list[tuple[int, list[int]]] = []
    for row in order:
        if groups:
            shared, members = groups[-1]
            common = _common_prefix_length(prompts[members[0]], prompts[row], shared)
            if common >= MIN_SHARED_PREFIX:
                groups[-1] = (common, members + [row])
                continue
        groups.append((len(prompts[row]), [row]))
    out, alone = [], []
    for shared, members in groups:
        shared = min(shared, min(len(prompts[i]) for i in members) - keep_last)
        if len(members) > 1 and shared >= MIN_SHARED_PREFIX:
            out.append((shared, members))
        else:
            alone += members
    # rows that share nothing are prefilled together, in chunks of similar length
    return ([(0, sorted(alone))] if alone else []) + out


def _length_chunks(members: list[int], lengths: Mapping[int, int]) -> list[list[int]]:
    """``members`` in order of length, cut where padding to the longest would cost more than
    :data:`PREFILL_PAD_SLACK` times the real tokens."""
    members = sorted(members, key=lambda i: lengths[i])
    chunks: list[list[int]] = []
    total = 0
    for row in members:
        if chunks:
            padded = lengths[row] * (len(chunks[-1]) + 1)
            if padded <= PREFILL_PAD_SLACK * (total + lengths[row]) + MIN_SHARED_PREFIX:
                chunks[-1].append(row)
                total += lengths[row]
                continue
        chunks.append([row])
        total = lengths[row]
    return chunks


def prefill(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    pad_token_id: int,
    keep_hidden: bool = False,
    with_outputs: bool = True,
) -> tuple[RaggedCachedModel, tuple[torch.Tensor, torch.Tensor | None] | None]:
    """A cache of ``prompts`` (row i holds prompt i) and, ``with_outputs``, the logits
    [B, 1, V] (and hidden states [B, 1, H] with ``keep_hidden``) at each prompt's last token.

    Equal to feeding the left-padded prompts in one forward, with less work: a prefix that
    several prompts share is computed once and its keys and values copied to their rows, and
    the rest is fed in chunks of similar length. Positions count valid slots, so every row
    computes what its unpadded prompt would. Without outputs a prompt may be empty.
    """
    if with_outputs and any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs a token to give outputs at")
    lengths_of = [len(p) for p in prompts]
    parts: list[tuple[RaggedCachedModel, tuple | None, list[int]]] = []
    for shared, members in _shared_prefix_groups(prompts, 1 if with_outputs else 0):
        base = None
        if shared:
            base = RaggedCachedModel(model, keep_hidden)
            prefix = torch.tensor([list(prompts[members[0]][:shared])], dtype=torch.long)
            base.feed(prefix, torch.ones_like(prefix, dtype=torch.bool), 1)
        rest = {i: lengths_of[i] - shared for i in members}
        for chunk in _length_chunks(members, rest):
            if base is not None:
                part = base.take_rows(torch.zeros(len(chunk), dtype=torch.long))
            else:
                part = RaggedCachedModel(model, keep_hidden)
                part.start(len(chunk))
            outs = None
            if max(rest[i] for i in chunk) > 0:
                ids, valid = left_pad([prompts[i][shared:] for i in chunk], pad_token_id, "cpu")
                outs = part.feed(ids, valid, 1)
            parts.append((part, outs, chunk))
    if not parts:
        empty = RaggedCachedModel(model, keep_hidden)
        empty.start(0)
        return empty, None
    combined = parts[0][0]
    for part, _, _ in parts[1:]:
        combined.join(part)
    placed = [row for _, _, chunk in parts for row in chunk]
    back = torch.empty(len(placed), dtype=torch.long)
    back[torch.tensor(placed)] = torch.arange(len(placed))
    if placed != sorted(placed):
        combined.select_rows(back)
    if not with_outputs:
        return combined, None
    logits = torch.cat([o[0] for _, o, _ in parts])[back]
    hidden = torch.cat([o[1] for _, o, _ in parts])[back] if keep_hidden else None
    return combined, (logits, hidden)


class Prefills(Protocol):
    """Prompt prefills computed elsewhere (``edgespec.decoding.prefill_store.PrefillStore``)."""

    def cache(
        self,
        role: str,
        model: torch.nn.Module,
        prompts: Sequence[Sequence[int]],
        keep_hidden: bool = False,
        with_outputs: bool = True,
    ) -> tuple[RaggedCachedModel, tuple[torch.Tensor, torch.Tensor | None] | None]:
        """What :func:`prefill` of ``prompts`` in ``model`` (role "draft" or "target") returns;
        without outputs, the cache of each prompt but its last token."""
        ...


def _admit(
    prefilled: Prefills | None,
    role: str,
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    cfg: DecodingConfig,
    with_outputs: bool,
) -> tuple[RaggedCachedModel, tuple[torch.Tensor, torch.Tensor | None] | None]:
    """The newcomers' cache in ``model`` (and their last-token outputs, ``with_outputs``; else
    the cache of each prompt but its last token): read from ``prefilled`` where given,
    computed otherwise."""
    if prefilled is not None:
        return prefilled.cache(role, model, prompts, cfg.keep_hidden, with_outputs)
    heads = prompts if with_outputs else [p[:-1] for p in prompts]
    return prefill(model, heads, cfg.pad_token_id, cfg.keep_hidden, with_outputs=with_outputs)


class _Schedule:
    """Which prompts decode now: a length-ordered queue feeding at most ``batch_size`` rows.

    ``active[r]`` is the prompt index of batch row r; ``generated[p]`` the tokens committed so
    far for prompt p. Rows are refilled once a quarter of the batch is free (or it is empty),
    so each prefill of newcomers serves several rows.
    """

    def __init__(self, prompts: Sequence[Sequence[int]], cfg: DecodingConfig):
        if cfg.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {cfg.batch_size}")
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        self.queue = deque(order)
        self.cfg = cfg
        self.active: list[int] = []
        self.generated: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
        self.refill_at = max(1, cfg.batch_size // 4)
        self._eos = set(cfg.eos_token_ids)

    def admit(self) -> list[int]:
        """Prompts to admit now (appended to ``active``), possibly none."""
        free = self.cfg.batch_size - len(self.active)
        if not self.queue or (self.active and free < min(self.refill_at, len(self.queue))):
            return []
        new = [self.queue.popleft() for _ in range(min(free, len(self.queue)))]
        self.active.extend(new)
        return new

    def commit(self, committed: list[list[int]]) -> tuple[list[list[int]], list[bool]]:
        """Append each active row's committed tokens, cut at EOS or the token budget."""
        kept, finished = [], []
        for prompt_index, tokens in zip(self.active, committed, strict=True):
            out = self.generated[prompt_index]
            room = self.cfg.max_new_tokens - len(out)
            taken = []
            done = False
            for tok in tokens[: max(room, 0)]:
                taken.append(tok)
                if tok in self._eos:
                    done = True
                    break
            out.extend(taken)
            kept.append(taken)
            finished.append(done or len(out) >= self.cfg.max_new_tokens)
        return kept, finished

    def keep(self, finished: list[bool]) -> torch.Tensor | None:
        """Drop finished rows from ``active``; the kept row indices, or None if all are kept."""
        if not any(finished):
            return None
        keep = [r for r, f in enumerate(finished) if not f]
        self.active = [self.active[r] for r in keep]
        return torch.tensor(keep, dtype=torch.long)

    def results(self) -> list[list[int]]:
        return [self.generated[i] for i in range(len(self.generated))]


# ---------------------------------------------------------------------------------------------
# Per-token rounds (gamma = 1)
# ---------------------------------------------------------------------------------------------


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


def _draw(probs: torch.Tensor | None, logits: torch.Tensor, temperature: float, generator):
    return greedy_tokens(logits) if temperature == 0 else sample(probs, generator)


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
    schedule = _Schedule(prompts, cfg)
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
                newcomer, first = _admit(
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
            d = _draw(policy.sampling_distribution(z_draft, x), z_draft, cfg.temperature, generator)
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
            committed = d = _draw(x, z_draft, cfg.temperature, generator)
        else:
            committed = _draw(y, z_target, cfg.temperature, generator)
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


# ---------------------------------------------------------------------------------------------
# gamma-token rounds
# ---------------------------------------------------------------------------------------------


@dataclass
class DraftRound:
    """One gamma-token round for the active rows, as the edge sees it.

    ``draft_tokens`` [B, G]; ``target_logits`` [B, G+1, V]; ``draft_probs`` [B, G, V] and
    ``target_probs`` [B, G+1, V] at the decoding temperature (None when decoding greedily:
    greedy rules read the logits); hidden states [B, G, H], present when the decoding config
    keeps them: the *after-token* last-layer states of x_i, at x_i's own position after
    consuming it, so that a judge sees the token it judges (methods §4.1). The target's come
    from the verification pass (its positions 1..G); the draft's state of x_i (i < G) from the
    drafting step that consumed x_i, and that of x_G from one extra draft forward over x_G.
    ``prompt_indices`` name the rows' prompts.
    """

    prompt_indices: list[int]
    draft_tokens: torch.Tensor
    draft_probs: torch.Tensor | None
    target_probs: torch.Tensor | None
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
    progress: DecodeProgress | None = None,
    prefilled: Prefills | None = None,
) -> tuple[list[list[int]], list[RoundStats]]:
    """Decode in rounds of ``gamma`` draft tokens; returns new tokens per prompt and round stats.

    The default ``acceptance`` is strict (lossless) verification at ``cfg.temperature``.
    ``progress`` counts the committed tokens and finished prompts, and is closed at the end
    (which logs the final tokens/s). ``prefilled`` serves the prompts' prefills (a
    :class:`Prefills`) instead of computing them.
    """
    if gamma < 1:
        raise ValueError(f"gamma must be >= 1, got {gamma}")
    for i, prompt in enumerate(prompts):
        if len(prompt) < 1:
            raise ValueError(f"prompt {i} is empty")
    acceptance = acceptance or strict_acceptance(cfg.temperature)
    greedy = cfg.temperature == 0
    stats: list[RoundStats] = []
    rounds_done: dict[int, int] = {}
    schedule = _Schedule(prompts, cfg)
    dm = RaggedCachedModel(draft, cfg.keep_hidden)
    tm = RaggedCachedModel(target, cfg.keep_hidden)
    draft_pending: list[list[int]] = []
    target_pending: list[list[int]] = []
    while schedule.queue or schedule.active:
        new = schedule.admit()
        if new:
            # Both models see each prompt but its last token, which every round feeds first.
            for role, m in (("draft", dm), ("target", tm)):
                newcomer, _ = _admit(
                    prefilled, role, m.model, [prompts[i] for i in new], cfg, with_outputs=False
                )
                m.join(newcomer)
            draft_pending += [[prompts[i][-1]] for i in new]
            target_pending += [[prompts[i][-1]] for i in new]
        batch = len(schedule.active)
        # Draft gamma tokens; the first step also consumes what the draft has not seen yet.
        pend_ids, pend_valid = left_pad(draft_pending, cfg.pad_token_id, "cpu")
        draft_width = pend_ids.shape[1] + gamma - 1
        tokens, probs_list, hidden_list = [], [], []
        step_ids, step_valid = pend_ids, pend_valid
        for step in range(gamma):
            logits, hidden = dm.feed(step_ids, step_valid, 1)
            z = logits[:, -1]
            p = None if greedy else probabilities(z, cfg.temperature)
            tok = _draw(p, z, cfg.temperature, generator)
            tokens.append(tok)
            probs_list.append(p)
            if hidden is not None and step > 0:
                hidden_list.append(hidden[:, -1])  # after-token state of x_step
            step_ids, step_valid = tok.unsqueeze(1), torch.ones((batch, 1), dtype=torch.bool)
        if cfg.keep_hidden:
            # One extra draft forward over x_gamma gives its after-token state; the draft cache
            # then holds all gamma drafts.
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
            prompt_indices=list(schedule.active),
            draft_tokens=draft_tokens,
            draft_probs=None if greedy else torch.stack(probs_list, 1),
            target_probs=None if greedy else probabilities(target_logits, cfg.temperature),
            target_logits=target_logits,
            draft_hidden=torch.stack(hidden_list, 1) if hidden_list else None,
            target_hidden=target_hidden[:, 1:] if target_hidden is not None else None,
            generated_lengths=torch.tensor([len(schedule.generated[p]) for p in schedule.active]),
        )
        verdict = acceptance(round_, generator)
        if on_round is not None:
            on_round(round_, verdict)
        n = verdict.num_accepted
        committed = [
            row[: int(k) + 1] for row, k in zip(verdict.output_tokens.tolist(), n, strict=True)
        ]
        mismatches = (draft_tokens != greedy_tokens(target_logits[:, :gamma])).sum(1)
        kept, finished = schedule.commit(committed)
        if progress is not None:
            progress.advance(sum(len(k) for k in kept), sum(finished))
        for row, p in enumerate(schedule.active):
            index = rounds_done.get(p, 0)
            stats.append(
                RoundStats(p, index, gamma, int(n[row]), len(kept[row]), int(mismatches[row]))
            )
            rounds_done[p] = index + 1
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
        rows = schedule.keep(finished)
        if rows is not None:
            dm.select_rows(rows)
            tm.select_rows(rows)
            target_pending = [target_pending[r] for r in rows.tolist()]
            draft_pending = [draft_pending[r] for r in rows.tolist()]
        dm.compact()
        tm.compact()
    stats.sort(key=lambda s: (s.prompt_index, s.round_index))
    if progress is not None:
        progress.close()
    return schedule.results(), stats
