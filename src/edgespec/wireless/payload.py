"""Payload sizes of a top-k distribution upload [bit] (methods §3.1, 3.4); torch-free.

Each uploaded entry carries one probability of ``prob_bits`` bits and one vocabulary index of
ceil(log2 |V|) bits, so a top-k upload costs B(k) = k (b_p + ceil(log2 |V|)) bits and standard
HLM (k = |V|) the whole distribution.
"""

from __future__ import annotations

import math


def index_bits(vocab_size: int) -> int:
    """Bits to address one vocabulary entry: ceil(log2 |V|)."""
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
    return math.ceil(math.log2(vocab_size))


def upload_bits(k, vocab_size: int, prob_bits: int = 8):
    """Payload of a top-k upload, B(k) = k * (b_p + ceil(log2 |V|)) bits (methods §3.1).

    ``k`` is an int or an array (numpy or torch) of upload sizes.

    Standard HLM uploads k = |V| entries: for a 32,000-token vocabulary and b_p = 8 that is
    736,000 bits = 92 kB per token.
    """
    return k * (prob_bits + index_bits(vocab_size))
