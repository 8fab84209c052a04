"""Prompt prefills computed once and read by every decoding job of the same prompts.

Every decoding variant of a shard starts by prefilling the same prompts in both models, and on
a CPU that is compute-bound work (about 8 s of a 40 s job for the default's 16 prompts). A
:class:`PrefillStore` holds, per model role ("draft", "target") and per prompt, the keys and
values of every prompt token, the logits and the last-layer hidden state at the last token:
what :func:`edgespec.decoding.prefill.prefill` returns for the prompt. The engine builds its
caches from the store instead of running the forwards (``prefilled=`` of
:func:`~edgespec.decoding.tokenwise.generate_tokenwise` and
:func:`~edgespec.decoding.rounds.generate_rounds`).

A prompt's keys and values are those of its valid slots in the prefill, in order: the keys
already carry their rotary positions, so gathered into a fresh left-padded cache they give the
attention the unpadded prompt would. A round decoder, which feeds each prompt's last token in
its first round, takes all slots but the last. The numbers equal those of the job's own
prefill up to the float rounding of different matmul shapes, and every job that reads the same
store decodes from the same numbers.

File layout (safetensors): ``prompt_tokens`` [T] and ``prompt_lengths`` [n] (int64, the
prompts concatenated), and per role ``{role}.kv`` [T, layers, 2, kv heads, head dim] (keys and
values of each prompt token, so that a prompt is one contiguous block and is read alone),
``{role}.logits`` [n, V] and ``{role}.hidden`` [n, H]. The metadata names the format and each
role's dtype and layer count.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import DynamicCache

from edgespec.decoding.cache import RaggedCachedModel, cache_layers
from edgespec.decoding.prefill import prefill

FORMAT = "edgespec-prefill-1"


class PrefillStoreError(ValueError):
    """A prefill store that cannot serve a model or prompts (names the file and the problem)."""


@dataclass(frozen=True)
class _Entry:
    source: int  # which loaded file
    row: int  # prompt index in that file (logits, hidden)
    offset: int  # first token in that file's token axis
    length: int


def _model_dtype(model: torch.nn.Module) -> torch.dtype:
    return next(model.parameters()).dtype


def _row_blocks(ragged: RaggedCachedModel) -> list[torch.Tensor]:
    """Each row's valid slots as one [L, layers, 2, heads, dim] block, on the CPU."""
    layers = cache_layers(ragged.cache)
    shapes = {(layer.keys.shape[1], layer.keys.shape[3]) for layer in layers}
    if len(shapes) != 1:
        raise NotImplementedError("a prefill store needs equal key shapes in every layer")
    stacked = torch.stack(
        [torch.stack([layer.keys, layer.values]) for layer in layers]
    )  # [layers, 2, B, heads, S, dim]
    blocks = []
    for b in range(ragged.num_rows):
        valid = ragged.slot_valid[b].nonzero().squeeze(1)
        block = stacked[:, :, b].index_select(3, valid)  # [layers, 2, heads, L, dim]
        blocks.append(block.permute(3, 0, 1, 2, 4).contiguous().cpu())
    return blocks


class PrefillStore:
    """Prefilled prompts of one or more store files (see the module docstring)."""

    def __init__(self) -> None:
        self._files: list[dict[str, object]] = []  # per file: lazily sliced tensors
        self._index: dict[tuple[int, ...], _Entry] = {}
        self._meta: dict[str, dict[str, str]] = {}  # role -> {"dtype", "layers"}
        self._paths: list[str] = []

    def __len__(self) -> int:
        return len(self._index)

    @property
    def roles(self) -> list[str]:
        return sorted(self._meta)

    # -- building -----------------------------------------------------------------------------

    @staticmethod
    def compute(
        models: Mapping[str, torch.nn.Module],
        prompts: Sequence[Sequence[int]],
        pad_token_id: int,
        batch_size: int,
        path: str | Path,
        progress=None,
    ) -> None:
        """Prefill ``prompts`` (each at least one token) in every model of ``models`` (role ->
        model), ``batch_size`` prompts per prefill, and write the store to ``path``
        atomically. ``progress`` (a :class:`~edgespec.decoding.progress.DecodeProgress`)
        advances by each prefilled chunk's tokens and prompts, in each model."""
        from safetensors.torch import save_file

        from edgespec.artifacts import atomic_path

        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        unique: dict[tuple[int, ...], None] = {}
        for i, prompt in enumerate(prompts):
            if len(prompt) < 1:
                raise ValueError(f"prompt {i} is empty")
            unique.setdefault(tuple(int(t) for t in prompt), None)
        order = list(unique)
        tensors: dict[str, torch.Tensor] = {
            "prompt_tokens": torch.tensor([t for p in order for t in p], dtype=torch.long),
            "prompt_lengths": torch.tensor([len(p) for p in order], dtype=torch.long),
        }
        metadata = {"format": FORMAT, "roles": ",".join(sorted(models))}
        for role, model in sorted(models.items()):
            kv, logits, hidden = [], [], []
            for start in range(0, len(order), batch_size):
                chunk = [list(p) for p in order[start : start + batch_size]]
                ragged, (out_logits, out_hidden) = prefill(
                    model, chunk, pad_token_id, keep_hidden=True
                )
                kv += _row_blocks(ragged)
                logits.append(out_logits[:, -1])
                hidden.append(out_hidden[:, -1])
                if progress is not None:
                    progress.advance(sum(len(p) for p in chunk), len(chunk))
            tensors[f"{role}.kv"] = torch.cat(kv).contiguous()
            tensors[f"{role}.logits"] = torch.cat(logits).contiguous()
            tensors[f"{role}.hidden"] = torch.cat(hidden).contiguous()
            metadata[f"{role}.dtype"] = str(_model_dtype(model)).removeprefix("torch.")
            metadata[f"{role}.layers"] = str(kv[0].shape[1])
        with atomic_path(path) as tmp:
            save_file(tensors, str(tmp), metadata=metadata)

    # -- reading ------------------------------------------------------------------------------

    @classmethod
    def load(cls, paths: Sequence[str | Path]) -> PrefillStore:
        """The stores written at ``paths``, as one (a prompt in several serves from the first).
        Tensors are read per prompt when a cache is built, not all at once."""
        from safetensors import safe_open

        store = cls()
        for source, path in enumerate(paths):
            path = str(path)
            try:
                handle = safe_open(path, framework="pt")
            except Exception as exc:  # noqa: BLE001 - any unreadable file gets the same message
                raise PrefillStoreError(f"cannot read the prefill store {path}: {exc}") from exc
            meta = handle.metadata() or {}
            if meta.get("format") != FORMAT:
                raise PrefillStoreError(
                    f"{path} is not a prefill store of this version (format "
                    f"{meta.get('format')!r}, expected {FORMAT!r}); rerun the prefill rule"
                )
            roles = [r for r in meta.get("roles", "").split(",") if r]
            for role in roles:
                seen = {"dtype": meta[f"{role}.dtype"], "layers": meta[f"{role}.layers"]}
                if store._meta.setdefault(role, seen) != seen:
                    raise PrefillStoreError(
                        f"{path} holds {role} prefills in {seen} but {store._paths[0]} in "
                        f"{store._meta[role]}: stores of different runs"
                    )
            lengths = handle.get_tensor("prompt_lengths").tolist()
            tokens = handle.get_tensor("prompt_tokens").tolist()
            store._files.append({"handle": handle, "roles": set(roles)})
            store._paths.append(path)
            offset = 0
            for row, length in enumerate(lengths):
                key = tuple(tokens[offset : offset + length])
                store._index.setdefault(key, _Entry(source, row, offset, length))
                offset += length
        return store

    def _entry(self, role: str, prompt: Sequence[int]) -> _Entry | None:
        """Where ``prompt``'s ``role`` prefill lies; None where this store has none."""
        entry = self._index.get(tuple(int(t) for t in prompt))
        if entry is None or role not in self._files[entry.source]["roles"]:
            return None
        return entry

    def covers(self, role: str, prompts: Sequence[Sequence[int]]) -> bool:
        """Whether every prompt has a prefill of ``role`` here."""
        return all(self._entry(role, prompt) is not None for prompt in prompts)

    def check_model(self, role: str, model: torch.nn.Module) -> None:
        """Raise :class:`PrefillStoreError` unless ``model`` decodes in the dtype and with the
        layer count the ``role`` prefills were computed with."""
        if role not in self._meta:
            raise PrefillStoreError(f"no {role} prefills in {', '.join(self._paths)}")
        meta = self._meta[role]
        dtype = str(_model_dtype(model)).removeprefix("torch.")
        layers = getattr(model.config, "num_hidden_layers", None)
        if meta["dtype"] != dtype or (layers is not None and int(meta["layers"]) != layers):
            raise PrefillStoreError(
                f"the {role} prefills in {', '.join(self._paths)} were computed in "
                f"{meta['dtype']} with {meta['layers']} layers, but the {role} model decodes in "
                f"{dtype} with {layers} layers: rerun the prefill rule for this model pair"
            )

    def _read(self, entry: _Entry, name: str, rows: slice) -> torch.Tensor:
        return self._files[entry.source]["handle"].get_slice(name)[rows]

    def cache(
        self,
        role: str,
        model: torch.nn.Module,
        prompts: Sequence[Sequence[int]],
        keep_hidden: bool = False,
        with_outputs: bool = True,
    ) -> tuple[RaggedCachedModel, tuple[torch.Tensor, torch.Tensor | None] | None]:
        """What ``prefill(model, prompts, ...)`` returns, read from the store: the cache of
        each prompt and, ``with_outputs``, the logits [B, 1, V] (and hidden states [B, 1, H]
        with ``keep_hidden``) at its last token. Without outputs, the cache of each prompt but
        its last token (what :func:`edgespec.decoding.rounds.generate_rounds` prefills)."""
        self.check_model(role, model)
        entries = []
        for i, prompt in enumerate(prompts):
            entry = self._entry(role, prompt)
            if entry is None:
                raise PrefillStoreError(
                    f"prompt {i} ({len(prompt)} tokens) has no {role} prefill in "
                    f"{', '.join(self._paths)}: the store was computed for other prompts"
                )
            entries.append(entry)
        drop = 0 if with_outputs else 1
        keep = [e.length - drop for e in entries]
        width = max(keep, default=0)
        ragged = RaggedCachedModel(model, keep_hidden)
        ragged.start(len(entries))
        if width > 0:
            blocks = [
                self._read(e, f"{role}.kv", slice(e.offset, e.offset + n))
                for e, n in zip(entries, keep, strict=True)
            ]
            _, layers, _, heads, dim = blocks[0].shape
            full = blocks[0].new_zeros((layers, 2, len(entries), heads, width, dim))
            for b, (block, n) in enumerate(zip(blocks, keep, strict=True)):
                if n:
                    full[:, :, b, :, width - n :] = block.permute(1, 2, 3, 0, 4)
            ragged.cache = DynamicCache()
            for layer in range(layers):
                ragged.cache.update(full[layer, 0], full[layer, 1], layer)
            ragged.slot_valid = torch.zeros((len(entries), width), dtype=torch.bool)
            for b, n in enumerate(keep):
                ragged.slot_valid[b, width - n :] = True
            ragged.slot_valid = ragged.slot_valid.to(ragged.device)
            ragged.cache = _to_device(ragged.cache, ragged.device)
        ragged.next_position = torch.tensor(keep, dtype=torch.long, device=ragged.device)
        if not with_outputs:
            return ragged, None
        logits = torch.stack(
            [self._read(e, f"{role}.logits", slice(e.row, e.row + 1)) for e in entries]
        )
        hidden = (
            torch.stack([self._read(e, f"{role}.hidden", slice(e.row, e.row + 1)) for e in entries])
            if keep_hidden
            else None
        )
        return ragged, (logits, hidden)


def _to_device(cache: DynamicCache, device: torch.device) -> DynamicCache:
    if device.type == "cpu":
        return cache
    for layer in cache_layers(cache):
        layer.keys, layer.values = layer.keys.to(device), layer.values.to(device)
    return cache
