"""The payload of each testbed message, bit-packed (``edgespec.testbed.bits``), and what of it
the delay model prices (methods §11).

Every encoder returns an :class:`Encoded`: the payload bytes, the bits the model's B counts
(``model_bits``) and the bits it treats as negligible (``control_bits``: the draft token d, k,
the resynchronised ids of skipped tokens, the prompt). A payload is ceil((model + control) / 8)
bytes; a frame adds ``wire.HEADER_BYTES``. Field widths (``WireSpec``): a token id
ceil(log2 |V|) bits (``edgespec.wireless.payload.index_bits``), a probability ``prob_bits``,
a hidden value ``hidden_bits`` (IEEE floats of 16 or 32 bits), k ceil(log2(|V| + 1)), an
accepted count ceil(log2(gamma + 1)), a count of ids 16 bits.

- PROMPT: n, then n ids (control).
- TOKEN_UP (CU-HLM): d, k, r, r resync ids (control); k probabilities, then their k indices
  (model: k (b_p + ceil(log2 |V|)), ``payload.upload_bits``).
- TOKEN_VERDICT: the committed id (model: one id down).
- DRAFT_IDS: gamma ids; DRAFT_FH: gamma ids, then gamma x H hidden values; HIDDEN: m x H
  hidden values; REQUEST: a gamma-bit mask; ROUND_VERDICT: accepted count and the
  repair/bonus id (model: exactly ``edgespec.wisv.protocols``' payloads).

Torch-free: arrays in, arrays out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from edgespec.testbed.bits import BitReader, BitWriter, uint_width
from edgespec.wireless.payload import index_bits

COUNT_BITS = 16
"""Width of a count of ids (the prompt's length, the resync ids of one upload)."""


@dataclass(frozen=True)
class WireSpec:
    """Sizes both ends agree on before an answer: |V|, bits per probability and per hidden
    value, the draft's hidden size and gamma (1 for the CU-HLM family)."""

    vocab_size: int
    prob_bits: int = 32
    hidden_size: int = 0
    hidden_bits: int = 32
    gamma: int = 1

    @property
    def id_bits(self) -> int:
        return index_bits(self.vocab_size)

    @property
    def k_bits(self) -> int:
        return uint_width(self.vocab_size)

    @property
    def count_bits(self) -> int:
        """Bits of a round's accepted count, 0..gamma."""
        return math.ceil(math.log2(self.gamma + 1))


@dataclass(frozen=True)
class Encoded:
    payload: bytes
    model_bits: int
    control_bits: int


def _done(writer: BitWriter, model_bits: int) -> Encoded:
    return Encoded(writer.to_bytes(), model_bits, writer.bits - model_bits)


def encode_empty() -> Encoded:
    """READY and END: no payload."""
    return Encoded(b"", 0, 0)


def token_up_control_bits(spec: WireSpec, resync: int) -> int:
    """Control bits of a TOKEN_UP carrying ``resync`` skipped ids: d, k, r and the r ids."""
    return spec.id_bits + spec.k_bits + COUNT_BITS + resync * spec.id_bits


def encode_prompt(spec: WireSpec, ids) -> Encoded:
    ids = np.asarray(ids, dtype=np.int64)
    w = BitWriter().uint(ids.size, COUNT_BITS).uints(ids, spec.id_bits)
    return _done(w, 0)


def decode_prompt(spec: WireSpec, payload: bytes) -> list[int]:
    r = BitReader(payload)
    ids = r.uints(r.uint(COUNT_BITS), spec.id_bits)
    r.finish()
    return [int(t) for t in ids]


@dataclass(frozen=True)
class TokenUpload:
    """A CU-HLM upload: the draft token, the k uploaded entries of x (indices and values, in
    the order the device's top-k gave them) and the ids of the tokens skipped since the last
    upload."""

    draft_token: int
    indices: np.ndarray
    values: np.ndarray
    resync: list[int]

    @property
    def k(self) -> int:
        return int(self.indices.size)


def encode_token_up(spec: WireSpec, upload: TokenUpload) -> Encoded:
    k = upload.k
    if not 1 <= k <= spec.vocab_size or upload.values.size != k:
        raise ValueError(f"an upload needs 1 <= k <= {spec.vocab_size} values and indices")
    w = BitWriter().uint(upload.draft_token, spec.id_bits).uint(k, spec.k_bits)
    w.uint(len(upload.resync), COUNT_BITS).uints(np.asarray(upload.resync, np.int64), spec.id_bits)
    w.floats(upload.values, spec.prob_bits).uints(upload.indices, spec.id_bits)
    return _done(w, k * (spec.prob_bits + spec.id_bits))


def decode_token_up(spec: WireSpec, payload: bytes) -> TokenUpload:
    r = BitReader(payload)
    d, k = r.uint(spec.id_bits), r.uint(spec.k_bits)
    resync = [int(t) for t in r.uints(r.uint(COUNT_BITS), spec.id_bits)]
    values = r.floats(k, spec.prob_bits)
    indices = r.uints(k, spec.id_bits).astype(np.int64)
    r.finish()
    if k < 1 or k > spec.vocab_size or (indices.size and indices.max() >= spec.vocab_size):
        raise ValueError(f"TOKEN_UP with k={k} or an index outside the vocabulary")
    return TokenUpload(d, indices, values, resync)


def encode_token_verdict(spec: WireSpec, token: int) -> Encoded:
    return _done(BitWriter().uint(token, spec.id_bits), spec.id_bits)


def decode_token_verdict(spec: WireSpec, payload: bytes) -> int:
    r = BitReader(payload)
    token = r.uint(spec.id_bits)
    r.finish()
    return token


def encode_draft(spec: WireSpec, ids, hidden=None) -> Encoded:
    """DRAFT_IDS (``hidden`` None) or DRAFT_FH (``hidden`` [gamma, H])."""
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    if ids.size != spec.gamma:
        raise ValueError(f"{ids.size} draft ids for gamma={spec.gamma}")
    w = BitWriter().uints(ids, spec.id_bits)
    bits = spec.gamma * spec.id_bits
    if hidden is not None:
        hidden = np.asarray(hidden)
        if hidden.shape != (spec.gamma, spec.hidden_size):
            raise ValueError(f"hidden states {hidden.shape}, expected ({spec.gamma}, H)")
        w.floats(hidden, spec.hidden_bits)
        bits += hidden.size * spec.hidden_bits
    return _done(w, bits)


def decode_draft(spec: WireSpec, payload: bytes, with_hidden: bool):
    """(ids [gamma], hidden [gamma, H] float32 or None)."""
    r = BitReader(payload)
    ids = r.uints(spec.gamma, spec.id_bits).astype(np.int64)
    hidden = None
    if with_hidden:
        flat = r.floats(spec.gamma * spec.hidden_size, spec.hidden_bits)
        hidden = flat.astype(np.float32).reshape(spec.gamma, spec.hidden_size)
    r.finish()
    return ids, hidden


def encode_request(spec: WireSpec, mask) -> Encoded:
    mask = np.asarray(mask, dtype=bool).reshape(-1)
    if mask.size != spec.gamma:
        raise ValueError(f"mask of {mask.size} positions for gamma={spec.gamma}")
    return _done(BitWriter().uints(mask.astype(np.int64), 1), spec.gamma)


def decode_request(spec: WireSpec, payload: bytes) -> np.ndarray:
    r = BitReader(payload)
    mask = r.uints(spec.gamma, 1).astype(bool)
    r.finish()
    return mask


def encode_hidden(spec: WireSpec, hidden) -> Encoded:
    hidden = np.asarray(hidden)
    if hidden.ndim != 2 or hidden.shape[1] != spec.hidden_size:
        raise ValueError(f"hidden states {hidden.shape}, expected (m, {spec.hidden_size})")
    w = BitWriter().floats(hidden, spec.hidden_bits)
    return _done(w, hidden.size * spec.hidden_bits)


def decode_hidden(spec: WireSpec, payload: bytes, rows: int) -> np.ndarray:
    r = BitReader(payload)
    flat = r.floats(rows * spec.hidden_size, spec.hidden_bits)
    r.finish()
    return flat.astype(np.float32).reshape(rows, spec.hidden_size)


def encode_round_verdict(spec: WireSpec, accepted: int, token: int) -> Encoded:
    w = BitWriter().uint(accepted, spec.count_bits).uint(token, spec.id_bits)
    return _done(w, spec.count_bits + spec.id_bits)


def decode_round_verdict(spec: WireSpec, payload: bytes) -> tuple[int, int]:
    r = BitReader(payload)
    accepted, token = r.uint(spec.count_bits), r.uint(spec.id_bits)
    r.finish()
    if accepted > spec.gamma:
        raise ValueError(f"ROUND_VERDICT accepts {accepted} of gamma={spec.gamma} drafts")
    return accepted, token
