"""Attention for a few query tokens on a CPU, as two batched matrix products.

PyTorch's fused CPU attention (``scaled_dot_product_attention``, which Hugging Face's "sdpa"
implementation calls) is built for long queries. Decoding feeds one token per row, a
verification gamma + 1, and for a batch of such rows, which needs a mask, the fused kernel
costs far more than the arithmetic: on a 2-core Zen 5 EPYC, bf16, the 1.5B target's attention
over 100 cached keys took 1.7 ms a call at 16 rows x 1 token (0.19 ms as two products; 29% of
a decoding step went to it) and 0.95 ms at 16 x 5 (0.42 ms). So a model loaded on the CPU
computes attention for at least :data:`MIN_ROWS` rows of at most :data:`SMALL_QUERY` new tokens
with :func:`few_query_attention`: the query heads that share a key/value head are stacked, so
grouped-query attention repeats no keys, and the scores and the softmax are computed in float32.
One row, longer queries (prefills) and other devices keep "sdpa".

The results equal "sdpa"'s to rounding, not bit for bit, so a decoded token can differ where two
candidates are within rounding of each other; speculative decoding stays exact, since the draft,
the verification and target-only decoding all use the same attention.
"""

from __future__ import annotations

import torch

IMPLEMENTATION = "edgespec_few_query"
"""The name this attention is registered under with transformers' ``AttentionInterface``."""

SMALL_QUERY = 9
"""The most new tokens per row computed by :func:`few_query_attention`: decoding steps and
verifications up to gamma = 8, the longest draft the workflow runs; longer queries (prefills)
go to "sdpa"."""


MIN_ROWS = 2
"""The fewest rows computed by :func:`few_query_attention`. At one row "sdpa" is as fast
(whole steps within 1% for the target and 3-5% faster for the draft on the Zen 5 EPYC), since
there it needs no mask."""


def few_query_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """A transformers attention function (``AttentionInterface``): ``query`` [B, H, Q, D],
    ``key``/``value`` [B, KV, L, D] (H a multiple of KV), ``attention_mask`` None or broadcastable
    to [B, 1, Q, L] (bool: True attends; float: added to the scores). Returns the output as
    [B, Q, H, D] and no attention weights, as "sdpa" does. A row whose keys are all masked gets
    zeros. Hands anything it does not cover to "sdpa": more than :data:`SMALL_QUERY` tokens,
    fewer than :data:`MIN_ROWS` rows, a device other than the CPU, dropout, a position bias or a
    soft cap."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    batch, heads, q_len, dim = query.shape
    if (
        q_len > SMALL_QUERY
        or batch < MIN_ROWS
        or query.device.type != "cpu"
        or dropout
        or kwargs.get("position_bias") is not None
        or kwargs.get("softcap") is not None
    ):
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    kv_heads, kv_len = key.shape[1], key.shape[2]
    group = heads // kv_heads
    scale = dim**-0.5 if scaling is None else scaling
    # query head kv * group + j reads key/value head kv (the order of repeat_kv); the scores are
    # computed in float32, as the fused kernel accumulates them (bf16 scores, rounded before the
    # softmax, put 6-10x its error in the output)
    wide = torch.promote_types(query.dtype, torch.float32)  # float64 stays float64
    stacked = query.reshape(batch, kv_heads, group * q_len, dim).to(wide)
    scores = torch.matmul(stacked, key.to(wide).transpose(-1, -2)).mul_(scale)
    scores = scores.view(batch, kv_heads, group, q_len, kv_len)
    if attention_mask is None:
        if q_len > 1 and (
            is_causal if is_causal is not None else getattr(module, "is_causal", True)
        ):
            # the new tokens are the last q_len keys: token i sees every key up to its own
            causal = torch.ones(q_len, kv_len, dtype=torch.bool).tril(kv_len - q_len)
            scores = scores.masked_fill(~causal, float("-inf"))
    elif attention_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attention_mask[:, :, None], float("-inf"))
    else:
        scores = scores + attention_mask[:, :, None].to(wide)
    weights = torch._safe_softmax(scores, dim=-1).to(value.dtype)
    out = torch.matmul(weights.view(batch, kv_heads, group * q_len, kv_len), value)
    out = out.view(batch, heads, q_len, value.shape[-1]).transpose(1, 2).contiguous()
    return out, None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(IMPLEMENTATION, few_query_attention)
    # the masks "sdpa" gets: bool [B, 1, Q, L], or None where a causal flag does
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)


def use_few_query_attention(model: torch.nn.Module) -> torch.nn.Module:
    """Make ``model`` (a transformers model using "sdpa") compute attention for few query tokens
    with :func:`few_query_attention`; returns it. Models with another attention implementation
    (eager, flash) are left as they are."""
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return model
    _register()
    model.set_attn_implementation(IMPLEMENTATION)
    return model
