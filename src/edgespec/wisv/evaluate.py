"""Pricing decoded WISV rounds under a channel (methods §4.3, 5, 6); torch-free.

A round's acceptance outcome does not depend on timing, so a decoded round table is priced
under any channel afterwards: :func:`round_latencies` applies the variant's upload protocol
(``VARIANT_PROTOCOL``: ids only, full-hidden or selective-hidden, ``edgespec.wisv.protocols``)
to each round's mismatch count and uplink rate, :func:`round_uplink_bits` counts its bits,
:func:`prompt_costs` sums them per answer (with the prompt's prefill) and :func:`wisv_metrics`
gives the run-level metrics.

Common random numbers: fading realisation s of the evaluation has the base seed
:func:`fading_seed` (config seed, s); under it, prompt p has its own fading stream, indexed by
round (:func:`round_gains`: Gauss-Markov blocks, the same standard normals whatever the fading
model, SNR, bandwidth or correlation). So every variant, at every channel and gamma, sees the
same draw for round r of prompt p under seed s. :func:`price_over_seeds` prices a channel-blind
variant's one decode under every seed, and a CSI-reading variant's per-seed decodes under their
own seeds (checking that they saw these very draws). This module imports neither torch nor
transformers, so the many small evaluation jobs start fast.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from edgespec import checks
from edgespec.seeding import derive_seed
from edgespec.variants import WISV_CSI_VARIANTS, WISV_VARIANTS
from edgespec.wireless.arq import ArqSettings
from edgespec.wireless.channel import (
    ChannelCondition,
    block_packet_error_rate,
    sample_power_gains,
    uplink_rate_bps,
)
from edgespec.wireless.delay import LatencyProfile
from edgespec.wisv.protocols import (
    BREAKDOWN_PARTS,
    RoundPayload,
    fh_payload,
    round_breakdown,
    sh_payload,
    vanilla_payload,
)

log = logging.getLogger(__name__)

VARIANTS = WISV_VARIANTS
CSI_VARIANTS = WISV_CSI_VARIANTS
HEAD_VARIANTS = ("head_no_csi", "head_relabel_no_csi", "wisv_fh", "wisv_sh")
VARIANT_PROTOCOL = {
    "vanilla_sd": "ids",
    "topk_accept": "ids",
    "head_no_csi": "fh",
    "head_relabel_no_csi": "fh",
    "wisv_fh": "fh",
    "wisv_sh": "sh",
}
"""Uplink protocol of each variant: ids only (vanilla payload), full-hidden or selective."""
HEAD_OF_VARIANT = {
    "head_no_csi": "no_csi_head",
    "head_relabel_no_csi": "relabel_no_csi_head",
    "wisv_fh": "wisv_head",
    "wisv_sh": "wisv_head",
}
"""The decision head each head variant runs (its key in rule profile_head's ``head_round_s``)."""

PROMPT_COLUMNS = (
    "fading_index",
    "prompt_id",
    "latency_s",
    "prefill_s",
    *BREAKDOWN_PARTS,
    "rounds",
    "tokens",
    "drafted",
    "accepted",
    "mismatches",
    "semantic_accepts",
    "uplink_bits",
)
"""Per (fading seed, prompt) costs of one variant, channel and gamma (:func:`price_over_seeds`);
``latency_s`` is ``prefill_s`` plus the ``BREAKDOWN_PARTS`` of the prompt's rounds [s]."""


def check_variant(variant: str) -> str:
    if variant not in VARIANTS:
        raise ValueError(f"unknown WISV variant {variant!r}; expected one of {VARIANTS}")
    return variant


def fading_seed(seed: int, index: int) -> int:
    """The base seed of the WISV evaluation's fading realisation ``index`` (0..K-1)."""
    return derive_seed(seed, "wisv-fading", checks.integer("fading seed index", index, 0))


def round_gains(
    condition: ChannelCondition,
    prompt_ids: Sequence[Any],
    num_rounds: int,
    seed: int,
) -> np.ndarray:
    """[len(prompt_ids), num_rounds] block-fading gains |h|^2: row i holds rounds 0.. of prompt
    ``prompt_ids[i]``, the first draws of its own stream (seeded by ``seed`` and the prompt's
    id), so a round's gain depends on neither the other prompts, nor ``num_rounds``, nor the
    variant or gamma; correlated across rounds by ``condition.correlation``."""
    if num_rounds < 0:
        raise ValueError(f"num_rounds must be >= 0, got {num_rounds}")
    out = np.ones((len(prompt_ids), int(num_rounds)), dtype=np.float64)
    for i, pid in enumerate(prompt_ids):
        stream = np.random.default_rng(derive_seed(seed, "prompt", pid))
        out[i] = sample_power_gains(condition, int(num_rounds), stream)
    return out


def attach_channel(rounds: pd.DataFrame, condition: ChannelCondition, seed: int) -> pd.DataFrame:
    """``rounds`` with the gain, uplink rate and packet error rate of each (prompt, round)
    under ``condition`` and fading base seed ``seed`` (:func:`round_gains`)."""
    ids = list(pd.unique(rounds["prompt_id"]))
    num = int(rounds["round"].max()) + 1 if len(rounds) else 0
    gains = round_gains(condition, ids, num, seed)
    row = rounds["prompt_id"].map({p: i for i, p in enumerate(ids)}).to_numpy()
    g = gains[row, rounds["round"].to_numpy()]
    return rounds.assign(
        gain=g,
        rate_bps=np.asarray(uplink_rate_bps(condition, g), dtype=np.float64),
        per=np.asarray(block_packet_error_rate(condition, g), dtype=np.float64),
        condition=condition.name,
    )


def _protocol_param(params: Mapping[str, Any], key: str, default: Any = None) -> int:
    if key in params:
        return int(params[key])
    if default is None:
        raise KeyError(f"protocol_params lacks {key!r}")
    return int(default)


def round_payload(
    variant: str, gamma: int, mismatches: int, params: Mapping[str, Any]
) -> RoundPayload:
    """The bits one round of ``variant`` moves with ``mismatches`` mismatches, under its protocol
    (``VARIANT_PROTOCOL``; ``params`` as in :func:`round_latencies`)."""
    vocab = _protocol_param(params, "vocab_size")
    protocol = VARIANT_PROTOCOL[check_variant(variant)]
    if protocol == "ids":
        return vanilla_payload(gamma, vocab)
    hidden = _protocol_param(params, "hidden_size")
    bits = _protocol_param(params, "bits_per_value", 16)
    if protocol == "fh":
        return fh_payload(gamma, vocab, hidden, bits)
    return sh_payload(gamma, mismatches, vocab, hidden, bits)


def _check_rounds(rounds: pd.DataFrame, gamma: int) -> None:
    missing = {"num_drafted", "num_mismatches", "draft_forwards", "rate_bps"} - set(rounds.columns)
    if missing:
        raise ValueError(f"rounds lacks column(s) {sorted(missing)}")
    if len(rounds) and not (rounds["num_drafted"] == gamma).all():
        raise ValueError(f"rounds were not drafted with gamma={gamma}")


def round_uplink_bits(
    rounds: pd.DataFrame, variant: str, protocol_params: Mapping[str, Any], gamma: int
) -> np.ndarray:
    """All uplink bits of each round under the variant's protocol [bit] (``VARIANT_PROTOCOL``)."""
    _check_rounds(rounds, gamma)
    m = rounds["num_mismatches"].to_numpy(dtype=np.int64)
    out = np.zeros(len(rounds), dtype=np.float64)
    for value in np.unique(m):
        out[m == value] = round_payload(
            variant, gamma, int(value), protocol_params
        ).total_uplink_bits
    return out


def round_breakdowns(
    rounds: pd.DataFrame,
    variant: str,
    protocol_params: Mapping[str, Any],
    profile: LatencyProfile,
    rtt_s: float,
    gamma: int,
    head_s: float = 0.0,
    downlink_rate_bps: float | None = None,
    arq: ArqSettings | None = None,
) -> pd.DataFrame:
    """Each round's latency by part [s] (``protocols.round_breakdown``), one row per round,
    columns ``BREAKDOWN_PARTS``.

    ``protocol_params``: vocab_size, hidden_size (the draft's), bits_per_value (default 16).
    vanilla_sd and topk_accept upload ids only; head_no_csi, head_relabel_no_csi and wisv_fh
    the FH payload (ids and all gamma hidden states); wisv_sh the SH payload of the round's
    mismatch count (an extra round trip iff it is > 0). Compute: the round's
    ``draft_forwards`` (every draft forward the decode ran in it) times
    ``profile.draft_token_s``, and ``profile.target_verify(gamma)``; ``head_s`` (the decision
    head's measured time per round [s], default 0) is charged to head variants
    (``HEAD_VARIANTS``) in rounds with a mismatch, the only rounds the head runs in. The uplink
    runs at the round's ``rate_bps`` and is resent under ARQ (``arq``) at the round's ``per``
    (:func:`attach_channel`; a table without that column was priced error-free).
    """
    _check_rounds(rounds, gamma)
    m = rounds["num_mismatches"].to_numpy(dtype=np.int64)
    rate = rounds["rate_bps"].to_numpy(dtype=np.float64)
    forwards = rounds["draft_forwards"].to_numpy(dtype=np.float64)
    per = rounds["per"].to_numpy(dtype=np.float64) if "per" in rounds else np.zeros(len(m))
    verify_s = profile.target_verify(gamma)
    out = np.zeros((len(rounds), len(BREAKDOWN_PARTS)), dtype=np.float64)
    for value in np.unique(m):
        sel = m == value
        extra = head_s if (variant in HEAD_VARIANTS and value > 0) else 0.0
        parts = round_breakdown(
            round_payload(variant, gamma, int(value), protocol_params),
            rate[sel],
            rtt_s,
            forwards[sel],
            profile.draft_token_s,
            verify_s,
            extra_verify_s=extra,
            downlink_rate_bps=downlink_rate_bps,
            per=per[sel],
            arq=arq,
        )
        out[sel] = np.stack([parts[k] for k in BREAKDOWN_PARTS], axis=1)
    return pd.DataFrame(out, columns=list(BREAKDOWN_PARTS), index=rounds.index)


def round_latencies(rounds: pd.DataFrame, *args, **kwargs) -> np.ndarray:
    """Latency of each round [s], shape [len(rounds)]: the sum of :func:`round_breakdowns`'
    parts (the same arguments: rounds, variant, protocol_params, profile, rtt_s, gamma, then
    head_s, downlink_rate_bps, arq)."""
    return round_breakdowns(rounds, *args, **kwargs).to_numpy().sum(axis=1)


def prompt_costs(
    rounds: pd.DataFrame, breakdown: pd.DataFrame, uplink_bits: Any, profile: LatencyProfile
) -> pd.DataFrame:
    """Per prompt (in order of first appearance): its answer's latency [s] (the prompt's
    prefill, ``profile.prefill_s(prompt_tokens)``, plus its rounds' latencies), each part of
    the rounds' latencies summed (``breakdown``, :func:`round_breakdowns`' rows), rounds,
    tokens committed, drafts, accepted drafts, mismatches, semantic accepts and uplink bits."""
    bits = np.asarray(uplink_bits, dtype=np.float64).reshape(-1)
    if len(breakdown) != len(rounds) or len(bits) != len(rounds):
        raise ValueError("one latency breakdown and one uplink size per round are needed")
    parts = list(BREAKDOWN_PARTS)
    frame = rounds.assign(
        _lat=breakdown[parts].to_numpy().sum(axis=1),
        _bits=bits,
        **{f"_{k}": breakdown[k].to_numpy() for k in parts},
    )
    grouped = frame.groupby("prompt_id", sort=False)
    out = pd.DataFrame(
        {
            "rounds": grouped.size(),
            "round_latency_s": grouped["_lat"].sum(),
            **{k: grouped[f"_{k}"].sum() for k in parts},
            "prompt_tokens": grouped["prompt_tokens"].first(),
            "tokens": grouped["num_committed"].sum(),
            "drafted": grouped["num_drafted"].sum(),
            "accepted": grouped["num_accepted"].sum(),
            "mismatches": grouped["num_mismatches"].sum(),
            "semantic_accepts": grouped["num_semantic_accepts"].sum(),
            "uplink_bits": grouped["_bits"].sum(),
        }
    ).reset_index()
    out["prefill_s"] = np.asarray(profile.prefill_s(out["prompt_tokens"].to_numpy()), dtype=float)
    out["latency_s"] = out["prefill_s"] + out["round_latency_s"]
    return out.drop(columns=["round_latency_s", "prompt_tokens"])


def price_over_seeds(
    rounds_by_seed: Mapping[int, pd.DataFrame],
    variant: str,
    condition: ChannelCondition,
    protocol_params: Mapping[str, Any],
    profile: LatencyProfile,
    gamma: int,
    seed: int,
    head_s: float = 0.0,
    arq: ArqSettings | None = None,
) -> pd.DataFrame:
    """Per (fading seed index, prompt) costs of one variant under one channel (``PROMPT_COLUMNS``).

    ``rounds_by_seed`` maps fading seed indices s to a round table: the same channel-free
    decode for every s (a channel-blind variant), whose rounds get the gains of seed s
    (:func:`attach_channel`), or the decode made under seed s (a CSI-reading variant), whose
    gains must be those very draws (ValueError otherwise: the decisions saw other fading).
    ``seed`` is the configured seed (:func:`fading_seed`); ``head_s`` the head's compute per
    round with a mismatch (head variants); ``arq`` the retransmission scheme (config key
    wisv.arq).
    """
    check_variant(variant)
    frames = []
    for index, rounds in sorted(rounds_by_seed.items()):
        base = fading_seed(seed, index)
        priced = attach_channel(rounds, condition, base)
        if "gain" in rounds and rounds["gain"].notna().any():
            if not np.allclose(rounds["gain"], priced["gain"], rtol=1e-12, atol=0):
                raise ValueError(
                    f"{variant}: the rounds decoded for fading seed {index} saw other gains "
                    f"than that seed draws under channel {condition.name!r}"
                )
        breakdown = round_breakdowns(
            priced, variant, protocol_params, profile, condition.rtt_s, gamma, head_s, arq=arq
        )
        bits = round_uplink_bits(priced, variant, protocol_params, gamma)
        costs = prompt_costs(priced, breakdown, bits, profile)
        costs.insert(0, "fading_index", int(index))
        frames.append(costs)
    if not frames:
        raise ValueError("no fading seed to price")
    return pd.concat(frames, ignore_index=True)[list(PROMPT_COLUMNS)]


def wisv_metrics(rounds: pd.DataFrame, latencies: Any, uplink_bits: Any = None) -> dict[str, float]:
    """Run-level metrics of one (variant, condition) (methods §6).

    aal: tokens committed per round (bonus/repair included); rounds_per_answer: rounds per
    prompt; e2e_latency_s: mean over prompts of the summed round latencies; throughput_tok_s:
    committed tokens / total latency; acceptance_rate: accepted / drafted draft tokens;
    semantic_accept_fraction: committed mismatched drafts / accepted drafts; mismatch_rate:
    mismatches / drafted; uplink_bytes_per_round and uplink_bytes_per_token (committed) from
    ``uplink_bits`` (``round_uplink_bits``; NaN when not given). Also num_prompts,
    num_rounds, num_tokens, total_latency_s.
    """
    lat = np.asarray(latencies, dtype=np.float64).reshape(-1)
    if len(lat) != len(rounds):
        raise ValueError(f"{len(lat)} latencies for {len(rounds)} rounds")
    if len(rounds) == 0:
        raise ValueError("no rounds")
    committed = rounds["num_committed"].to_numpy(dtype=np.float64)
    accepted = float(rounds["num_accepted"].sum())
    drafted = float(rounds["num_drafted"].sum())
    tokens = float(committed.sum())
    total = float(lat.sum())
    per_prompt = pd.Series(lat).groupby(rounds["prompt_id"].to_numpy()).sum()
    num_prompts = int(rounds["prompt_id"].nunique())
    if uplink_bits is None:
        up_round = up_token = math.nan
    else:
        bits = np.asarray(uplink_bits, dtype=np.float64).reshape(-1)
        if len(bits) != len(rounds):
            raise ValueError(f"{len(bits)} uplink sizes for {len(rounds)} rounds")
        up_round = float(bits.sum() / 8 / len(rounds))
        up_token = float(bits.sum() / 8 / tokens) if tokens > 0 else math.nan
    return {
        "num_prompts": num_prompts,
        "num_rounds": int(len(rounds)),
        "num_tokens": int(tokens),
        "aal": tokens / len(rounds),
        "rounds_per_answer": len(rounds) / num_prompts,
        "e2e_latency_s": float(per_prompt.mean()),
        "total_latency_s": total,
        "throughput_tok_s": tokens / total if total > 0 else math.nan,
        "acceptance_rate": accepted / drafted if drafted > 0 else math.nan,
        "semantic_accept_fraction": (
            float(rounds["num_semantic_accepts"].sum()) / accepted if accepted > 0 else 0.0
        ),
        "mismatch_rate": float(rounds["num_mismatches"].sum()) / drafted if drafted else math.nan,
        "uplink_bytes_per_round": up_round,
        "uplink_bytes_per_token": up_token,
    }


def protocol_params(provenance: Mapping[str, Any], bits_per_value: int) -> dict[str, int]:
    """The sizes :func:`round_latencies` reads, from rule fetch_models' provenance: the
    target's logits size as the vocabulary, the draft's hidden size, and ``bits_per_value``
    per hidden value (config key wisv.hidden_bits)."""
    models = provenance["models"]
    return {
        "vocab_size": models["target"]["logits_size"],
        "hidden_size": models["draft"]["hidden_size"],
        "bits_per_value": bits_per_value,
    }


def head_round_s(variant: str, head_times: Mapping[str, Any] | None) -> float:
    """The decision head's compute per round [s] charged to ``variant``: its head's
    (``HEAD_OF_VARIANT``) entry of rule profile_head's ``head_round_s``; 0 for a variant
    without a head, whose ``head_times`` may be None."""
    if check_variant(variant) not in HEAD_VARIANTS:
        return 0.0
    if head_times is None:
        raise ValueError(f"{variant} runs a decision head: its time per round is needed")
    return float(head_times["head_round_s"][HEAD_OF_VARIANT[variant]])


def rounds_by_fading_seed(
    variant: str,
    tables: Sequence[pd.DataFrame],
    csi_decode_seeds: Sequence[int] | None,
    fading_seeds: int | None,
) -> dict[int, pd.DataFrame]:
    """The round table each fading seed index prices: a CSI-reading variant's decode under
    each seed of ``csi_decode_seeds`` (config key wisv.csi_decode_seeds; ``tables`` in that
    order), a channel-blind variant's one decode (``tables[0]``) under every seed 0 ..
    ``fading_seeds`` - 1 (config key evaluation.fading_seeds)."""
    if variant in CSI_VARIANTS:
        return dict(zip(list(csi_decode_seeds or ()), tables, strict=True))
    if fading_seeds is None:
        raise ValueError(f"{variant} is channel-blind: evaluation.fading_seeds is needed")
    return {s: tables[0] for s in range(fading_seeds)}


def evaluate_variant(
    rounds_by_seed: Mapping[int, pd.DataFrame],
    variant: str,
    channel: str,
    condition: ChannelCondition,
    protocol: Mapping[str, Any],
    profile: LatencyProfile,
    gamma: int,
    seed: int,
    head_times: Mapping[str, Any] | None = None,
    arq: ArqSettings | None = None,
    regime: str = "measured",
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Rule evaluate_wisv: ``variant``'s rounds priced under ``channel`` (``condition``) and
    ``gamma`` over every fading seed (:func:`price_over_seeds`, the head's time per round
    :func:`head_round_s` of ``head_times`` charged, retransmissions under ``arq``), and their
    summary.

    Returns (costs: ``PROMPT_COLUMNS`` after regime, variant, channel, gamma; summary: the
    pricing ``regime`` (``edgespec.wisv.regimes``), variant, channel, gamma, condition, profile
    source, head_round_s [s], the fading seeds, each seed's
    e2e latency [s] (mean over prompts), tokens, rounds, summed latency [s], AAL and
    throughput [tokens/s], and their medians over seeds).
    """
    head_s = head_round_s(variant, head_times)
    costs = price_over_seeds(
        rounds_by_seed, variant, condition, protocol, profile, gamma, seed, head_s=head_s, arq=arq
    )
    costs.insert(0, "gamma", gamma)
    costs.insert(0, "channel", channel)
    costs.insert(0, "variant", variant)
    costs.insert(0, "regime", regime)
    per_seed = costs.groupby("fading_index").agg(
        e2e_latency_s=("latency_s", "mean"),
        tokens=("tokens", "sum"),
        rounds=("rounds", "sum"),
        latency_s=("latency_s", "sum"),
    )
    per_seed["aal"] = per_seed["tokens"] / per_seed["rounds"]
    per_seed["throughput_tok_s"] = per_seed["tokens"] / per_seed["latency_s"]
    summary = {
        "regime": regime,
        "variant": variant,
        "channel": channel,
        "gamma": gamma,
        "condition": condition.to_dict(),
        "profile_source": profile.source,
        "head_round_s": head_s,
        "fading_seeds": sorted(int(s) for s in rounds_by_seed),
        "median": per_seed[["e2e_latency_s", "aal", "throughput_tok_s"]].median().to_dict(),
        "per_seed": per_seed.reset_index().to_dict(orient="list"),
    }
    log.info(
        "%s %s g%d over %d seeds: e2e latency median %.3f s (%.3f to %.3f), AAL %.3f",
        variant,
        channel,
        gamma,
        len(per_seed),
        summary["median"]["e2e_latency_s"],
        float(np.min(per_seed["e2e_latency_s"])),
        float(np.max(per_seed["e2e_latency_s"])),
        summary["median"]["aal"],
    )
    return costs, summary
