"""The WISV family over the wire: the device's and the edge's half of one answer in gamma-token
rounds (methods §4, §12), each the batch-of-one path of
``edgespec.decoding.rounds.generate_rounds`` (greedy, as WISV decodes).

Per round the device drafts gamma tokens (with their after-token hidden states where the method
reads them) and uploads, by protocol: vanilla SD the ids (DRAFT_IDS), FH the ids and every
hidden state (DRAFT_FH), SH the ids first and, when the edge's REQUEST mask names mismatched
positions, their hidden states (HIDDEN). The edge runs one target forward over its pending
token and the drafts, applies the method's acceptance rule (``edgespec.wisv.decode.variant_rule``:
strict matching, or the CSI-aware decision head with the round's gain as CSI, as
``edgespec.wisv.decode.decode_wisv`` does) and returns the accepted count and the repair or
bonus token (ROUND_VERDICT); both roll their caches back alike. SH fills the positions it did
not request with zeros: the head's verdict there is never read (those drafts match).
"""

from __future__ import annotations

import time
from dataclasses import fields

import numpy as np
import torch

from edgespec.decoding.cache import left_pad
from edgespec.decoding.rounds import DraftRound, strict_acceptance
from edgespec.decoding.sampling import draw_tokens, greedy_tokens
from edgespec.testbed.answer import AnswerJob, UplinkBudget, cut
from edgespec.testbed.endpoint import Endpoint, Stopwatch
from edgespec.testbed.messages import (
    decode_draft,
    decode_hidden,
    decode_request,
    decode_round_verdict,
    encode_draft,
    encode_hidden,
    encode_request,
    encode_round_verdict,
)
from edgespec.testbed.prompt import device_end, device_prompt, edge_prompt
from edgespec.testbed.wire import Kind
from edgespec.wireless.channel import ChannelCondition
from edgespec.wisv.acceptance import ChannelRound

PROTOCOL = {"vanilla_sd": "ids", "wisv_fh": "fh", "wisv_sh": "sh"}
"""Upload protocol per method (as ``edgespec.wisv.evaluate.VARIANT_PROTOCOL``)."""


def _numpy(hidden: torch.Tensor) -> np.ndarray:
    return hidden.detach().to(torch.float32).cpu().numpy()


@torch.inference_mode()
def device_rounds(end: Endpoint, draft, job: AnswerJob, prefilled=None) -> dict:
    """The device's half of one answer; returns its record (tokens, clocks, one row per round)."""
    cfg, spec, gamma = job.cfg, job.spec, job.spec.gamma
    protocol = PROTOCOL[job.method]
    watch = Stopwatch()
    model, _ = device_prompt(end, draft, job, prefilled, False, watch)
    generator = torch.Generator().manual_seed(job.generator_seed)
    budget = UplinkBudget(job)
    pending = [job.prompt[-1]]
    generated: list[int] = []
    rows = []
    start = time.perf_counter()
    while True:
        block = len(rows)
        with watch("compute"):
            step_ids, step_valid = left_pad([pending], cfg.pad_token_id, "cpu")
            width = step_ids.shape[1] + gamma - 1
            tokens, hidden_list = [], []
            for step in range(gamma):
                logits, hidden = model.feed(step_ids, step_valid, 1)
                tok = draw_tokens(None, logits[:, -1], 0.0, generator)
                tokens.append(tok)
                if hidden is not None and step > 0:
                    hidden_list.append(hidden[:, -1])
                step_ids, step_valid = tok.unsqueeze(1), torch.ones((1, 1), dtype=torch.bool)
            if cfg.keep_hidden:
                _, hidden = model.feed(step_ids, step_valid, 1)
                hidden_list.append(hidden[:, -1])
                width += 1
            drafts = torch.stack(tokens, 1)[0].tolist()
            states = torch.stack(hidden_list, 1)[0] if hidden_list else None
        kind = Kind.DRAFT_FH if protocol == "fh" else Kind.DRAFT_IDS
        fh = _numpy(states) if protocol == "fh" else None
        sent = end.send(kind, block, encode_draft, spec, drafts, fh)
        budget.charge(sent.model_bits, block)
        wait = job.reply_wait_s(end.sent[-1]["bytes"], block)
        frame = end.recv(wait, Kind.ROUND_VERDICT, Kind.REQUEST)
        requested = 0
        if frame.kind == Kind.REQUEST:
            mask = end.decode(decode_request, spec, frame.payload)
            requested = int(mask.sum())
            rows_h = _numpy(states)[mask]
            sent = end.send(Kind.HIDDEN, block, encode_hidden, spec, rows_h)
            budget.charge(sent.model_bits, block)
            wait = job.reply_wait_s(end.sent[-1]["bytes"], block)
            frame = end.recv(wait, Kind.ROUND_VERDICT)
        accepted, final = end.decode(decode_round_verdict, spec, frame.payload)
        kept, done = cut(generated, drafts[:accepted] + [final], cfg)
        row = {"round": block, "num_accepted": accepted, "committed": len(kept)}
        rows.append({**row, "requested": requested})
        if done or budget.spent:
            break
        with watch("compute"):
            fed = gamma if cfg.keep_hidden else gamma - 1
            model.invalidate_last(torch.tensor([max(fed - accepted, 0)]), width)
            pending = ([drafts[-1]] if accepted > fed else []) + [final]
            model.compact()
    return device_end(end, start, generated, budget.spent and not done, watch, rows)


def _with_channel(round_: DraftRound, job: AnswerJob, index: int, encoder) -> DraftRound:
    """The round as the CSI head sees it (as ``decode_wisv`` builds it): the block's gain,
    rate and encoded CSI features."""
    condition = ChannelCondition.from_dict(job.condition)
    gain = float(job.gains[index])
    csi = np.asarray(encoder(condition, gain), dtype=np.float64).reshape(1, -1)
    return ChannelRound(
        **{f.name: getattr(round_, f.name) for f in fields(DraftRound)},
        round_indices=torch.as_tensor([index]),
        gains=torch.as_tensor([gain], dtype=torch.float64),
        rates_bps=torch.as_tensor([float(job.rates_bps[index])], dtype=torch.float64),
        csi=torch.as_tensor(csi),
    )


@torch.inference_mode()
def edge_rounds(end: Endpoint, target, job: AnswerJob, rule, prefilled=None) -> dict:
    """The edge's half of one answer under ``rule`` (a ``VariantRule``): serves rounds until
    END; returns its record (clocks, one row per round with the mismatch counts)."""
    cfg, spec, gamma = job.cfg, job.spec, job.spec.gamma
    protocol = PROTOCOL[job.method]
    draft_dtype = getattr(torch, job.draft_dtype)
    watch = Stopwatch()
    prompt, model, _ = edge_prompt(end, target, job, prefilled, False, watch)
    generator = torch.Generator().manual_seed(job.generator_seed)
    acceptance = rule.acceptance or strict_acceptance(0.0)
    pending = [prompt[-1]]
    generated: list[int] = []
    rows = []
    while True:
        frame = end.recv(None, Kind.DRAFT_IDS, Kind.DRAFT_FH, Kind.END)
        if frame.kind == Kind.END:
            break
        index = len(rows)
        ids, hidden = end.decode(decode_draft, spec, frame.payload, protocol == "fh")
        with watch("compute"):
            drafts = torch.as_tensor(ids).unsqueeze(0)
            t_ids, t_valid = left_pad([pending + ids.tolist()], cfg.pad_token_id, "cpu")
            target_logits, target_hidden = model.feed(t_ids, t_valid, gamma + 1)
            mismatch = (drafts != greedy_tokens(target_logits[:, :gamma]))[0].numpy()
        if protocol == "sh":  # a round without mismatches requests nothing
            hidden = np.zeros((gamma, spec.hidden_size), dtype=np.float32)
            if mismatch.any():
                end.send(Kind.REQUEST, index, encode_request, spec, mismatch)
                frame = end.recv(None, Kind.HIDDEN)
                hidden[mismatch] = end.decode(
                    decode_hidden, spec, frame.payload, int(mismatch.sum())
                )
        with watch("compute"):
            draft_hidden = None
            if hidden is not None:
                draft_hidden = torch.as_tensor(hidden).to(draft_dtype).unsqueeze(0)
            round_ = DraftRound(
                prompt_indices=[0],
                draft_tokens=drafts,
                draft_probs=None,
                target_probs=None,
                target_logits=target_logits,
                draft_hidden=draft_hidden if cfg.keep_hidden else None,
                target_hidden=target_hidden[:, 1:] if target_hidden is not None else None,
                generated_lengths=torch.tensor([len(generated)]),
            )
            if rule.csi_encoder is not None:
                round_ = _with_channel(round_, job, index, rule.csi_encoder)
            verdict = acceptance(round_, generator)
            accepted = int(verdict.num_accepted[0])
            final = int(verdict.output_tokens[0, accepted])
        end.send(Kind.ROUND_VERDICT, index, encode_round_verdict, spec, accepted, final)
        kept, _ = cut(generated, ids.tolist()[:accepted] + [final], cfg)
        committed_drafts = min(accepted, len(kept))
        rows.append(
            {
                "round": index,
                "num_drafted": gamma,
                "num_accepted": accepted,
                "num_committed": len(kept),
                "num_mismatches": int(mismatch.sum()),
                "num_semantic_accepts": int(mismatch[:committed_drafts].sum()),
            }
        )
        with watch("compute"):
            model.invalidate_last(torch.tensor([gamma - accepted]), t_ids.shape[1])
            pending = [final]
            model.compact()
    return {"clocks": dict(watch.seconds), "rows": rows}
