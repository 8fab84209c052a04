"""Branch batches (``edgespec.decoding.branching``) on the ragged cache's one feed."""

from __future__ import annotations

from edgespec.decoding.branching import greedy_continue


def test_branch_batches_feed_each_token_once_through_the_ragged_cache(tiny_target, fed_tokens):
    """Every forward of a branch batch runs through ``RaggedCachedModel.forward`` and feeds each
    token once: the first feeds together, then one token per row still running.

    Budgets 3, 1, 5, no EOS: the first forward gives every row its first token (row 1 is done);
    rows 0 and 2 feed theirs (second tokens) and again (third: row 0 is done); row 2 alone feeds
    its third and fourth tokens, and stops at its fifth, which it never feeds.
    """
    feeds = [[7, 3, 19, 40], [5, 11], [23, 2, 8]]
    out = greedy_continue(tiny_target, [None, None, None], feeds, [3, 1, 5], [], pad_token_id=0)
    assert [len(c.tokens) for c in out] == [3, 1, 5]
    assert [c.stopped_by for c in out] == ["budget"] * 3
    assert fed_tokens == [9, 2, 2, 1, 1]
