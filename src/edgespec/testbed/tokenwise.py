"""The CU-HLM family over the wire: the device's and the edge's half of one answer (methods §3,
§12), each the batch-of-one path of ``edgespec.decoding.tokenwise.generate_tokenwise``.

Per token the device drafts d from x, estimates u, and its policy keeps d (skip) or uploads the
top-k of x (HLM: all of x) with d and the ids of the tokens skipped since the last upload
(TOKEN_UP); the edge feeds those ids and the last token it committed to the target in one
forward, rebuilds x_hat from the k entries (``reconstruct_topk`` on the ranks the device sent),
verifies d against the target's y and returns the committed token (TOKEN_VERDICT).

Shared randomness: both sides seed one generator alike. Per token the single-process decode
draws, in order, the device's numbers (d: 1 uniform at temperature > 0; u: 2M; a random-skip
policy: 1) and the edge's two (the acceptance test and the residual draw), all float64
uniforms, whose consumption is additive. Each side draws its own and skips the other's
(:func:`skip_draws`), also for skipped tokens, whose verification the single process computes
and discards; so the committed tokens equal the single-process decode's for the same seed (the
edge's multi-token feed after skips rounds like the one-token feeds only up to float noise).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from edgespec.cuhlm.policies import RandomSkipPolicy
from edgespec.decoding.compression import reconstruct_topk
from edgespec.decoding.sampling import draw_tokens, probabilities, verify_single_token
from edgespec.decoding.uncertainty import perturbation_uncertainty
from edgespec.testbed.answer import AnswerJob, UplinkBudget, cut
from edgespec.testbed.endpoint import Endpoint, Stopwatch
from edgespec.testbed.messages import (
    TokenUpload,
    decode_token_up,
    decode_token_verdict,
    encode_token_up,
    encode_token_verdict,
)
from edgespec.testbed.prompt import device_end, device_prompt, edge_prompt
from edgespec.testbed.wire import Kind

EDGE_DRAWS_PER_TOKEN = 2
"""``verify_single_token``: one uniform for the acceptance test, one for the residual draw."""


def device_draws_per_token(policy, temperature: float) -> int:
    """The float64 uniforms the device draws per token before verification (module doc)."""
    draws = 1 if temperature > 0 else 0
    draws += 2 * int(policy.uncertainty_samples)
    return draws + (1 if isinstance(policy, RandomSkipPolicy) else 0)


def skip_draws(generator: torch.Generator, count: int) -> None:
    """Advance ``generator`` past ``count`` float64 uniforms the other side draws."""
    if count:
        torch.rand(count, generator=generator, dtype=torch.float64)


def _one(token: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor([[int(token)]]), torch.ones((1, 1), dtype=torch.bool)


def topk_upload(x: torch.Tensor, draft_token: int, k: int, resync: list[int]) -> TokenUpload:
    """The entries of x [1, V] the edge rebuilds x_hat from: all of x (k = |V|, index order) or
    its top k in ``topk``'s order (the set ``reconstruct_topk`` keeps)."""
    vocab = x.shape[-1]
    if k >= vocab:
        values, indices = x[0], torch.arange(vocab)
    else:
        values, indices = x[0].topk(k, sorted=True)
    return TokenUpload(
        int(draft_token),
        indices.numpy().astype(np.int64),
        values.to(torch.float32).numpy(),
        list(resync),
    )


@torch.inference_mode()
def device_tokenwise(end: Endpoint, draft, job: AnswerJob, prefilled=None) -> dict:
    """The device's half of one answer; returns its record (tokens, clocks, one row per token)."""
    cfg, policy, spec = job.cfg, job.policy, job.spec
    watch = Stopwatch()
    model, (logits, _) = device_prompt(end, draft, job, prefilled, True, watch)
    generator = torch.Generator().manual_seed(job.generator_seed)
    budget = UplinkBudget(job)
    generated: list[int] = []
    pending: list[int] = []
    rows = []
    start = time.perf_counter()
    z = logits[:, -1]
    while True:
        position = len(generated)
        with watch("compute"):
            x = probabilities(z, cfg.temperature)
            d = draw_tokens(policy.sampling_distribution(z, x), z, cfg.temperature, generator)
        with watch("uncertainty"):
            m = policy.uncertainty_samples
            u = perturbation_uncertainty(z, d, m, policy.uncertainty_theta_max, generator)
        with watch("compute"):
            skip, k = policy.decide(z, x, d, u, generator)
            skip_draws(generator, EDGE_DRAWS_PER_TOKEN)
            skipped, k = bool(skip[0]), int(k[0])
            upload = None if skipped else topk_upload(x, int(d[0]), k, pending)
        if skipped:
            committed = int(d[0])
        else:
            sent = end.send(Kind.TOKEN_UP, position, encode_token_up, spec, upload)
            budget.charge(sent.model_bits, position)
            wait = job.reply_wait_s(end.sent[-1]["bytes"], position)
            frame = end.recv(wait, Kind.TOKEN_VERDICT)
            committed = end.decode(decode_token_verdict, spec, frame.payload)
            pending = []
        rows.append(
            {
                "position": position,
                "uploaded": not skipped,
                "skipped": skipped,
                "k": 0 if skipped else k,
                "resync": 0 if skipped else len(upload.resync),
                "draft_token": int(d[0]),
                "committed_token": committed,
                "accepted": skipped or committed == int(d[0]),
            }
        )
        _, done = cut(generated, [committed], cfg)
        if skipped:
            pending.append(committed)
        if done or budget.spent:
            break
        with watch("compute"):
            model.compact()
            z = model.feed(*_one(committed), 1)[0][:, -1]
    return device_end(end, start, generated, budget.spent and not done, watch, rows)


@torch.inference_mode()
def edge_tokenwise(end: Endpoint, target, job: AnswerJob, prefilled=None) -> dict:
    """The edge's half of one answer: serves TOKEN_UP frames until END; returns its record."""
    cfg, spec = job.cfg, job.spec
    watch = Stopwatch()
    _, model, (logits, _) = edge_prompt(end, target, job, prefilled, True, watch)
    generator = torch.Generator().manual_seed(job.generator_seed)
    per_token = device_draws_per_token(job.policy, cfg.temperature) + EDGE_DRAWS_PER_TOKEN
    device_draws = per_token - EDGE_DRAWS_PER_TOKEN
    z = logits[:, -1]
    known: list[int] = []  # committed tokens the edge knows of
    unfed: list[int] = []
    consumed = 0  # tokens whose draws the generator has passed
    rows = []
    while True:
        frame = end.recv(None, Kind.TOKEN_UP, Kind.END)
        if frame.kind == Kind.END:
            break
        up = end.decode(decode_token_up, spec, frame.payload)
        known += up.resync
        position = len(known)
        if frame.block != position:
            raise ValueError(f"{job.label}: TOKEN_UP for block {frame.block} at token {position}")
        with watch("compute"):
            feed = unfed + up.resync
            if feed:
                model.compact()
                ids = torch.tensor([feed])
                z = model.feed(ids, torch.ones_like(ids, dtype=torch.bool), 1)[0][:, -1]
            skip_draws(generator, (position - consumed) * per_token + device_draws)
            y = probabilities(z, cfg.temperature)
            vocab = y.shape[-1]
            sparse = torch.zeros((1, vocab), dtype=torch.float32)
            sparse[0, torch.as_tensor(up.indices)] = torch.as_tensor(up.values, dtype=torch.float32)
            ranks = torch.full((1, vocab), vocab, dtype=torch.long)
            ranks[0, torch.as_tensor(up.indices)] = torch.arange(up.k)
            received = reconstruct_topk(sparse, torch.tensor([up.k]), ranks)
            verified, accepted = verify_single_token(
                torch.tensor([up.draft_token]), received, y, generator
            )
            consumed = position + 1
        committed = int(verified[0])
        end.send(Kind.TOKEN_VERDICT, position, encode_token_verdict, spec, committed)
        known.append(committed)
        unfed = [committed]
        rows.append({"position": position, "edge_accepted": bool(accepted[0])})
    return {"clocks": dict(watch.seconds), "rows": rows}
