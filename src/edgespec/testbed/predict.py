"""The simulator's prediction for the testbed's own answers, term by term (methods §11).

Every number here comes from the project's public pricing functions, called on the testbed's
committed tables with the fading draws the link used: per CU-HLM answer
``edgespec.cuhlm.evaluate.apply_channel`` on its tokens (gains ``token_gains``), per WISV answer
``edgespec.wisv.evaluate.round_latencies`` on its rounds (rates ``attach_channel``), both
without the prompt's prefill (the testbed times the decode after it). The terms are differences
of such calls: edge compute = total - total with the edge's compute times zeroed, device compute
= the rest of the compute, RTT = (with no compute) - (with no compute and RTT 0), uplink = the
last. The model has no serialisation and, until the channel model carries a packet error rate,
no retransmissions. Payload bits per frame come from ``edgespec.wireless.payload`` and
``edgespec.wisv.evaluate.round_payload``; the bytes the testbed must then put on the wire add the
stated overhead (frame header, CU-HLM's control fields, padding to whole bytes). Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from edgespec.cuhlm.evaluate import apply_channel, fading_base_seed, token_gains, uses_uncertainty
from edgespec.testbed.messages import WireSpec, token_up_control_bits
from edgespec.testbed.wire import HEADER_BYTES
from edgespec.wireless.channel import ChannelCondition
from edgespec.wireless.delay import LatencyProfile
from edgespec.wireless.payload import index_bits, upload_bits
from edgespec.wisv.evaluate import attach_channel, fading_seed, round_latencies, round_payload
from edgespec.wisv.protocols import draft_forwards_per_round

KEEPS_HIDDEN = ("wisv_fh", "wisv_sh")
"""The methods whose device keeps the draft's hidden states (one more draft forward a round)."""

MODEL_TERMS = ("device_s", "edge_s", "uplink_s", "rtt_s")


def without_compute(profile: LatencyProfile, edge_only: bool = False) -> LatencyProfile:
    """``profile`` with the edge's compute times zeroed, or every compute time."""
    edge = {
        "target_token_s": 0.0,
        "target_verify_s": {g: 0.0 for g in profile.target_verify_s},
        "target_prefill_token_s": 0.0,
    }
    if edge_only:
        return replace(profile, **edge)
    device = {"draft_token_s": 0.0, "uncertainty_s": 0.0, "online_k_s": 0.0, "topk_s": {}}
    return replace(profile, **edge, **device, draft_prefill_token_s=0.0)


def _terms(total, no_edge, no_compute, uplink) -> dict[str, np.ndarray]:
    return {
        "e2e_s": total,
        "edge_s": total - no_edge,
        "device_s": no_edge - no_compute,
        "rtt_s": no_compute - uplink,
        "uplink_s": uplink,
    }


def _per_prompt(frame: pd.DataFrame, terms: dict[str, np.ndarray]) -> pd.DataFrame:
    priced = frame[["prompt_id"]].assign(**{f"model_{k}": v for k, v in terms.items()})
    return priced.groupby("prompt_id", sort=False).sum().reset_index()


def predict_tokens(
    tokens: pd.DataFrame,
    method: str,
    condition: ChannelCondition,
    profile: LatencyProfile,
    vocab_size: int,
    prob_bits: int,
    seed: int,
    seed_index: int,
) -> pd.DataFrame:
    """Per prompt of one CU-HLM method's testbed tokens: the model's latency and its terms
    (``model_e2e_s``, ``model_device_s``, ``model_edge_s``, ``model_rtt_s``,
    ``model_uplink_s``) [s]."""
    gains = token_gains(tokens, condition, fading_base_seed(seed, condition), seed_index)
    unc = uses_uncertainty(method)

    def price(prof: LatencyProfile, cond: ChannelCondition) -> np.ndarray:
        return apply_channel(tokens, method, cond, prof, vocab_size, prob_bits, gains, unc)

    quiet = without_compute(profile)
    terms = _terms(
        price(profile, condition),
        price(without_compute(profile, edge_only=True), condition),
        price(quiet, condition),
        price(quiet, replace(condition, rtt_s=0.0)),
    )
    return _per_prompt(tokens, terms)


def predict_rounds(
    rounds: pd.DataFrame,
    method: str,
    condition: ChannelCondition,
    profile: LatencyProfile,
    params: Mapping[str, Any],
    gamma: int,
    head_s: float,
    seed: int,
    seed_index: int,
) -> pd.DataFrame:
    """Per prompt of one WISV method's testbed rounds: the model's latency and its terms, as
    :func:`predict_tokens`. ``params``: vocab_size, hidden_size, bits_per_value; ``head_s``
    the decision head's time per round with a mismatch (``wisv.evaluate.head_round_s``). The
    rounds' gains must be those of fading seed ``seed_index`` (ValueError otherwise)."""
    priced = attach_channel(rounds, condition, fading_seed(seed, seed_index))
    # every draft forward the device runs in a round, as the simulator charges the engine's
    forwards = draft_forwards_per_round(gamma, keep_hidden=method in KEEPS_HIDDEN)
    priced = priced.assign(draft_forwards=forwards)
    if not np.allclose(priced["gain"], rounds["gain"], rtol=1e-12, atol=0):
        raise ValueError(f"{method}: the testbed's rounds saw other gains than the simulator's")
    quiet = without_compute(profile)

    def price(prof: LatencyProfile, rtt: float, head: float) -> np.ndarray:
        return round_latencies(priced, method, params, prof, rtt, gamma, head_s=head)

    terms = _terms(
        price(profile, condition.rtt_s, head_s),
        price(without_compute(profile, edge_only=True), condition.rtt_s, 0.0),
        price(quiet, condition.rtt_s, 0.0),
        price(quiet, 0.0, 0.0),
    )
    return _per_prompt(rounds, terms)


def _frame_bytes(bits: float, control: float = 0.0) -> int:
    return HEADER_BYTES + math.ceil((bits + control) / 8)


def expected_wire_tokens(tokens: pd.DataFrame, spec: WireSpec) -> pd.DataFrame:
    """Per prompt of CU-HLM tokens: the model's uplink and downlink bits (B(k) per upload,
    ``payload.upload_bits``; one token id per verdict) and the bytes the wire must carry: per
    upload a frame of the model's bits plus the control fields (d, k, the resync ids;
    ``messages.token_up_control_bits``), per verdict a frame of one id."""
    up = tokens[tokens["uploaded"].astype(bool)]
    model_up = upload_bits(up["k"].to_numpy(np.int64), spec.vocab_size, spec.prob_bits)
    control = [token_up_control_bits(spec, int(r)) for r in up["resync"]]
    down = index_bits(spec.vocab_size)
    rows = up[["prompt_id"]].assign(
        model_up_bits=model_up,
        model_down_bits=float(down),
        wire_up_bytes=[_frame_bytes(b, c) for b, c in zip(model_up, control, strict=True)],
        wire_down_bytes=_frame_bytes(down),
        units=1,
    )
    return _sum_by_prompt(rows, tokens)


def expected_wire_rounds(rounds: pd.DataFrame, method: str, params: Mapping[str, Any]):
    """Per prompt of WISV rounds: the model's uplink and downlink bits per round
    (``wisv.evaluate.round_payload``) and the bytes the wire must carry: one frame per
    message (SH with mismatches: ids, then hidden states up; the gamma-bit mask, then the
    verdict down)."""
    rows = []
    for prompt_id, gamma, m in rounds[["prompt_id", "num_drafted", "num_mismatches"]].itertuples(
        index=False
    ):
        payload = round_payload(method, int(gamma), int(m), params)
        extra = payload.extra_round_trip
        up = [payload.uplink_bits] + ([payload.extra_uplink_bits] if extra else [])
        mask = int(gamma) if extra else 0
        down = [payload.downlink_bits - mask] + ([mask] if mask else [])
        rows.append(
            {
                "prompt_id": prompt_id,
                "model_up_bits": payload.total_uplink_bits,
                "model_down_bits": payload.downlink_bits,
                "wire_up_bytes": sum(_frame_bytes(b) for b in up),
                "wire_down_bytes": sum(_frame_bytes(b) for b in down),
                "units": 1,
            }
        )
    return _sum_by_prompt(pd.DataFrame(rows), rounds)


def _sum_by_prompt(rows: pd.DataFrame, table: pd.DataFrame) -> pd.DataFrame:
    columns = ["model_up_bits", "model_down_bits", "wire_up_bytes", "wire_down_bytes", "units"]
    order = pd.Index(pd.unique(table["prompt_id"]), name="prompt_id")
    if rows.empty:
        return pd.DataFrame(0.0, index=order, columns=columns).reset_index()
    summed = rows.groupby("prompt_id", sort=False)[columns].sum()
    return summed.reindex(order, fill_value=0).reset_index()
