"""WISV decoding of one variant, channel-free or under one channel and fading seed (methods
§4.1, 5).

Variants (fixed ids, ``edgespec.variants.WISV_VARIANTS``):

- ``vanilla_sd``: strict matching (lossless); uplink ids only.
- ``topk_accept``: accept x_i if it is among the target's top-k at i; uplink ids only (the
  edge needs no draft state).
- ``head_no_csi``: a decision head on [h_draft ; h_target] (judge/AutoJudge style) trained on
  the original labels; FH upload.
- ``head_relabel_no_csi``: the same inputs, trained on the channel-relabeled labels: the
  ablation that isolates what reading the CSI adds; FH upload.
- ``wisv_fh``: the CSI-aware head on [h_draft ; h_target ; phi(c)]; FH upload.
- ``wisv_sh``: the same head and decisions as ``wisv_fh``; SH (mismatch-first) upload.

:func:`decode_wisv` runs the decoding core's gamma-token rounds with the variant's acceptance
rule (``edgespec.wisv.acceptance``). The channel-blind variants are decoded once without a
channel (their decisions never read it) and priced afterwards under every channel and fading
seed; the CSI-reading ones see, each round, the block-fading gain of that round under one
channel and fading seed (``edgespec.wisv.evaluate.round_gains``) and its CSI features. One row
per (prompt, round). :func:`check_greedy_equivalence` is the runtime losslessness check of
vanilla greedy SD.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import torch

from edgespec.decoding.config import DecodingConfig
from edgespec.decoding.prefill import Prefills, prefill
from edgespec.decoding.progress import DecodeProgress
from edgespec.decoding.rounds import (
    AcceptanceRule,
    DraftRound,
    RoundStats,
    generate_rounds,
    strict_acceptance,
)
from edgespec.decoding.sampling import VerificationResult, greedy_tokens
from edgespec.wireless.channel import (
    ChannelCondition,
    csi_features,
    uplink_rate_bps,
)
from edgespec.wisv.acceptance import (
    ChannelRound,
    head_acceptance,
    target_choice,
    topk_acceptance,
)
from edgespec.wisv.evaluate import check_variant, round_gains
from edgespec.wisv.head import load_head
from edgespec.wisv.protocols import draft_forwards_per_round

log = logging.getLogger(__name__)

CHANNEL_FREE = "none"
"""The ``condition`` of rounds decoded without a channel (channel-blind variants)."""

ROUND_COLUMNS = (
    "variant",
    "condition",
    "prompt_id",
    "prompt_tokens",
    "round",
    "num_drafted",
    "num_accepted",
    "num_committed",
    "num_mismatches",
    "num_semantic_accepts",
    "draft_forwards",
    "gain",
    "rate_bps",
)


CsiEncoder = Callable[[ChannelCondition, float], Any]
"""(condition, |h|^2 of the round) -> CSI feature vector phi(c) (the head's training order)."""


def csi_vector_encoder(feature_names: Sequence[str]) -> CsiEncoder:
    """An encoder picking ``feature_names`` (keys of
    ``edgespec.wireless.channel.csi_features``, e.g. the ``phi_<name>`` columns of
    ``relabel.relabel_over_csi`` without the prefix) in order."""
    names = list(feature_names)
    if not names:
        raise ValueError("feature_names is empty")

    def encode(condition: ChannelCondition, gain: float) -> np.ndarray:
        feats = csi_features(condition, gain)
        missing = [k for k in names if k not in feats]
        if missing:
            raise KeyError(f"unknown CSI feature(s) {missing}; known: {sorted(feats)}")
        return np.array([float(feats[k]) for k in names], dtype=np.float64)

    return encode


CSI_DECODE = "wisv"
"""Rule decode_wisv_csi's variant: the CSI head's decisions under one channel and fading seed,
decoded as ``wisv_fh`` (``wisv_sh`` shares its decisions and is priced from the same rounds)."""

HEAD_DECODES = ("head_no_csi", "head_relabel_no_csi", CSI_DECODE)
"""The decodes whose acceptance is a trained decision head (they keep the hidden states)."""


class VariantRule(NamedTuple):
    """What a decode of one variant accepts with: the rule (None: strict matching), the CSI
    encoder (None: no CSI read) and whether the rounds keep their hidden states."""

    acceptance: AcceptanceRule | None
    csi_encoder: CsiEncoder | None
    keep_hidden: bool


def variant_rule(
    variant: str, head_path: str | None = None, top_k: int | None = None
) -> VariantRule:
    """The acceptance of rule decode_wisv's ``variant`` (or :data:`CSI_DECODE`): vanilla SD
    strict matching, ``topk_accept`` the top-``top_k`` rule (config key wisv.top_k), a head
    variant the decision head saved at ``head_path`` at its tau, with an encoder of its CSI
    features where it reads them."""
    if variant == "topk_accept":
        if top_k is None:
            raise ValueError("topk_accept needs config key wisv.top_k")
        return VariantRule(topk_acceptance(top_k), None, False)
    if variant not in HEAD_DECODES:
        check_variant(variant)
        return VariantRule(None, None, False)
    if head_path is None:
        raise ValueError(f"{variant} decodes with a trained decision head: give its file")
    head, extra = load_head(head_path)
    encoder = csi_vector_encoder(extra["csi_features"]) if head.d_csi else None
    return VariantRule(head_acceptance(head, extra["tau"]), encoder, True)


def decode_wisv(
    variant: str,
    draft: torch.nn.Module,
    target: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    prompt_ids: Sequence[Any],
    cfg: DecodingConfig,
    gamma: int,
    acceptance: AcceptanceRule | None,
    condition: ChannelCondition | None,
    fading_seed: int | None = None,
    csi_encoder: CsiEncoder | None = None,
    generator: torch.Generator | None = None,
    progress: DecodeProgress | None = None,
    prefilled: Prefills | None = None,
) -> tuple[pd.DataFrame, list[list[int]]]:
    """Decode ``prompts`` in gamma-token rounds, channel-free or under one channel.

    ``condition`` None decodes channel-free (the rule sees no channel; gains and rates are
    NaN). Otherwise ``fading_seed`` (``evaluate.fading_seed``) is required:
    ``round_gains(condition, prompt_ids, cfg.max_new_tokens, fading_seed)`` gives each
    (prompt, round) its gain before decoding (a round commits >= 1 token, so no prompt needs
    more rounds), the same draws ``evaluate.price_over_seeds`` prices every variant with, and
    each round's rule sees a ``ChannelRound`` with the rows' gains, rates and, with
    ``csi_encoder``, their CSI features [B, d_csi] (read by ``head_acceptance``).
    ``acceptance`` None is strict matching (vanilla SD). ``cfg`` must be greedy (temperature
    0); head rules also need ``cfg.keep_hidden``.

    Returns (rounds, completions): completions are the new tokens per prompt; rounds has one
    row per (prompt, round), ordered by prompt then round, with columns ``ROUND_COLUMNS``:
    prompt_tokens the prompt's length, num_accepted the rule's accepted prefix length (before
    budget/EOS cuts), num_committed the tokens kept (bonus or repair included), num_mismatches
    the drafts != target argmax among all gamma, num_semantic_accepts the mismatches among the
    committed draft tokens, draft_forwards the draft forwards the round ran
    (``protocols.draft_forwards_per_round``), gain |h|^2 and rate_bps the round's uplink rate.
    ``prefilled`` serves the prompts' prefills (``edgespec.decoding.prefill_store``).
    """
    check_variant(variant)
    if cfg.temperature != 0:
        raise ValueError("WISV decoding is greedy: cfg.temperature must be 0")
    if len(prompt_ids) != len(prompts):
        raise ValueError("prompts and prompt_ids need the same length")
    inner = acceptance or strict_acceptance(0.0)
    if condition is None:
        if csi_encoder is not None:
            raise ValueError("a CSI encoder needs a channel condition")
        gains = rates = np.full((len(prompts), cfg.max_new_tokens), np.nan)
    else:
        if fading_seed is None:
            raise ValueError("decoding under a channel needs its fading_seed")
        gains = round_gains(condition, prompt_ids, cfg.max_new_tokens, fading_seed)
        rates = np.asarray(uplink_rate_bps(condition, gains), dtype=np.float64).reshape(gains.shape)
    seen = [0] * len(prompts)
    masks: dict[tuple[int, int], list[bool]] = {}

    def rule(round_: DraftRound, gen: torch.Generator) -> VerificationResult:
        if condition is None:
            return inner(round_, gen)
        idx = np.asarray(round_.prompt_indices)
        r = np.asarray([seen[p] for p in round_.prompt_indices])
        g = gains[idx, r]
        csi = None
        if csi_encoder is not None:
            csi = torch.as_tensor(
                np.stack(
                    [
                        np.asarray(csi_encoder(condition, float(x)), dtype=np.float64).reshape(-1)
                        for x in g
                    ]
                )
            )
        wrapped = ChannelRound(
            **{f.name: getattr(round_, f.name) for f in fields(DraftRound)},
            round_indices=torch.as_tensor(r),
            gains=torch.as_tensor(g),
            rates_bps=torch.as_tensor(rates[idx, r]),
            csi=csi,
        )
        return inner(wrapped, gen)

    def on_round(round_: DraftRound, verdict: VerificationResult) -> None:
        g = round_.draft_tokens.shape[1]
        mism = (round_.draft_tokens != target_choice(round_)[:, :g]).tolist()
        for row, p in enumerate(round_.prompt_indices):
            masks[(p, seen[p])] = mism[row]
            seen[p] += 1

    completions, stats = generate_rounds(
        prompts,
        cfg,
        generator if generator is not None else torch.Generator().manual_seed(0),
        draft,
        target,
        gamma,
        acceptance=rule,
        on_round=on_round,
        progress=progress,
        prefilled=prefilled,
    )
    name = CHANNEL_FREE if condition is None else condition.name
    lengths = [len(p) for p in prompts]
    forwards = draft_forwards_per_round(gamma, cfg.keep_hidden)
    table = _round_table(variant, name, prompt_ids, lengths, stats, masks, gains, rates, forwards)
    return table, completions


def decode_job(
    variant: str,
    models: tuple[torch.nn.Module, torch.nn.Module],
    prompts: Sequence[Sequence[int]],
    prompt_ids: Sequence[Any],
    cfg: DecodingConfig,
    gamma: int,
    rule: VariantRule,
    *,
    condition: ChannelCondition | None = None,
    seed: int | None = None,
    progress: DecodeProgress | None = None,
    prefilled: Prefills | None = None,
    greedy_tie_margin: float | None = None,
) -> tuple[pd.DataFrame, list[list[int]]]:
    """Rule decode_wisv's job: :func:`decode_wisv` of ``variant`` (:data:`CSI_DECODE` as
    ``wisv_fh``) with the (draft, target) ``models`` and its ``rule``, under ``condition`` and
    fading ``seed`` where given, logging its tokens, rounds and seconds. With
    ``greedy_tie_margin`` (vanilla SD at the smallest gamma, config key
    wisv.greedy_tie_margin) the run's losslessness is checked too
    (:func:`check_greedy_equivalence`)."""
    draft, target = models
    start = time.perf_counter()
    rounds, completions = decode_wisv(
        "wisv_fh" if variant == CSI_DECODE else variant,
        draft,
        target,
        prompts,
        prompt_ids,
        cfg,
        gamma,
        rule.acceptance,
        condition,
        fading_seed=seed,
        csi_encoder=rule.csi_encoder,
        progress=progress,
        prefilled=prefilled,
    )
    elapsed = time.perf_counter() - start
    if greedy_tie_margin is not None:
        start = time.perf_counter()
        check = check_greedy_equivalence(
            target,
            prompts,
            completions,
            greedy_tie_margin,
            prefilled=prefilled,
            pad_token_id=cfg.pad_token_id,
        )
        log.info(
            "greedy SD vs the target's greedy choices, teacher-forced (%.1f s): %s",
            time.perf_counter() - start,
            check,
        )
    log.info(
        "%s g%d %s: %d tokens, %d rounds in %.1f s",
        variant,
        gamma,
        "channel-free" if condition is None else f"{condition.name}, fading seed {seed}",
        int(rounds["num_committed"].sum()),
        len(rounds),
        elapsed,
    )
    return rounds, completions


def _round_table(
    variant: str,
    condition: str,
    prompt_ids: Sequence[Any],
    prompt_lengths: Sequence[int],
    stats: Sequence[RoundStats],
    masks: Mapping[tuple[int, int], list[bool]],
    gains: np.ndarray,
    rates: np.ndarray,
    draft_forwards: int,
) -> pd.DataFrame:
    records = []
    for s in sorted(stats, key=lambda s: (s.prompt_index, s.round_index)):
        key = (s.prompt_index, s.round_index)
        if key not in masks:
            raise RuntimeError(f"no round record for prompt {key[0]}, round {key[1]}")
        committed_drafts = min(s.num_accepted, s.num_committed)
        records.append(
            {
                "variant": variant,
                "condition": condition,
                "prompt_id": prompt_ids[s.prompt_index],
                "prompt_tokens": int(prompt_lengths[s.prompt_index]),
                "round": s.round_index,
                "num_drafted": s.num_drafted,
                "num_accepted": s.num_accepted,
                "num_committed": s.num_committed,
                "num_mismatches": s.num_mismatches,
                "num_semantic_accepts": int(sum(masks[key][:committed_drafts])),
                "draft_forwards": draft_forwards,
                "gain": float(gains[key]),
                "rate_bps": float(rates[key]),
            }
        )
    return pd.DataFrame(records, columns=list(ROUND_COLUMNS))


GREEDY_CHECK_CHUNK = 16
"""New tokens per row that :func:`check_greedy_equivalence` feeds the target at once."""


@torch.inference_mode()
def check_greedy_equivalence(
    target: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    speculative: Sequence[Sequence[int]],
    tie_margin: float,
    prefilled: Prefills | None = None,
    pad_token_id: int = 0,
) -> dict[str, Any]:
    """Check that vanilla greedy SD committed the target's own greedy tokens.

    ``speculative`` holds the new tokens per prompt of greedy SD (an ending EOS included). The
    target reads each prompt followed by its tokens in a fresh cache (the prompts' caches from
    ``prefilled`` where given), :data:`GREEDY_CHECK_CHUNK` tokens per forward, and every token
    must be its argmax after the tokens before it: then, token by token, the SD output is what
    target-only greedy decoding gives, EOS included, without decoding it one step at a time. A
    token that is not the argmax is accepted only as a numerical near-tie (its logit within
    ``tie_margin`` of the argmax's, as matmuls of different shapes round differently);
    otherwise AssertionError naming the row and the token. Returns counts for the log.
    """
    if prefilled is not None:
        ragged, (last, _) = prefilled.cache("target", target, prompts, with_outputs=True)
    else:
        ragged, (last, _) = prefill(target, prompts, pad_token_id, with_outputs=True)
    lengths = torch.tensor([len(row) for row in speculative], dtype=torch.long)
    width = int(lengths.max()) if len(speculative) else 0
    tokens = torch.full((len(speculative), max(width, 1)), pad_token_id, dtype=torch.long)
    for b, row in enumerate(speculative):
        tokens[b, : len(row)] = torch.tensor(list(row), dtype=torch.long)
    near_ties, margins = 0, []
    diverged = torch.zeros(len(speculative), dtype=torch.bool)
    before_next = last[:, -1]  # the target's logits before each row's first new token
    for start in range(0, width, GREEDY_CHECK_CHUNK):
        stop = min(start + GREEDY_CHECK_CHUNK, width)
        chunk = tokens[:, start:stop]
        valid = torch.arange(start, stop).unsqueeze(0) < lengths.unsqueeze(1)
        out, _ = ragged.feed(chunk, valid, logits_to_keep=stop - start)
        # the logits before token j: before_next for j = start, then those after token j - 1
        before = torch.cat([before_next.unsqueeze(1).to(out.dtype), out[:, :-1]], dim=1)
        before_next = out[:, -1]
        best = greedy_tokens(before)
        off = valid & (best != chunk)
        for b, k in off.nonzero().tolist():
            margin = float(before[b, k, best[b, k]]) - float(before[b, k, chunk[b, k]])
            margins.append(margin)
            if margin > tie_margin:
                raise AssertionError(
                    f"greedy SD's new token {start + k} of prompt {b} is not the target's "
                    f"greedy choice after the tokens before it (logit margin {margin:.4f} > "
                    f"{tie_margin}): not a numerical near-tie"
                )
            near_ties += 1
        diverged |= off.any(dim=1)
    return {
        "prompts": len(prompts),
        "tokens": int(lengths.sum()),
        "identical": int((~diverged).sum()),
        "near_ties": near_ties,
        "max_margin": max(margins, default=0.0),
    }
