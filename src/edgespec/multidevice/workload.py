"""Decoded tables as device programs for the multi-device simulation (methods §10); torch-free.

A variant's decoded tokens (CU-HLM) or rounds (WISV) do not depend on timing, so each prompt's
table becomes a program of legs (``edgespec.multidevice.simulate``): the device's own compute
and propagation as waits, its uploads as transmissions over the shared band, its verifications
as edge requests. Every leg is the part of the single-device delay it stands for, from the same
functions the single-device evaluation uses:

- CU-HLM token t (``edgespec.cuhlm.evaluate.apply_channel``): wait tau_SLM [+ tau_unc] +
  tau_dev(t); if uploaded, transmit B(t) / R(t) (with skipped ids resynchronised on it), wait
  RTT / 2, verify (``target_token_s``, one token per row), wait RTT / 2. ``llm_only``: the
  edge generates the token (a verification request of ``target_token_s``), nothing else.
- WISV round (``edgespec.wisv.evaluate.round_latencies``): wait n_d tau_SLM (every draft
  forward of the round), transmit the round's first uplink message, wait its expected ARQ
  retransmissions and RTT / 2, verify (``target_verify(gamma)``, gamma + 1
  tokens per row), then RTT / 2 back; SH with mismatches instead asks for the hidden states
  (RTT / 2 down), which the device transmits, and the answer comes back after RTT / 2 up and
  RTT / 2 down; the decision head's time (head variants, rounds with a mismatch) is charged
  before the answer leaves the edge. Each answer starts with its prompt's prefill: the draft's
  on the device, then the target's as an edge job served alone.

So a device alone on the band and the edge reproduces the single-device delays exactly
(:func:`single_device_delays` gives them, from those functions, for comparison).

**Fading: common random numbers.** Device programs are built on the fading gains the
single-device evaluation draws for each prompt and fading seed s: CU-HLM's per (prompt, token
position) stream (``token_gains`` with ``fading_base_seed``), WISV's per (prompt, round) stream
(``attach_channel`` with ``fading_seed(seed, s)``). A device that decodes prompt p under seed s
sees p's own draws, whatever the method, the number of devices or the other devices.

**Which device decodes what** (:func:`device_prompts`): the evaluation split's P prompts, in
the order of their ids; device i decodes ``prompts_per_device`` of them (default P: the whole
split) in a cyclic order that starts at prompt i mod P. Devices i and i + P, which start on the
same prompt, step through the split with different strides (1, P - 1, 3, P - 3, ... coprime to
P), so no two devices repeat the same sequence while the split has strides left. With one
device the program is the whole split in order: the single-device evaluation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from edgespec.cuhlm.evaluate import (
    apply_channel,
    device_seconds,
    fading_base_seed,
    token_gains,
    uses_uncertainty,
)
from edgespec.multidevice.simulate import END, SOLO, UP, VERIFY, WAIT
from edgespec.variants import CUHLM_VARIANTS, WISV_VARIANTS
from edgespec.wireless.arq import ArqSettings
from edgespec.wireless.channel import ChannelCondition, uplink_rate_bps
from edgespec.wireless.delay import LatencyProfile
from edgespec.wireless.payload import upload_bits
from edgespec.wisv.evaluate import (
    CSI_VARIANTS,
    attach_channel,
    fading_seed,
    round_breakdowns,
    round_latencies,
    round_payload,
)

METHODS = (*CUHLM_VARIANTS, *WISV_VARIANTS)


def family(method: str) -> str:
    """``cuhlm`` (per-token) or ``wisv`` (per-round) for a method id."""
    if method in CUHLM_VARIANTS:
        return "cuhlm"
    if method in WISV_VARIANTS:
        return "wisv"
    raise ValueError(f"unknown method {method!r}; known: {', '.join(METHODS)}")


@dataclass
class PromptProgram:
    """One prompt's legs (``(leg, value)`` pairs), and per step the tokens it commits and
    whether it is a token or round (counted in latency figures) rather than a prefill."""

    legs: list[tuple[int, float]]
    step_tokens: np.ndarray
    step_counted: np.ndarray
    edge_requests: int = field(init=False)

    def __post_init__(self) -> None:
        self.edge_requests = sum(1 for op, _ in self.legs if op in (VERIFY, SOLO))


@dataclass
class DeviceProgram:
    """A device's whole program: its prompts' programs one after the other."""

    prompts: list[Any]
    legs: list[tuple[int, float]]
    step_tokens: np.ndarray
    step_counted: np.ndarray
    edge_requests: int

    @classmethod
    def concatenate(cls, prompts: Sequence[Any], parts: Sequence[PromptProgram]) -> DeviceProgram:
        legs: list[tuple[int, float]] = []
        for part in parts:
            legs.extend(part.legs)
        return cls(
            prompts=list(prompts),
            legs=legs,
            step_tokens=np.concatenate([p.step_tokens for p in parts]),
            step_counted=np.concatenate([p.step_counted for p in parts]),
            edge_requests=sum(p.edge_requests for p in parts),
        )

    @property
    def tokens(self) -> int:
        return int(self.step_tokens.sum())


def coprime_strides(num_prompts: int) -> list[int]:
    """1, P - 1, 3, P - 3, ... reduced mod P, those coprime to P, each once (P = 1: [1])."""
    if num_prompts < 1:
        raise ValueError("need at least one prompt")
    if num_prompts == 1:
        return [1]
    out: list[int] = []
    for odd in range(1, num_prompts + 1, 2):
        for stride in (odd % num_prompts, (-odd) % num_prompts):
            if stride and math.gcd(stride, num_prompts) == 1 and stride not in out:
                out.append(stride)
    for stride in range(1, num_prompts):  # even P has no even strides; odd P may have more
        if math.gcd(stride, num_prompts) == 1 and stride not in out:
            out.append(stride)
    return out


def device_prompts(
    num_prompts: int, devices: int, prompts_per_device: int | None = None
) -> list[list[int]]:
    """Per device, the indices (into the sorted prompt list) it decodes, in order (module
    docstring)."""
    if devices < 1:
        raise ValueError(f"need at least one device, got {devices}")
    per_device = num_prompts if prompts_per_device is None else int(prompts_per_device)
    if per_device < 1:
        raise ValueError(f"prompts_per_device must be >= 1, got {prompts_per_device}")
    strides = coprime_strides(num_prompts)
    out = []
    for device in range(devices):
        replica, start = divmod(device, num_prompts)
        stride = strides[replica % len(strides)]
        out.append([(start + stride * j) % num_prompts for j in range(per_device)])
    return out


def _groups(frame: pd.DataFrame, order_column: str) -> dict[Any, np.ndarray]:
    """Row positions of each prompt, sorted by ``order_column`` (position or round)."""
    ids = frame["prompt_id"].to_numpy()
    order = np.lexsort((frame[order_column].to_numpy(), pd.factorize(ids)[0]))
    out: dict[Any, np.ndarray] = {}
    if not len(order):
        return out
    codes = pd.factorize(ids)[0][order]
    bounds = np.flatnonzero(np.diff(codes)) + 1
    for rows in np.split(order, bounds):
        out[ids[rows[0]]] = rows
    return out


@dataclass(frozen=True)
class CuhlmPricing:
    """How a CU-HLM variant's token table becomes programs under one channel and profile
    (the arguments of ``apply_channel``; ``seed`` the configured seed)."""

    variant: str
    condition: ChannelCondition
    profile: LatencyProfile
    vocab_size: int
    prob_bits: int
    seed: int
    sampling_k: int | None = None
    resync_bits_per_skipped: float = 0.0

    step = "token"
    order_column = "position"

    @property
    def verify_tokens(self) -> int:
        """Tokens per row of the edge's forward: one (the last committed token)."""
        return 1

    def gains(self, tokens: pd.DataFrame, seed_index: int) -> np.ndarray:
        base = fading_base_seed(self.seed, self.condition)
        return token_gains(tokens, self.condition, base, seed_index)

    def prompt_programs(self, tokens: pd.DataFrame, seed_index: int) -> dict[Any, PromptProgram]:
        """Each prompt's program under fading seed ``seed_index`` (module docstring)."""
        profile = self.profile
        uploaded = tokens["uploaded"].to_numpy().astype(bool)
        k = tokens["k"].to_numpy().astype(np.int64)
        llm_only = self.variant == "llm_only"
        if self.variant in ("llm_only", "slm_only") and uploaded.any():
            raise ValueError(f"variant {self.variant!r} has no uploads, but the table marks some")
        rates = np.asarray(
            uplink_rate_bps(self.condition, self.gains(tokens, seed_index)), dtype=float
        ).reshape(-1)
        bits = np.where(uploaded, upload_bits(k, self.vocab_size, self.prob_bits), 0).astype(float)
        local = np.zeros(len(tokens))
        if not llm_only:
            # The same sum, in the same order, as tokenwise_delays.
            local = np.full(len(tokens), profile.draft_token_s) + device_seconds(
                tokens, self.variant, profile, self.vocab_size, self.sampling_k
            )
            if uses_uncertainty(self.variant):
                local = local + profile.uncertainty_s
        half_rtt = self.condition.rtt_s / 2.0
        verify_s = profile.target_token_s
        out = {}
        for pid, rows in _groups(tokens, "position").items():
            legs: list[tuple[int, float]] = []
            pending = 0
            for row in rows:
                if llm_only:
                    legs += [(VERIFY, verify_s), (END, 0.0)]
                    continue
                legs.append((WAIT, float(local[row])))
                if uploaded[row]:
                    payload = bits[row] + self.resync_bits_per_skipped * pending
                    pending = 0
                    legs.append((UP, float(payload / rates[row])))
                    if half_rtt:
                        legs.append((WAIT, half_rtt))
                    legs.append((VERIFY, verify_s))
                    if half_rtt:
                        legs.append((WAIT, half_rtt))
                else:
                    pending += 1
                legs.append((END, 0.0))
            out[pid] = PromptProgram(
                legs, np.ones(len(rows), dtype=np.int64), np.ones(len(rows), bool)
            )
        return out

    def single_device_delays(self, tokens: pd.DataFrame, seed_index: int) -> dict[Any, np.ndarray]:
        """Per prompt, the single-device evaluation's delay of each token (``apply_channel``)."""
        delays = apply_channel(
            tokens,
            self.variant,
            self.condition,
            self.profile,
            self.vocab_size,
            self.prob_bits,
            self.gains(tokens, seed_index),
            uses_uncertainty(self.variant),
            sampling_k=self.sampling_k,
            resync_bits_per_skipped=self.resync_bits_per_skipped,
        )
        return {pid: delays[rows] for pid, rows in _groups(tokens, "position").items()}


@dataclass(frozen=True)
class WisvPricing:
    """How a WISV variant's round table becomes programs under one channel and profile (the
    arguments of ``round_latencies``; ``seed`` the configured seed, ``head_s`` the decision
    head's time per round with a mismatch)."""

    variant: str
    condition: ChannelCondition
    profile: LatencyProfile
    gamma: int
    protocol_params: Mapping[str, Any]
    seed: int
    head_s: float = 0.0
    arq: ArqSettings | None = None

    step = "round"
    order_column = "round"

    @property
    def verify_tokens(self) -> int:
        """Tokens per row of the edge's forward: the last committed token and gamma drafts."""
        return int(self.gamma) + 1

    def priced(self, rounds: pd.DataFrame, seed_index: int) -> pd.DataFrame:
        """``rounds`` with each (prompt, round)'s gain and rate under fading seed ``seed_index``;
        a CSI-reading variant's rounds must have been decoded on these very draws."""
        priced = attach_channel(rounds, self.condition, fading_seed(self.seed, seed_index))
        if self.variant in CSI_VARIANTS:
            if "gain" not in rounds or not np.allclose(
                rounds["gain"], priced["gain"], rtol=1e-12, atol=0
            ):
                raise ValueError(
                    f"{self.variant}: the rounds given for fading seed {seed_index} were decoded "
                    f"on other draws than that seed's under channel {self.condition.name!r}"
                )
        return priced

    def prompt_programs(self, rounds: pd.DataFrame, seed_index: int) -> dict[Any, PromptProgram]:
        """Each prompt's program under fading seed ``seed_index`` (module docstring)."""
        profile = self.profile
        gamma = int(self.gamma)
        if len(rounds) and not (rounds["num_drafted"] == gamma).all():
            raise ValueError(f"rounds were not drafted with gamma={gamma}")
        priced = self.priced(rounds, seed_index)
        rate = priced["rate_bps"].to_numpy(dtype=float)
        mismatches = priced["num_mismatches"].to_numpy(dtype=np.int64)
        committed = priced["num_committed"].to_numpy(dtype=np.int64)
        prompt_tokens = priced["prompt_tokens"].to_numpy(dtype=float)
        payloads = {
            int(m): round_payload(self.variant, gamma, int(m), self.protocol_params)
            for m in np.unique(mismatches)
        }
        # Each round's parts as the single-device evaluation charges them (every draft forward,
        # the head, the expected retransmissions: ``round_breakdowns``).
        parts = round_breakdowns(
            priced,
            self.variant,
            self.protocol_params,
            profile,
            self.condition.rtt_s,
            gamma,
            head_s=self.head_s,
            arq=self.arq,
        )
        draft_s = parts["draft_s"].to_numpy()
        retx_s = parts["retransmission_s"].to_numpy()
        head_s = parts["head_s"].to_numpy()
        verify_s = profile.target_verify(gamma)
        half_rtt = self.condition.rtt_s / 2.0
        out = {}
        for pid, rows in _groups(priced, "round").items():
            first = rows[0]
            legs: list[tuple[int, float]] = [
                (WAIT, float(prompt_tokens[first] * profile.draft_prefill_token_s))
            ]
            target_prefill = float(prompt_tokens[first] * profile.target_prefill_token_s)
            if target_prefill > 0:
                legs.append((SOLO, target_prefill))
            legs.append((END, 0.0))
            for row in rows:
                payload = payloads[int(mismatches[row])]
                legs += [
                    (WAIT, float(draft_s[row])),
                    (UP, float(payload.uplink_bits / rate[row])),
                    # expected ARQ retransmissions, as a wait (the band they take is not shared)
                    (WAIT, float(retx_s[row]) + half_rtt),
                    (VERIFY, verify_s),
                ]
                if payload.extra_round_trip:
                    # The edge asks for the mismatched positions' hidden states (RTT/2 down),
                    # the device sends them; the head runs; the answer goes down.
                    legs += [
                        (WAIT, half_rtt),
                        (UP, float(payload.extra_uplink_bits / rate[row])),
                        (WAIT, half_rtt + float(head_s[row]) + half_rtt),
                    ]
                else:
                    legs.append((WAIT, float(head_s[row]) + half_rtt))
                legs.append((END, 0.0))
            out[pid] = PromptProgram(
                legs,
                np.concatenate([[0], committed[rows]]).astype(np.int64),
                np.concatenate([[False], np.ones(len(rows), bool)]),
            )
        return out

    def single_device_delays(self, rounds: pd.DataFrame, seed_index: int) -> dict[Any, np.ndarray]:
        """Per prompt, the single-device evaluation's delays: the prompt's prefill, then each
        round's latency (``round_latencies``)."""
        priced = self.priced(rounds, seed_index)
        latencies = round_latencies(
            priced,
            self.variant,
            self.protocol_params,
            self.profile,
            self.condition.rtt_s,
            int(self.gamma),
            head_s=self.head_s,
            arq=self.arq,
        )
        prefill = np.asarray(
            self.profile.prefill_s(priced["prompt_tokens"].to_numpy()), dtype=float
        ).reshape(-1)
        return {
            pid: np.concatenate([[prefill[rows[0]]], latencies[rows]])
            for pid, rows in _groups(priced, "round").items()
        }


def prompt_order(table: pd.DataFrame) -> list[Any]:
    """The split's prompt ids in the order devices are assigned them: sorted by id."""
    return sorted(pd.unique(table["prompt_id"]), key=str)


def device_programs(
    programs: Mapping[Any, PromptProgram],
    prompts: Sequence[Any],
    devices: int,
    prompts_per_device: int | None = None,
) -> list[DeviceProgram]:
    """The programs of ``devices`` devices (:func:`device_prompts` over ``prompts``)."""
    missing = [p for p in prompts if p not in programs]
    if missing:
        raise ValueError(f"no program for prompt(s) {missing[:5]}")
    out = []
    for indices in device_prompts(len(prompts), devices, prompts_per_device):
        ids = [prompts[i] for i in indices]
        out.append(DeviceProgram.concatenate(ids, [programs[p] for p in ids]))
    return out
