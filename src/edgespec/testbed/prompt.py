"""What both protocols do around the timed decode (methods §11).

Before: the device prefills the draft on the prompt and sends the prompt's ids (PROMPT); the
edge decodes them, checks them against the job, prefills the target and answers READY. Both
read the prefill from the run's prefill store where one is given, as the decode stages do. Then
both zero their clocks: what follows is the decode the latency comparison covers. After: the
device stops its clock at the last commit and sends END (:func:`device_end`).
"""

from __future__ import annotations

import time

import torch

from edgespec.decoding.cache import RaggedCachedModel
from edgespec.decoding.prefill import prefill_newcomers
from edgespec.testbed.answer import AnswerJob
from edgespec.testbed.endpoint import Endpoint, Stopwatch
from edgespec.testbed.messages import decode_prompt, encode_empty, encode_prompt
from edgespec.testbed.wire import Kind


def _prefilled_cache(model, role, prompt, job: AnswerJob, prefilled, with_outputs, watch):
    with watch("prefill"):
        newcomer, outputs = prefill_newcomers(
            prefilled, role, model, [list(prompt)], job.cfg, with_outputs=with_outputs
        )
        cache = RaggedCachedModel(model, job.cfg.keep_hidden)
        cache.join(newcomer)
    return cache, outputs


@torch.inference_mode()
def device_prompt(
    end: Endpoint, draft, job: AnswerJob, prefilled, with_outputs: bool, watch: Stopwatch
):
    """The device's side: (the draft's cache of the prompt, its last-token outputs or None)."""
    cache, outputs = _prefilled_cache(
        draft, "draft", job.prompt, job, prefilled, with_outputs, watch
    )
    end.send(Kind.PROMPT, 0, encode_prompt, job.spec, job.prompt)
    end.recv(job.reply_timeout_s, Kind.READY)
    end.restart_clocks()
    return cache, outputs


@torch.inference_mode()
def edge_prompt(
    end: Endpoint, target, job: AnswerJob, prefilled, with_outputs: bool, watch: Stopwatch
):
    """The edge's side: (the prompt's ids as received, the target's cache of them, its
    last-token outputs or None)."""
    frame = end.recv(None, Kind.PROMPT)
    prompt = end.decode(decode_prompt, job.spec, frame.payload)
    if tuple(prompt) != tuple(job.prompt):
        raise ValueError(f"{job.label}: the PROMPT frame's ids differ from the job's prompt")
    cache, outputs = _prefilled_cache(target, "target", prompt, job, prefilled, with_outputs, watch)
    end.send(Kind.READY, 0, encode_empty)
    end.restart_clocks()
    return prompt, cache, outputs


def device_end(end: Endpoint, start: float, tokens, stopped_early: bool, watch, rows) -> dict:
    """Stop the decode's clock (started at ``start``), send END; the device's record: the
    committed ``tokens``, the latency [s], why it stopped, its clocks [s] and ``rows``."""
    e2e = time.perf_counter() - start
    end.send(Kind.END, 0, encode_empty)
    return {
        "tokens": tokens,
        "e2e_s": e2e,
        "stopped": "uplink budget" if stopped_early else "answer",
        "clocks": dict(watch.seconds),
        "rows": rows,
    }
