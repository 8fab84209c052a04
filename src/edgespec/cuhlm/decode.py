"""Decoding one CU-HLM variant into a per-token table (methods §3.5).

:func:`decode_variant` decodes prompts under one variant with the decoding core's per-token
rounds (its policy from ``edgespec.cuhlm.policies``) and records one row per generated token:
what the device did, what the edge verified, x_d, y_d, beta and the measured TVD. The channel
is applied afterwards (``edgespec.cuhlm.evaluate``), so one decoding serves every channel.

Token table columns (one row per generated token, in the order the engine produced them):
``prompt_id``, ``position`` (0-based index in the completion), ``uploaded`` (the device sent
a distribution), ``skipped`` (the device kept its token without verification; for SLM-only
every token), ``k`` (entries uploaded, 0 if not), ``draft_token`` (-1 where the draft did not
run), ``committed_token``, ``accepted`` (the committed token is the proposed one: verification
accepted it, or nothing was verified), ``u`` (NaN where not computed), ``x_d`` (the probability
of d under the law the device drew it from: x, or x_hat for ``cuhlm_exact``), ``y_d``,
``beta`` = max(0, 1 - y_d / x_d), ``accept_prob`` = min(1, y_d / x_d) (the probability that the
LLM would have accepted the draft token), all NaN where a model did not run;
``measured_tvd`` = TVD(r, r_hat) between the residual of the proposal law and the one the edge
built from the uploaded x_hat, and ``output_tvd`` = TVD(y_hat, y), the distance of the committed
token's law from the target's (``edgespec.cuhlm.distortion``), both in float64 from x and y
renormalised (:func:`_normalised`); both 0 for rows that were not uploaded, and for uploads
verified against the law d was drawn from (k = |V|, ``cuhlm_exact``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from edgespec.cuhlm.distortion import committed_law
from edgespec.cuhlm.policies import VARIANTS
from edgespec.decoding.compression import reconstruct_topk, total_variation
from edgespec.decoding.config import DecodingConfig
from edgespec.decoding.prefill import Prefills
from edgespec.decoding.progress import DecodeProgress
from edgespec.decoding.sampling import residual_distribution
from edgespec.decoding.tokenwise import TokenPolicy, TokenStep, generate_tokenwise

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
    "output_tvd",
)


def _gather(probs: torch.Tensor, tokens: torch.Tensor) -> np.ndarray:
    return _np(probs.to(torch.float64).gather(1, tokens.view(-1, 1)).squeeze(1))


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def _normalised(probs: torch.Tensor) -> torch.Tensor:
    """``probs`` in float64, each row divided by its sum.

    A float32 softmax over a vocabulary of 151,936 entries sums to 1 only to about 1e-5, and
    TVD(y_hat, y) of a step verified against its own proposal law is exactly half the
    difference of the two laws' sums (methods §3.4): renormalised, it is 0 to float64
    rounding, as the method's own output law is."""
    probs = probs.to(torch.float64)
    return probs / probs.sum(-1, keepdim=True)


def _record_step(step: TokenStep, prompt_ids: Sequence[str], policy: TokenPolicy | None) -> dict:
    batch = len(step.prompt_indices)
    nan = np.full(batch, np.nan)
    computes_u = policy is not None and policy.uncertainty_samples > 0
    x, y, d = step.draft_probs, step.target_probs, step.draft_tokens
    if x is not None and y is not None and policy is not None:
        # The law d was drawn from (x itself for every variant but cuhlm_exact).
        x = policy.sampling_distribution(step.draft_logits, x)
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
    output_tvd = np.zeros(batch)
    if hybrid:
        vocab = x.shape[-1]
        rows = np.flatnonzero(uploaded & (k < vocab))
        if rows.size:
            idx = torch.as_tensor(rows, device=x.device)
            full, ys = _normalised(step.draft_probs[idx]), _normalised(y[idx])
            logits = step.draft_logits[idx] if step.draft_logits is not None else None
            xs = policy.sampling_distribution(logits, full)  # the law d was drawn from
            x_hat = reconstruct_topk(full, torch.as_tensor(k[rows], device=x.device))
            exact = residual_distribution(ys, xs)
            approx = residual_distribution(ys, x_hat)
            tvd[rows] = _np(total_variation(exact, approx))
            output_tvd[rows] = _np(total_variation(committed_law(xs, x_hat, ys), ys))
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
        "output_tvd": output_tvd,
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
    progress: DecodeProgress | None = None,
    prefilled: Prefills | None = None,
) -> tuple[pd.DataFrame, list[list[int]]]:
    """Decode ``prompts`` under ``variant``; returns (token table, new tokens per prompt).

    ``llm_only`` runs the target alone, ``slm_only`` the draft alone (the other model may be
    None and is never called); every other variant runs both under ``policy`` (from
    :func:`edgespec.cuhlm.policies.build_policy`). See the module docstring for the columns.
    ``prefilled`` serves the prompts' prefills (``edgespec.decoding.prefill_store``).
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
    chunks: list[dict] = []

    def on_step(step: TokenStep) -> None:
        chunks.append(_record_step(step, prompt_ids, policy))

    completions = generate_tokenwise(
        prompts,
        cfg,
        generator,
        draft=draft,
        target=target,
        policy=policy,
        on_step=on_step,
        progress=progress,
        prefilled=prefilled,
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
