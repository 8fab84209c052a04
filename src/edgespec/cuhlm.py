"""Evaluation of the CU-HLM family of variants (SPEC 3.5, 5 and 6).

Three steps, kept apart so the channel can be swept without decoding again:

1. :func:`decode_variant` decodes prompts under one variant and records one row per generated
   token (what the device did, what the edge verified, x_d, y_d, beta and the measured TVD);
2. :func:`apply_channel` turns a token table into per-token delays under one channel condition
   and latency profile (block fading, one draw per token, common random numbers);
3. :func:`variant_metrics`, :func:`relative_to` and :func:`text_scores` give the SPEC 6
   metrics.

Token table columns (one row per generated token, in the order the engine produced them):
``prompt_id``, ``position`` (0-based index in the completion), ``uploaded`` (the device sent
a distribution), ``skipped`` (the device kept its token without verification; for SLM-only
every token), ``k`` (entries uploaded, 0 if not), ``draft_token`` (-1 where the draft did not
run), ``committed_token``, ``accepted`` (the committed token is the proposed one: verification
accepted it, or nothing was verified), ``u`` (NaN where not computed), ``x_d``, ``y_d``,
``beta`` = max(0, 1 - y_d / x_d), ``accept_prob`` = min(1, y_d / x_d) (the probability that the
LLM would have accepted the draft token), all NaN where a model did not run, and
``measured_tvd`` = TVD(r, r_hat) between the exact residual and the one the edge built from the
uploaded x_hat (0 for k = |V| and for rows that were not uploaded).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch

from edgespec import scoring
from edgespec.channel import ChannelCondition, sample_power_gains, uplink_rate_bps
from edgespec.compression import reconstruct_topk, total_variation, upload_bits
from edgespec.delay import LatencyProfile, tokenwise_delays
from edgespec.engine import DecodingConfig, TokenPolicy, TokenStep, generate_tokenwise
from edgespec.policies import UNCERTAINTY_VARIANTS, VARIANTS
from edgespec.sampling import residual_distribution
from edgespec.seeding import derive_seed

TOKEN_COLUMNS = (
    "prompt_id",
    "position",
    "uploaded",
    "skipped",
    "k",
    "draft_token",
    "committed_token",
    "accepted",
    "u",
    "x_d",
    "y_d",
    "beta",
    "accept_prob",
    "measured_tvd",
)

RELATIVE_KEYS = ("exact_match", "semantic_accuracy", "similarity_to_llm", "answer_fidelity")
"""Quality metrics that :func:`relative_to` also expresses as a fraction of the reference's."""


def uses_uncertainty(variant: str) -> bool:
    """Whether the device computes u(t) to decide, so tau_unc is charged per token."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; known: {', '.join(VARIANTS)}")
    return variant in UNCERTAINTY_VARIANTS


# ---------------------------------------------------------------------------------------------
# Decoding
# ---------------------------------------------------------------------------------------------


def _gather(probs: torch.Tensor, tokens: torch.Tensor) -> np.ndarray:
    return _np(probs.to(torch.float64).gather(1, tokens.view(-1, 1)).squeeze(1))


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def _record_step(step: TokenStep, prompt_ids: Sequence[str], computes_u: bool) -> dict:
    batch = len(step.prompt_indices)
    nan = np.full(batch, np.nan)
    x, y, d = step.draft_probs, step.target_probs, step.draft_tokens
    x_d = _gather(x, d) if x is not None and d is not None else nan
    y_d = _gather(y, d) if y is not None and d is not None else nan
    hybrid = x is not None and y is not None
    if hybrid:
        ratio = y_d / np.maximum(x_d, np.finfo(np.float64).tiny)
        accept_prob = np.minimum(1.0, ratio)
        beta = 1.0 - accept_prob
        skipped = _np(step.skipped).astype(bool)
        k = _np(step.upload_k).astype(np.int64)
        uploaded = ~skipped
        accepted = _np(step.accepted).astype(bool)
    else:
        accept_prob = beta = nan
        skipped = np.full(batch, y is None)  # SLM-only keeps every draft token unverified
        uploaded = np.zeros(batch, dtype=bool)
        k = np.zeros(batch, dtype=np.int64)
        accepted = np.ones(batch, dtype=bool)
    tvd = np.zeros(batch)
    if hybrid:
        vocab = x.shape[-1]
        rows = np.flatnonzero(uploaded & (k < vocab))
        if rows.size:
            idx = torch.as_tensor(rows, device=x.device)
            xs, ys = x[idx].to(torch.float64), y[idx].to(torch.float64)
            x_hat = reconstruct_topk(xs, torch.as_tensor(k[rows], device=x.device))
            exact = residual_distribution(ys, xs)
            approx = residual_distribution(ys, x_hat)
            tvd[rows] = _np(total_variation(exact, approx))
    u = (
        _np(step.uncertainty.to(torch.float64))
        if computes_u and step.uncertainty is not None
        else nan
    )
    return {
        "prompt_id": [prompt_ids[i] for i in step.prompt_indices],
        "position": _np(step.position).astype(np.int64),
        "uploaded": uploaded,
        "skipped": skipped,
        "k": k,
        "draft_token": _np(d).astype(np.int64) if d is not None else np.full(batch, -1),
        "committed_token": _np(step.committed).astype(np.int64),
        "accepted": accepted,
        "u": u,
        "x_d": x_d,
        "y_d": y_d,
        "beta": beta,
        "accept_prob": accept_prob,
        "measured_tvd": tvd,
    }


def decode_variant(
    variant: str,
    draft: torch.nn.Module | None,
    target: torch.nn.Module | None,
    prompts: Sequence[Sequence[int]],
    prompt_ids: Sequence[str],
    cfg: DecodingConfig,
    policy: TokenPolicy | None,
    generator: torch.Generator,
) -> tuple[pd.DataFrame, list[list[int]]]:
    """Decode ``prompts`` under ``variant``; returns (token table, new tokens per prompt).

    ``llm_only`` runs the target alone, ``slm_only`` the draft alone (the other model may be
    None and is never called); every other variant runs both under ``policy`` (from
    :func:`edgespec.policies.build_policy`). See the module docstring for the columns.
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; known: {', '.join(VARIANTS)}")
    if len(prompts) != len(prompt_ids):
        raise ValueError(f"{len(prompts)} prompts but {len(prompt_ids)} prompt ids")
    if len(set(prompt_ids)) != len(prompt_ids):
        raise ValueError("prompt_ids must be unique (rows are grouped by prompt id)")
    if variant == "llm_only":
        draft, policy = None, None
        if target is None:
            raise ValueError("llm_only needs the target model")
    elif variant == "slm_only":
        target, policy = None, None
        if draft is None:
            raise ValueError("slm_only needs the draft model")
    else:
        if draft is None or target is None:
            raise ValueError(f"variant {variant!r} needs both the draft and the target model")
        if policy is None:
            raise ValueError(f"variant {variant!r} needs a policy (see policies.build_policy)")
    computes_u = policy is not None and policy.uncertainty_samples > 0
    chunks: list[dict] = []

    def on_step(step: TokenStep) -> None:
        chunks.append(_record_step(step, prompt_ids, computes_u))

    completions = generate_tokenwise(
        prompts, cfg, generator, draft=draft, target=target, policy=policy, on_step=on_step
    )
    table = _concat(chunks)
    # The engine reports every step of a row, including one cut by the token budget or EOS;
    # keep exactly the committed tokens (position < completion length).
    lengths = dict(zip(prompt_ids, (len(c) for c in completions), strict=True))
    keep = table["position"].to_numpy() < table["prompt_id"].map(lengths).to_numpy()
    table = table.loc[keep].reset_index(drop=True)
    if len(table) != sum(lengths.values()):
        raise RuntimeError(
            f"token table has {len(table)} rows but the completions hold {sum(lengths.values())} "
            "tokens"
        )
    return table, completions


def _concat(chunks: list[dict]) -> pd.DataFrame:
    if not chunks:
        return pd.DataFrame({c: pd.Series(dtype=_dtype(c)) for c in TOKEN_COLUMNS})
    columns = {c: np.concatenate([np.asarray(ch[c]) for ch in chunks]) for c in TOKEN_COLUMNS}
    table = pd.DataFrame(columns)
    return table.astype({c: _dtype(c) for c in TOKEN_COLUMNS})


def _dtype(column: str):
    if column == "prompt_id":
        return object
    if column in ("uploaded", "skipped", "accepted"):
        return bool
    if column in ("position", "k", "draft_token", "committed_token"):
        return np.int64
    return np.float64


# ---------------------------------------------------------------------------------------------
# Channel and delays
# ---------------------------------------------------------------------------------------------


def _prompt_groups(tokens: pd.DataFrame) -> list[np.ndarray]:
    """Row positions of each prompt (in order of first appearance), sorted by position."""
    codes, _ = pd.factorize(tokens["prompt_id"], sort=False)
    position = tokens["position"].to_numpy()
    order = np.lexsort((position, codes))
    bounds = np.flatnonzero(np.diff(codes[order])) + 1
    return np.split(order, bounds) if len(order) else []


def token_gains(tokens: pd.DataFrame, condition: ChannelCondition, rng) -> np.ndarray:
    """One block-fading power gain |h|^2 per token row, in the order of ``tokens``.

    Common random numbers: one integer is drawn from ``rng``; the gain of the token at
    (prompt p, position t) is the t-th draw of a stream seeded from that integer and p's id.
    Two variants evaluated with equally seeded ``rng`` therefore see the same gain at every
    (prompt, position) they both generate, whatever their other completions' lengths; in
    particular two tables with equal token counts per prompt see the same draws.
    """
    gains = np.ones(len(tokens))
    if condition.fading == "awgn":
        return gains
    base = int(rng.integers(0, 2**63 - 1))
    ids = tokens["prompt_id"].to_numpy()
    position = tokens["position"].to_numpy()
    for rows in _prompt_groups(tokens):
        pos = position[rows]
        if pos.min() < 0:
            raise ValueError("token positions must be >= 0")
        stream = np.random.default_rng(derive_seed(base, "gain", ids[rows[0]]))
        draws = sample_power_gains(condition, int(pos.max()) + 1, stream)
        gains[rows] = draws[pos]
    return gains


def apply_channel(
    tokens: pd.DataFrame,
    variant: str,
    condition: ChannelCondition,
    profile: LatencyProfile,
    vocab_size: int,
    prob_bits: int,
    rng: np.random.Generator,
    uses_uncertainty: bool,
    *,
    resync_bits_per_skipped: float = 0.0,
    downlink_bits: float = 0.0,
    downlink_rate_bps=None,
) -> np.ndarray:
    """Per-token delays tau(t) [s] of ``tokens`` under one channel, in the order of ``tokens``.

    Per prompt (rows ordered by position), :func:`edgespec.delay.tokenwise_delays` with
    B(t) = k (b_p + ceil(log2 |V|)) on uploads (``compression.upload_bits``), R(t) from the
    token's gain (:func:`token_gains`: one block-fading draw per token, common random numbers)
    and the condition's RTT. ``llm_only`` uses the LLM-only mode (tau_LLM per token, no
    uplink); ``slm_only`` and every skipped token pay tau_SLM (+ tau_unc when
    ``uses_uncertainty``, see :func:`uses_uncertainty`). Skipped token ids ride on the next
    upload (``resync_bits_per_skipped`` each); the downlink is free unless a
    ``downlink_rate_bps`` is given (the papers' convention).
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; known: {', '.join(VARIANTS)}")
    uploaded = tokens["uploaded"].to_numpy().astype(bool)
    k = tokens["k"].to_numpy().astype(np.int64)
    if variant in ("llm_only", "slm_only") and uploaded.any():
        raise ValueError(f"variant {variant!r} has no uploads, but the table marks some")
    if np.any(k[uploaded] < 1) or np.any(k[uploaded] > vocab_size):
        raise ValueError(f"uploaded rows need 1 <= k <= |V| = {vocab_size}")
    gains = token_gains(tokens, condition, rng)
    rates = np.asarray(uplink_rate_bps(condition, gains), dtype=float).reshape(-1)
    bits = np.where(uploaded, upload_bits(k, vocab_size, prob_bits), 0).astype(float)
    delays = np.zeros(len(tokens))
    llm_only = variant == "llm_only"
    for rows in _prompt_groups(tokens):
        dl_rate = downlink_rate_bps
        if dl_rate is not None and np.ndim(dl_rate) == 1:
            dl_rate = np.asarray(dl_rate, dtype=float)[rows]
        delays[rows] = tokenwise_delays(
            uploaded[rows],
            bits[rows],
            rates[rows],
            profile,
            condition.rtt_s,
            uses_uncertainty,
            uses_draft=not llm_only,
            uses_target_always=llm_only,
            downlink_bits=downlink_bits,
            resync_bits_per_skipped=0.0 if llm_only else resync_bits_per_skipped,
            downlink_rate_bps=dl_rate,
        )
    return delays


# ---------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------


def _mean(values: np.ndarray) -> float:
    return float(np.mean(values)) if values.size else float("nan")


def _resync_count(tokens: pd.DataFrame) -> int:
    """Skipped tokens that are followed by an upload of the same prompt (and so resent)."""
    uploaded = tokens["uploaded"].to_numpy().astype(bool)
    skipped = tokens["skipped"].to_numpy().astype(bool)
    total = 0
    for rows in _prompt_groups(tokens):
        up = uploaded[rows]
        if up.any():
            last = np.flatnonzero(up)[-1]
            total += int(skipped[rows][:last].sum())
    return total


def variant_metrics(
    tokens: pd.DataFrame,
    delays,
    vocab_size: int,
    prob_bits: int,
    *,
    resync_bits_per_skipped: float = 0.0,
) -> dict[str, float]:
    """The SPEC 6 metrics a token table and its delays give (one definition each).

    ``tokens``: generated tokens; ``total_delay_s``; ``throughput_tps`` = tokens / total
    delay; ``mean_token_latency_s``; ``end_to_end_latency_s`` (mean over prompts of the summed
    delay); ``uplink_bits_per_token`` (upload payloads, plus resynchronised skipped ids when
    ``resync_bits_per_skipped`` > 0, over all tokens) and ``uplink_bytes_per_token``;
    ``skip_rate`` and ``transmission_rate`` (fractions of tokens skipped / uploaded);
    ``true_skip_rate`` (mean accept_prob over skipped tokens: the fraction the LLM would have
    accepted; NaN if none skipped or no target ran); ``vocab_compression`` = 1 - mean k / |V|
    and ``mean_k`` over uploads; ``measured_tvd_mean`` and ``acceptance_rate`` over uploads;
    ``uploads``, ``num_prompts`` and ``interaction_rounds_per_answer`` (uploads per prompt).
    """
    delays = np.asarray(delays, dtype=float)
    n = len(tokens)
    if delays.shape != (n,):
        raise ValueError(f"delays must have shape [{n}], got {delays.shape}")
    uploaded = tokens["uploaded"].to_numpy().astype(bool)
    skipped = tokens["skipped"].to_numpy().astype(bool)
    k = tokens["k"].to_numpy().astype(np.int64)
    num_prompts = int(tokens["prompt_id"].nunique())
    total = float(delays.sum())
    per_prompt = pd.Series(delays).groupby(tokens["prompt_id"].to_numpy(), sort=False).sum()
    bits = float(np.sum(upload_bits(k[uploaded], vocab_size, prob_bits)))
    if resync_bits_per_skipped:
        bits += float(resync_bits_per_skipped) * _resync_count(tokens)
    accept_prob = tokens["accept_prob"].to_numpy(dtype=float)[skipped]
    mean_k = _mean(k[uploaded].astype(float))
    return {
        "tokens": n,
        "num_prompts": num_prompts,
        "uploads": int(uploaded.sum()),
        "total_delay_s": total,
        "throughput_tps": n / total if total > 0 else float("nan"),
        "mean_token_latency_s": _mean(delays),
        "end_to_end_latency_s": float(per_prompt.mean()) if num_prompts else float("nan"),
        "uplink_bits_per_token": bits / n if n else float("nan"),
        "uplink_bytes_per_token": bits / 8 / n if n else float("nan"),
        "skip_rate": _mean(skipped.astype(float)),
        "transmission_rate": _mean(uploaded.astype(float)),
        "true_skip_rate": _mean(accept_prob) if accept_prob.size else float("nan"),
        "vocab_compression": 1.0 - mean_k / vocab_size,
        "mean_k": mean_k,
        "measured_tvd_mean": _mean(tokens["measured_tvd"].to_numpy(dtype=float)[uploaded]),
        "acceptance_rate": _mean(tokens["accepted"].to_numpy().astype(float)[uploaded]),
        "interaction_rounds_per_answer": (
            float(uploaded.sum()) / num_prompts if num_prompts else float("nan")
        ),
    }


def _ratio(a, b) -> float:
    a, b = float(a), float(b)
    if not (np.isfinite(a) and np.isfinite(b)) or b == 0:
        return float("nan")
    return a / b


def relative_to(
    metrics_by_variant: Mapping[str, Mapping[str, Any]], reference: str = "hlm"
) -> dict[str, dict[str, Any]]:
    """Copies of the metrics with ratios to ``reference``'s (HLM for CU-HLM) added.

    ``throughput_gain`` (throughput / reference's), ``latency_ratio`` (mean token latency),
    ``end_to_end_latency_ratio``, ``uplink_bits_ratio``, ``uploads_ratio``, and
    ``relative_<m>`` (m / reference's m) for each quality metric in :data:`RELATIVE_KEYS` that
    both carry (e.g. "97.4% of HLM accuracy"). NaN where a ratio is undefined.
    """
    if reference not in metrics_by_variant:
        raise KeyError(f"reference variant {reference!r} is not among {sorted(metrics_by_variant)}")
    ref = metrics_by_variant[reference]
    pairs = {
        "throughput_gain": "throughput_tps",
        "latency_ratio": "mean_token_latency_s",
        "end_to_end_latency_ratio": "end_to_end_latency_s",
        "uplink_bits_ratio": "uplink_bits_per_token",
        "uploads_ratio": "transmission_rate",
    }
    out: dict[str, dict[str, Any]] = {}
    for variant, metrics in metrics_by_variant.items():
        row = dict(metrics)
        for name, key in pairs.items():
            if key in metrics and key in ref:
                row[name] = _ratio(metrics[key], ref[key])
        for key in RELATIVE_KEYS:
            if key in metrics and key in ref:
                row[f"relative_{key}"] = _ratio(metrics[key], ref[key])
        out[variant] = row
    return out


# ---------------------------------------------------------------------------------------------
# Text-level scores
# ---------------------------------------------------------------------------------------------


def _field(record, name: str):
    return record.get(name) if isinstance(record, Mapping) else getattr(record, name, None)


def _cosine(texts: Sequence[str], references: Sequence[str]) -> np.ndarray:
    if not texts:
        return np.zeros(0)
    a, b = scoring.embed(list(texts)), scoring.embed(list(references))
    return (a * b).sum(-1).to(torch.float64).numpy()


def text_scores(
    completion_texts: Sequence[str],
    records: Sequence[Any],
    reference_texts_llm: Sequence[str] | None,
) -> pd.DataFrame:
    """Per-prompt text scores of one variant (SPEC 6), one row per completion.

    ``records`` (:class:`edgespec.datasets.PromptRecord` or mappings with ``id``, ``task``,
    ``reference``, ``gold_answer``) align with ``completion_texts``; ``reference_texts_llm``
    are the LLM-only outputs of the same prompts (None: the columns that need them are NaN,
    e.g. when scoring LLM-only against itself is pointless). Columns: ``prompt_id``, ``task``,
    ``exact_match`` (1/0 against the gold answer, NaN without one), ``semantic_accuracy``
    (cosine similarity of sentence embeddings with the dataset reference, or with the LLM-only
    output where the record has none), ``semantic_reference`` ("dataset", "llm_only" or
    None), ``similarity_to_llm`` (with the LLM-only output) and ``answer_fidelity`` (same
    final answer as the LLM-only output, :func:`edgespec.scoring.answer_fidelity`).
    """
    n = len(completion_texts)
    if len(records) != n:
        raise ValueError(f"{n} completions but {len(records)} records")
    if reference_texts_llm is not None and len(reference_texts_llm) != n:
        raise ValueError(f"{n} completions but {len(reference_texts_llm)} LLM-only texts")
    texts = [str(t) for t in completion_texts]
    golds = [_field(r, "gold_answer") for r in records]
    exact = [np.nan if v is None else v for v in scoring.exact_match(texts, golds)]

    semantic_ref: list[str | None] = []
    source: list[str | None] = []
    for i, r in enumerate(records):
        ref = _field(r, "reference")
        if ref:
            semantic_ref.append(str(ref))
            source.append("dataset")
        elif reference_texts_llm is not None:
            semantic_ref.append(str(reference_texts_llm[i]))
            source.append("llm_only")
        else:
            semantic_ref.append(None)
            source.append(None)
    semantic = np.full(n, np.nan)
    have = [i for i in range(n) if semantic_ref[i] is not None]
    semantic[have] = _cosine([texts[i] for i in have], [semantic_ref[i] for i in have])

    if reference_texts_llm is not None:
        llm = [str(t) for t in reference_texts_llm]
        similarity_llm = _cosine(texts, llm)
        fidelity = np.asarray(scoring.answer_fidelity(texts, llm), dtype=float)
    else:
        similarity_llm = np.full(n, np.nan)
        fidelity = np.full(n, np.nan)
    return pd.DataFrame(
        {
            "prompt_id": [_field(r, "id") for r in records],
            "task": [_field(r, "task") for r in records],
            "exact_match": np.asarray(exact, dtype=float),
            "semantic_accuracy": semantic,
            "semantic_reference": source,
            "similarity_to_llm": similarity_llm,
            "answer_fidelity": fidelity,
        }
    )
