"""What every decoding run needs besides the models (:class:`DecodingConfig`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


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
