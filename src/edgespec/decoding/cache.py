"""The ragged KV cache: one causal LM whose cache rows advance at their own pace.

Rows advance at their own pace without re-padding: the cache keeps one slot per fed token,
and a per-row validity mask hides the slots of rejected drafts (and of padding) from attention.
Position ids count valid slots only, so a row's positions are those of an unpadded sequence.
Where the hidden slots take up a quarter of the cache, it is compacted (each row's valid slots
gathered to the right), so attention and memory track the valid tokens.

:meth:`RaggedCachedModel.forward` is the one cache feed: the decode loops
(:mod:`edgespec.decoding.tokenwise`, :mod:`edgespec.decoding.rounds`), the prompt prefill
(:mod:`edgespec.decoding.prefill`) and the branch batches of label mining
(:mod:`edgespec.decoding.branching`) all run their forwards through it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache

COMPACT_MIN_WASTE = 16
"""Compact a cache once at least this many slots, and a quarter of all slots, are hidden."""


def cache_layers(cache: DynamicCache) -> list:
    """The layers of ``cache``, each with ``keys`` and ``values`` [B, kv heads, S, head dim];
    NotImplementedError for a cache this module cannot gather from (sliding-window layers)."""
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
    def forward(
        self,
        tokens: torch.Tensor,
        valid: torch.Tensor,
        logits_to_keep: int,
        output_hidden_states: bool,
    ):
        """Append ``tokens`` [B, L] (``valid`` [B, L] marks real ones) to the cache: the one
        cache feed. Each valid token's position is its row's count of valid slots before it.

        Returns the model's output (logits [B, logits_to_keep, V], and with
        ``output_hidden_states`` every layer's hidden states) where the model computed it.
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
            output_hidden_states=output_hidden_states,
        )
        self.forward_calls += 1
        self.next_position = self.next_position + valid.long().sum(1)
        return out

    @torch.inference_mode()
    def feed(
        self, tokens: torch.Tensor, valid: torch.Tensor, logits_to_keep: int
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Append ``tokens`` [B, L] (``valid`` [B, L] marks real ones) to the cache.

        Returns the logits [B, logits_to_keep, V] at the last positions and, with
        ``keep_hidden``, the last-layer hidden states [B, logits_to_keep, H] there, both on
        the CPU: sampling and bookkeeping stay there whatever device the model runs on.
        """
        out = self.forward(tokens, valid, logits_to_keep, self.keep_hidden)
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
        for layer in cache_layers(self.cache):
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
            for index, layer in enumerate(cache_layers(self.cache)):
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
            layers = cache_layers(template)
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
        own = cache_layers(self.cache) if self.cache is not None else None
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
