"""Per-token traces of standard HLM decoding, the raw material of calibration and k* (methods §3).

Every token is transmitted with its full distribution (u_th = 0, k = |V|), so for each token the
trace holds what later stages need: x_d, y_d, beta_d, u(t), argmax agreement, entropies, the
top-k mass S_k, the reconstruction error N_k, the measured residual distortion TVD(r, r_hat_k)
and the output distortion TVD(y_hat_k, y) (``edgespec.cuhlm.distortion``) over a k grid, and the
last-layer hidden states of both models at the drafted position (the states that produced x(t)
and y(t)).

:func:`replay_draft_probs` recomputes x(t) of traced tokens by one teacher-forced draft forward
per prompt, for the offline k* search over every k (``edgespec.cuhlm.kcurves``): storing x for
every token would take |V| floats per token.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from edgespec.cuhlm.distortion import output_distortion_grid
from edgespec.decoding.compression import (
    resampling_distortion,
    sort_by_draft,
    topk_mass_and_error,
)
from edgespec.decoding.config import DecodingConfig
from edgespec.decoding.progress import DecodeProgress
from edgespec.decoding.sampling import probabilities, rejection_probability
from edgespec.decoding.tokenwise import TokenStep, UploadFull, generate_tokenwise
from edgespec.decoding.uncertainty import entropy
from edgespec.models.precision import stepped_logits


@dataclass
class TraceResult:
    """What :func:`collect_traces` returns: the per-token table (``attrs["k_grid"]``: its k
    grid, ending with |V|), both models' last-layer hidden states per token (None where not
    kept) and each prompt's generated token ids."""

    tokens: pd.DataFrame
    draft_hidden: np.ndarray | None
    target_hidden: np.ndarray | None
    generated: list[list[int]]

    def hidden_arrays(self) -> dict[str, np.ndarray]:
        """``{"draft": ..., "target": ...}`` for ``hidden.npz``: a model whose states were not
        kept gets a [tokens, 0] float16 array."""
        empty = np.zeros((len(self.tokens), 0), dtype=np.float16)
        return {
            "draft": self.draft_hidden if self.draft_hidden is not None else empty,
            "target": self.target_hidden if self.target_hidden is not None else empty,
        }

    def meta(self, dataset: str, records, elapsed_s: float, tokenizer, **settings) -> dict:
        """The ``meta.json`` record of one dataset's traces: counts, the k grid and |V|, the
        decode time [s] and rate [tokens/s], ``settings`` (the decoding and uncertainty
        config) and each prompt's completion text."""
        grid = self.tokens.attrs["k_grid"]
        return {
            "dataset": dataset,
            "prompts": len(records),
            "tokens": len(self.tokens),
            "k_grid": grid,
            "vocab_size": grid[-1],
            "decode_seconds": elapsed_s,
            "tokens_per_second": len(self.tokens) / elapsed_s if elapsed_s > 0 else None,
            **settings,
            "completions": {
                r.id: tokenizer.decode(g, skip_special_tokens=True)
                for r, g in zip(records, self.generated, strict=True)
            },
        }


def effective_k_grid(k_grid: Sequence[int], vocab_size: int) -> list[int]:
    """The configured grid restricted to 1..|V|, always ending with |V| (standard HLM)."""
    grid = sorted({k for k in k_grid if 1 <= k < vocab_size} | {vocab_size})
    return grid


def collect_traces(
    draft: torch.nn.Module,
    target: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    prompt_ids: Sequence[str],
    cfg: DecodingConfig,
    k_grid: Sequence[int],
    uncertainty_samples: int,
    theta_max: float,
    generator: torch.Generator,
    hidden_dtype=np.float16,
    progress: DecodeProgress | None = None,
) -> TraceResult:
    """Decode ``prompts`` with standard HLM and record one row per generated token."""
    rows: list[dict] = []
    draft_hidden: list[np.ndarray] = []
    target_hidden: list[np.ndarray] = []
    vocab = None
    grid: list[int] = []

    def record(step: TokenStep) -> None:
        nonlocal vocab, grid
        x, y, d = step.draft_probs, step.target_probs, step.draft_tokens
        if vocab is None:
            vocab = x.shape[-1]
            grid = effective_k_grid(k_grid, vocab)
        x_d = x.gather(1, d.unsqueeze(1)).squeeze(1)
        y_d = y.gather(1, d.unsqueeze(1)).squeeze(1)
        beta = rejection_probability(d, x, y)
        pair = sort_by_draft(x, y)  # one sort of the vocabulary serves the whole k grid
        mass, error = topk_mass_and_error(x, grid, pair)
        tvd = resampling_distortion(x, y, grid, pair)
        output_tvd = output_distortion_grid(x, y, grid, pair)
        columns = {
            "prompt_id": [prompt_ids[i] for i in step.prompt_indices],
            "position": step.position.tolist(),
            "draft_token": d.tolist(),
            "committed_token": step.committed.tolist(),
            "accepted": step.accepted.tolist(),
            "x_d": x_d.tolist(),
            "y_d": y_d.tolist(),
            "beta": beta.tolist(),
            "u": step.uncertainty.tolist(),
            "draft_is_target_argmax": (d == y.argmax(-1)).tolist(),
            "draft_is_draft_argmax": (d == x.argmax(-1)).tolist(),
            "entropy_draft": entropy(x).tolist(),
            "entropy_target": entropy(y).tolist(),
        }
        for j, k in enumerate(grid):
            columns[f"mass_{k}"] = mass[:, j].tolist()
            columns[f"nk_{k}"] = error[:, j].tolist()
            columns[f"tvd_{k}"] = tvd[:, j].tolist()
            columns[f"otvd_{k}"] = output_tvd[:, j].tolist()
        rows.extend(
            dict(zip(columns, vals, strict=True)) for vals in zip(*columns.values(), strict=True)
        )
        if step.draft_hidden is not None:
            draft_hidden.append(step.draft_hidden.float().numpy().astype(hidden_dtype))
            target_hidden.append(step.target_hidden.float().numpy().astype(hidden_dtype))

    generated = generate_tokenwise(
        prompts,
        cfg,
        generator,
        draft=draft,
        target=target,
        policy=UploadFull(uncertainty_samples=uncertainty_samples, theta_max=theta_max),
        on_step=record,
        progress=progress,
    )
    table = pd.DataFrame(rows)
    if not table.empty:
        table = table.sort_values(["prompt_id", "position"], kind="stable")
        order = table.index.to_numpy()
        table = table.reset_index(drop=True)
    else:
        order = np.arange(0)
    dh = np.concatenate(draft_hidden)[order] if draft_hidden else None
    th = np.concatenate(target_hidden)[order] if target_hidden else None
    table.attrs["k_grid"] = grid
    return TraceResult(table, dh, th, generated)


@torch.inference_mode()
def replay_draft_probs(
    draft: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    temperature: float,
    token_by_token: bool = False,
) -> Iterator[torch.Tensor]:
    """x(t) of every token of each completion, one prompt at a time: [len(completion), V].

    One teacher-forced forward of ``draft`` over prompt + completion[:-1] per prompt (batch 1,
    no padding); row t is the draft distribution that proposed completion token t, at the
    decoding ``temperature`` (:func:`edgespec.decoding.sampling.probabilities`). The decode that
    produced the trace ran batched with a KV cache, so in low precision (bf16) these rows match
    its x(t) up to rounding; in float32/64 they match it closely.

    ``token_by_token`` feeds the completion one token at a time after the prompt, with the KV
    cache, as decoding did: for a draft whose outputs depend on what a forward feeds alongside
    (int8 dynamic quantisation scales a forward's activations by their largest value, so one
    forward over a whole sequence quantises every token coarsely).
    """
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    device = next(draft.parameters()).device
    for prompt, completion in zip(prompts, completions, strict=True):
        if not len(prompt):
            raise ValueError("a prompt is empty")
        if not len(completion):
            yield torch.zeros(0, 0)
            continue
        if not token_by_token:
            ids = torch.tensor([list(prompt) + list(completion[:-1])], device=device)
            logits = draft(input_ids=ids, logits_to_keep=len(completion)).logits[0].cpu()
            yield probabilities(logits, temperature)
            continue
        yield probabilities(stepped_logits(draft, prompt, completion[:-1]), temperature)
