"""Prompt tokenisation with the model's chat template."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _as_id_list(encoded: Any) -> list[int]:
    if isinstance(encoded, Mapping) or hasattr(encoded, "keys"):
        encoded = encoded["input_ids"]
    if hasattr(encoded, "tolist"):
        encoded = encoded.tolist()
    encoded = list(encoded)
    if encoded and isinstance(encoded[0], (list, tuple)):
        if len(encoded) != 1:
            raise ValueError(f"expected one sequence of token ids, got a batch of {len(encoded)}")
        encoded = list(encoded[0])
    return [int(t) for t in encoded]


def chat_token_ids(tokenizer: Any, prompt: str, system: str | None = None) -> list[int]:
    """Token ids of ``prompt`` as one user turn plus the assistant generation prompt.

    Uses the tokenizer's chat template (``system`` as a system turn when given); a tokenizer
    without a chat template gets the plain text (system text, a blank line, then the prompt)
    encoded with its special tokens.
    """
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": prompt}]
        if system:
            messages.insert(0, {"role": "system", "content": system})
        encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return _as_id_list(encoded)
    text = f"{system}\n\n{prompt}" if system else prompt
    return _as_id_list(tokenizer(text, add_special_tokens=True))
