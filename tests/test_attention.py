"""Attention over a few query tokens as two products (edgespec.models.attention) against
PyTorch's fused attention, which Hugging Face's "sdpa" calls."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from edgespec.decoding.engine import RaggedCachedModel
from edgespec.models.attention import (
    IMPLEMENTATION,
    MIN_ROWS,
    SMALL_QUERY,
    few_query_attention,
    use_few_query_attention,
)
from edgespec.models.tiny import build_tiny_model


class _Heads(torch.nn.Module):
    """What an attention function reads off its module: the query heads per key/value head."""

    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def _qkv(batch, heads, kv_heads, q_len, kv_len, dim=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, q_len, dim, generator=g)
    k = torch.randn(batch, kv_heads, kv_len, dim, generator=g)
    v = torch.randn(batch, kv_heads, kv_len, dim, generator=g)
    return q, k, v


def _reference(q, k, v, mask):
    """Every query head against its own key/value head, keys repeated; [B, Q, H, D]."""
    group = q.shape[1] // k.shape[1]
    out = F.scaled_dot_product_attention(
        q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), attn_mask=mask
    )
    return out.transpose(1, 2)


@pytest.mark.parametrize("q_len", [1, 3, SMALL_QUERY])
def test_grouped_heads_and_a_ragged_mask_match_fused_attention(q_len):
    q, k, v = _qkv(batch=3, heads=6, kv_heads=2, q_len=q_len, kv_len=11)
    mask = torch.ones(q_len, 11, dtype=torch.bool).tril(11 - q_len).expand(3, 1, q_len, 11).clone()
    mask[0, ..., :4] = False  # a left-padded row
    mask[2, ..., 7] = False  # a rejected slot left in the cache
    out, weights = few_query_attention(_Heads(3), q, k, v, mask)
    assert weights is None
    assert out.shape == (3, q_len, 6, 8)
    torch.testing.assert_close(out, _reference(q, k, v, mask), rtol=1e-5, atol=1e-5)


def test_no_mask_means_causal_over_the_new_tokens():
    q, k, v = _qkv(batch=2, heads=4, kv_heads=2, q_len=4, kv_len=9)
    causal = torch.ones(4, 9, dtype=torch.bool).tril(5)  # token i sees keys up to 5 + i
    out, _ = few_query_attention(_Heads(2), q, k, v, None)
    torch.testing.assert_close(out, _reference(q, k, v, causal), rtol=1e-5, atol=1e-5)
    # one new token sees every key
    out, _ = few_query_attention(_Heads(2), q[:, :, :1], k, v, None)
    torch.testing.assert_close(out, _reference(q[:, :, :1], k, v, None), rtol=1e-5, atol=1e-5)


def test_an_additive_mask_and_a_given_scale():
    q, k, v = _qkv(batch=2, heads=4, kv_heads=1, q_len=2, kv_len=6)
    bias = torch.randn(2, 1, 2, 6, generator=torch.Generator().manual_seed(3))
    out, _ = few_query_attention(_Heads(4), q, k, v, bias, scaling=0.2)
    expected = F.scaled_dot_product_attention(
        q, k.expand(2, 4, 6, 8), v.expand(2, 4, 6, 8), attn_mask=bias, scale=0.2
    ).transpose(1, 2)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_a_row_with_every_key_masked_gets_zeros():
    q, k, v = _qkv(batch=2, heads=2, kv_heads=2, q_len=1, kv_len=5)
    mask = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    mask[1] = False
    out, _ = few_query_attention(_Heads(1), q, k, v, mask)
    assert torch.isfinite(out).all()
    assert (out[1] == 0).all()
    torch.testing.assert_close(out[:1], _reference(q[:1], k[:1], v[:1], None))


def test_bf16_scores_are_kept_in_float32():
    # Against attention computed in float32 on the same bf16 inputs: scores rounded to bf16
    # before the softmax put 6-10x the fused kernel's error in the output; kept in float32 the
    # error is the fused kernel's.
    q, k, v = (
        t.mul(m).bfloat16() for t, m in zip(_qkv(4, 4, 2, 1, 300, dim=64), (3, 3, 1), strict=True)
    )
    exact = _reference(q.float(), k.float(), v.float(), None)
    ours, _ = few_query_attention(_Heads(2), q, k, v, None)
    fused = _reference(q, k, v, None)
    assert (ours.float() - exact).abs().max() < 2 * (fused.float() - exact).abs().max()


@pytest.mark.parametrize(("batch", "q_len"), [(2, SMALL_QUERY + 1), (MIN_ROWS - 1, 1)])
def test_long_queries_and_single_rows_go_to_sdpa_unchanged(batch, q_len):
    q, k, v = _qkv(batch=batch, heads=4, kv_heads=2, q_len=q_len, kv_len=SMALL_QUERY + 1)
    mask = torch.ones(q_len, SMALL_QUERY + 1, dtype=torch.bool).tril(SMALL_QUERY + 1 - q_len)
    mask = mask.expand(batch, 1, q_len, SMALL_QUERY + 1)
    out, _ = few_query_attention(_Heads(2), q, k, v, mask)
    expected, _ = sdpa_attention_forward(_Heads(2), q, k, v, mask)
    assert torch.equal(out, expected)


def test_a_model_decodes_as_with_sdpa():
    ours = build_tiny_model(61, seed=0)
    assert ours.config._attn_implementation == IMPLEMENTATION
    fused = copy.deepcopy(ours)
    fused.set_attn_implementation("sdpa")
    a, b = RaggedCachedModel(ours), RaggedCachedModel(fused)
    g = torch.Generator().manual_seed(1)
    # a prefill longer than SMALL_QUERY, then ragged steps of one and of three tokens
    tokens = torch.randint(0, 61, (3, SMALL_QUERY + 4), generator=g)
    valid = torch.ones_like(tokens, dtype=torch.bool)
    valid[0, :5] = False
    for width in (tokens.shape[1], 1, 3, 1):
        if width != tokens.shape[1]:
            tokens = torch.randint(0, 61, (3, width), generator=g)
            valid = torch.ones_like(tokens, dtype=torch.bool)
            valid[1, -1] = False
        ours_logits, _ = a.feed(tokens, valid, width)
        fused_logits, _ = b.feed(tokens, valid, width)
        torch.testing.assert_close(ours_logits[valid], fused_logits[valid], rtol=1e-5, atol=1e-5)


def test_other_attention_implementations_are_left_alone():
    model = build_tiny_model(61, seed=0)
    model.set_attn_implementation("eager")
    assert use_few_query_attention(model).config._attn_implementation == "eager"
