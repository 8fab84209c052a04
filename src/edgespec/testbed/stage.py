"""Rule testbed_run: every method's answers on one channel through the testbed, as tables.

The answers' fading draws are the simulator's own: per CU-HLM token the gain of
``edgespec.cuhlm.evaluate.token_gains`` (the token's position is its block), per WISV round
that of ``edgespec.wisv.evaluate.round_gains``, both under fading seed ``testbed.fading_seed``
of the evaluation; the link's rate per block is ``uplink_rate_bps`` of that gain. Each answer's
generator is seeded from (seed, "testbed", method, prompt id), so the single-process reference
(``edgespec.testbed.reference``) decodes from the same draws.

Tables (one row per answer, per frame, per CU-HLM token, per WISV round): see
:func:`run_channel`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from edgespec.cuhlm.evaluate import fading_base_seed, token_gains
from edgespec.data.records import PromptRecord, read_jsonl
from edgespec.seeding import derive_seed
from edgespec.testbed.answer import TOKENWISE_METHODS, AnswerJob, wire_spec
from edgespec.testbed.link import LinkPlan
from edgespec.testbed.predict import KEEPS_HIDDEN
from edgespec.testbed.session import Testbed
from edgespec.wireless.channel import ChannelCondition, uplink_rate_bps
from edgespec.wisv.evaluate import fading_seed, round_gains

log = logging.getLogger(__name__)


def pick_records(paths: Sequence[str], count: int) -> list[PromptRecord]:
    """The first ``count`` evaluation prompts (all of them where the run has fewer), taken in
    turn from each dataset file (so every dataset is represented), in file order."""
    per_file = [[r for r in read_jsonl(p) if r.split == "eval"] for p in paths]
    out: list[PromptRecord] = []
    for i in range(max((len(f) for f in per_file), default=0)):
        out += [f[i] for f in per_file if i < len(f)]
    if not out:
        raise ValueError(f"testbed: no evaluation prompts in {list(paths)}")
    return out[:count]


def block_gains(
    method: str, condition: ChannelCondition, prompt_id: str, blocks: int, seed: int, index: int
) -> np.ndarray:
    """The fading gain |h|^2 of each block (token or round) of one answer, as the simulator
    draws it under fading seed ``index`` (module docstring)."""
    if method in TOKENWISE_METHODS:
        positions = pd.DataFrame({"prompt_id": [prompt_id] * blocks, "position": range(blocks)})
        return token_gains(positions, condition, fading_base_seed(seed, condition), index)
    return round_gains(condition, [prompt_id], blocks, fading_seed(seed, index))[0]


def device_policies(
    methods: Sequence[str], settings: Mapping[str, Any], fit: dict | None = None
) -> dict[str, Any]:
    """method -> the device's ``TokenPolicy`` for the CU-HLM family, from the config keys the
    policy reads (``edgespec.variants.CUHLM_POLICY_READS``) and the calibration fit record
    (``edgespec.cuhlm.policies.policy_from_artifacts``)."""
    from edgespec.cuhlm.policies import policy_from_artifacts

    return {
        m: policy_from_artifacts(m, settings, fit=fit) for m in methods if m in TOKENWISE_METHODS
    }


def answer_seed(seed: int, method: str, prompt_id: str) -> int:
    return derive_seed(seed, "testbed", method, prompt_id)


def answer_decoding(method: str, settings: Mapping[str, Any], temperature: float, eos, pad: int):
    """The ``DecodingConfig`` of one answer (a batch of one): the CU-HLM family samples at
    ``temperature``, WISV decodes greedily and keeps hidden states where a head reads them."""
    from edgespec.decoding.config import DecodingConfig

    tokenwise = method in TOKENWISE_METHODS
    return DecodingConfig(
        max_new_tokens=settings["max_new_tokens"],
        temperature=temperature if tokenwise else 0.0,
        eos_token_ids=list(eos),
        pad_token_id=pad,
        batch_size=1,
        keep_hidden=method in KEEPS_HIDDEN,
    )


def run_channel(
    testbed: Testbed,
    channel: str,
    condition: Mapping[str, Any],
    methods: Sequence[str],
    records: Sequence[PromptRecord],
    prompts: Sequence[Sequence[int]],
    settings: Mapping[str, Any],
    sizes: Mapping[str, int],
    temperature: float,
    pad_token_id: int,
    policies: Mapping[str, Any],
    seed: int,
) -> dict[str, pd.DataFrame]:
    """Every (method, prompt) answer on ``channel`` through ``testbed``.

    ``settings``: config section ``testbed``; ``sizes``: vocab_size and hidden_size (the
    draft's); ``temperature``: the CU-HLM family's (WISV decodes greedily); ``policies``:
    method -> the device's ``TokenPolicy`` (CU-HLM family). Returns tables ``answers`` (one row
    per answer: tokens, the device's and the edge's clocks [s], why it stopped), ``frames``
    (one per frame: the link's record and the sender's model and control bits), ``tokens``
    (CU-HLM family, one per committed token) and ``rounds`` (WISV family, one per round).
    """
    cond = ChannelCondition.from_dict({**condition, "name": channel})
    per = float(settings["packet_error_rate"].get(channel, 0.0))
    blocks = int(settings["max_new_tokens"])
    out: dict[str, list] = {"answers": [], "frames": [], "tokens": [], "rounds": []}
    for method in methods:
        spec = wire_spec(method, settings, sizes)
        cfg = answer_decoding(method, settings, temperature, testbed.eos_token_ids, pad_token_id)
        for record, prompt in zip(records, prompts, strict=True):
            gains = block_gains(method, cond, record.id, blocks, seed, settings["fading_seed"])
            rates = np.asarray(uplink_rate_bps(cond, gains), dtype=float).reshape(-1)
            job = AnswerJob(
                method,
                channel,
                record.id,
                tuple(int(t) for t in prompt),
                spec,
                cfg,
                answer_seed(seed, method, record.id),
                tuple(rates),
                tuple(float(g) for g in gains),
                cond.rtt_s,
                float(settings["max_uplink_s"]),
                float(settings["reply_timeout_s"]),
                testbed.frame_s,
                policy=policies.get(method),
                condition=cond.to_dict(),
                draft_dtype=testbed.draft_dtype,
            )
            plan = LinkPlan(
                tuple(rates),
                cond.rtt_s,
                packet_error_rate=per,
                packet_bytes=int(settings["packet_bytes"]),
                arq_timeout_s=settings["arq_timeout_s"],
                loss_seed=derive_seed(seed, "testbed", "loss", channel, method, record.id),
                label=job.label,
            )
            deadline = float(settings["reply_timeout_s"]) * (blocks + 2)
            device, edge, frames = testbed.run(job, plan, deadline)
            log.info(
                "%s: %d tokens in %.3f s (%s)",
                job.label,
                len(device["tokens"]),
                device["e2e_s"],
                device["stopped"],
            )
            _collect(out, job, device, edge, frames, gains, rates)
    return {name: pd.DataFrame(rows) for name, rows in out.items()}


def _collect(out, job: AnswerJob, device: dict, edge: dict, frames, gains, rates) -> None:
    key = {"method": job.method, "channel": job.channel, "prompt_id": job.prompt_id}
    clocks = {f"device_{k}_s": v for k, v in device["clocks"].items()}
    clocks.update({f"edge_{k}_s": v for k, v in edge["clocks"].items()})
    out["answers"].append(
        {
            **key,
            "prompt_tokens": len(job.prompt),
            "tokens": list(device["tokens"]),
            "num_tokens": len(device["tokens"]),
            "stopped": device["stopped"],
            "e2e_s": device["e2e_s"],
            **clocks,
        }
    )
    sent = {"up": device["sent"], "down": edge["sent"]}
    counts = {"up": 0, "down": 0}
    for frame in frames:
        direction = frame["direction"]
        mine = sent[direction][counts[direction]]
        counts[direction] += 1
        if mine["kind"] != frame["kind"] or mine["bytes"] != frame["bytes"]:
            raise RuntimeError(f"{job.label}: the link's frame {frame} is not the one sent, {mine}")
        out["frames"].append(
            {**key, **{k: v for k, v in frame.items() if k != "label"}, **_bits(mine)}
        )
    if job.method in TOKENWISE_METHODS:
        edge_rows = {r["position"]: r for r in edge["rows"]}
        for row in device["rows"]:
            extra = edge_rows.get(row["position"], {})
            out["tokens"].append({**key, **row, "edge_accepted": extra.get("edge_accepted")})
        return
    for dev, own in zip(device["rows"], edge["rows"], strict=True):
        if dev["num_accepted"] != own["num_accepted"] or dev["committed"] != own["num_committed"]:
            raise RuntimeError(f"{job.label}: device and edge disagree on round {dev['round']}")
        r = own["round"]
        out["rounds"].append(
            {
                "variant": job.method,
                "condition": job.channel,
                **key,
                "prompt_tokens": len(job.prompt),
                **own,
                "requested": dev["requested"],
                "gain": float(gains[r]),
                "rate_bps": float(rates[r]),
            }
        )


def _bits(sent: Mapping[str, Any]) -> dict[str, int]:
    return {"model_bits": int(sent["model_bits"]), "control_bits": int(sent["control_bits"])}


def run_stage(
    model_dir,
    models: Mapping[str, Any],
    prefill: Sequence[str],
    heads: Mapping[str, str],
    prompt_files: Sequence[str],
    prompting: Mapping[str, Any],
    settings: Mapping[str, Any],
    channel: str,
    condition: Mapping[str, Any],
    sizes: Mapping[str, int],
    temperature: float,
    policy_settings: Mapping[str, Any],
    fit: dict | None,
    seed: int,
    log_path=None,
) -> dict[str, pd.DataFrame]:
    """Rule testbed_run: the testbed's processes on the cached pair (``model_dir``, ``models``:
    the run's load settings, ``prefill``: the prefill stores, ``heads``: method -> decision
    head), the first ``testbed.prompts`` evaluation prompts of ``prompt_files`` in the chat
    template (``prompting``), every method on ``channel``; the tables of :func:`run_channel`."""
    from pathlib import Path

    from edgespec.models.load import load_tokenizer
    from edgespec.runconfig import chat_prompts

    tokenizer = load_tokenizer(Path(model_dir) / "target", role="target")
    records = pick_records(prompt_files, int(settings["prompts"]))
    prompts = chat_prompts(tokenizer, records, dict(prompting))
    policies = device_policies(settings["methods"], policy_settings, fit)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    with Testbed(model_dir, models, prefill, heads, log_path=log_path) as testbed:
        return run_channel(
            testbed,
            channel,
            condition,
            settings["methods"],
            records,
            prompts,
            settings,
            sizes,
            temperature,
            pad,
            policies,
            seed,
        )
