"""Decoded tables as device programs for the multi-device simulation (methods §10); torch-free.

A variant's decoded tokens (CU-HLM) or rounds (WISV) do not depend on timing, so each prompt's
table becomes a program of legs (``edgespec.multidevice.simulate``): the device's own compute
and propagation as waits, its uploads as transmissions over the shared band, its verifications
as edge requests carrying their tokens per row. Every leg is the part of the single-device
delay it stands for, from the same functions the single-device evaluation uses, plus the edge
work that evaluation leaves out (marked *):

- *Prefill* (``prefill`` policy "alone", every method alike): each answer starts with a step of
  its own (not counted in latency): the draft's prefill on the device (L tau_prefill,SLM; not
  for ``llm_only``), then the target's as an edge job served alone (L tau_prefill,LLM; not for
  ``slm_only``), L the prompt's tokens. Policy "none": no method pays a prefill.
- CU-HLM token t (``edgespec.cuhlm.evaluate.apply_channel``): wait tau_SLM [+ tau_unc] +
  tau_dev(t); if uploaded, transmit B(t) / R(t) (with skipped ids resynchronised on it), wait
  RTT / 2, verify over s + 1 tokens per row (*: the s tokens skipped since the previous upload,
  which the target must process before it can verify this one; the evaluation charges 1),
  wait RTT / 2. ``llm_only``: the edge generates the token (a request of 1 token), nothing else.
- WISV round (``edgespec.wisv.evaluate.round_latencies``): wait gamma tau_SLM, transmit the
  round's first uplink message, wait RTT / 2, verify (gamma + 1 tokens per row), then RTT / 2
  back; SH with mismatches instead asks for the hidden states (RTT / 2 down), which the device
  transmits, and the answer comes back after RTT / 2 up and RTT / 2 down; the decision head's
  time (head variants, rounds with a mismatch) is charged before the answer leaves the edge.

So a device alone on the band and the edge reproduces the single-device delays plus the
starred work (:meth:`CuhlmPricing.single_device_delays`, :meth:`WisvPricing.single_device_delays`
give them, from those functions, for comparison).

**Fading.** A device decoding prompt p under fading seed s and device stream d uses the
evaluation's own per-prompt stream (CU-HLM per (prompt, token position), ``token_gains``; WISV
per (prompt, round), ``attach_channel``), with the base seed derived once more from d for
d >= 1 (:func:`device_base_seed`): device 0 sees the evaluation's draws, every other device its
own, and every method the same ones (common random numbers). The CSI-reading WISV variants
were decoded on given draws and are priced on those only (``device`` is ignored for them).
"""

from __future__ import annotations

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
from edgespec.multidevice.edge import EdgeCost
from edgespec.multidevice.simulate import END, SOLO, UP, VERIFY, WAIT
from edgespec.seeding import derive_seed
from edgespec.variants import CUHLM_VARIANTS, WISV_VARIANTS
from edgespec.wireless.channel import ChannelCondition, uplink_rate_bps
from edgespec.wireless.delay import LatencyProfile
from edgespec.wireless.payload import upload_bits
from edgespec.wisv.evaluate import (
    CSI_VARIANTS,
    HEAD_VARIANTS,
    attach_channel,
    fading_seed,
    round_latencies,
    round_payload,
)

METHODS = (*CUHLM_VARIANTS, *WISV_VARIANTS)
PREFILL_POLICIES = ("alone", "none")


def family(method: str) -> str:
    """``cuhlm`` (per-token) or ``wisv`` (per-round) for a method id."""
    if method in CUHLM_VARIANTS:
        return "cuhlm"
    if method in WISV_VARIANTS:
        return "wisv"
    raise ValueError(f"unknown method {method!r}; known: {', '.join(METHODS)}")


def device_base_seed(base: int, device: int) -> int:
    """The fading base seed of device stream ``device``: ``base`` itself for device 0 (the
    single-device evaluation's draws), one derived from it and the device otherwise."""
    return int(base) if device == 0 else derive_seed(int(base), "device", int(device))


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


def prefill_step(
    variant: str, profile: LatencyProfile, policy: str, length: float | None
) -> tuple[list[tuple[int, float]], float]:
    """(legs, single-device seconds) of the prefill step of an answer whose prompt has
    ``length`` tokens (module docstring); no legs under policy "none"."""
    if policy == "none":
        return [], 0.0
    if policy != "alone":
        raise ValueError(f"unknown prefill policy {policy!r}; known: {', '.join(PREFILL_POLICIES)}")
    if length is None:
        raise ValueError("the prefill policy 'alone' needs every prompt's length")
    legs: list[tuple[int, float]] = []
    draft = float(length) * profile.draft_prefill_token_s if variant != "llm_only" else 0.0
    target = float(length) * profile.target_prefill_token_s if variant != "slm_only" else 0.0
    if draft > 0:
        legs.append((WAIT, draft))
    if target > 0:
        legs.append((SOLO, target))
    legs.append((END, 0.0))
    return legs, draft + target


@dataclass(frozen=True)
class CuhlmPricing:
    """How a CU-HLM variant's token table becomes programs under one channel and profile
    (the arguments of ``apply_channel``; ``seed`` the configured seed; ``prompt_tokens``
    prompt id -> length for the prefill)."""

    variant: str
    condition: ChannelCondition
    profile: LatencyProfile
    vocab_size: int
    prob_bits: int
    seed: int
    sampling_k: int | None = None
    resync_bits_per_skipped: float = 0.0
    prompt_tokens: Mapping[Any, int] | None = None
    prefill: str = "alone"

    step = "token"

    def _prefill(self, pid: Any) -> tuple[list[tuple[int, float]], float]:
        length = None
        if self.prefill != "none":
            if self.prompt_tokens is None or pid not in self.prompt_tokens:
                raise ValueError(
                    f"no prompt length for {pid!r}: the prefill policy {self.prefill!r} needs "
                    "every prompt's length (target_batching.json's prompt_tokens)"
                )
            length = self.prompt_tokens[pid]
        return prefill_step(self.variant, self.profile, self.prefill, length)

    @property
    def anchor(self) -> tuple[int, float]:
        """(tokens per row, seconds) the evaluation charges one verification: 1 token,
        ``target_token_s``."""
        return 1, self.profile.target_token_s

    def gains(self, tokens: pd.DataFrame, seed_index: int, device: int = 0) -> np.ndarray:
        base = device_base_seed(fading_base_seed(self.seed, self.condition), device)
        return token_gains(tokens, self.condition, base, seed_index)

    def prompt_programs(
        self, tokens: pd.DataFrame, seed_index: int, device: int = 0
    ) -> dict[Any, PromptProgram]:
        """Each prompt's program under fading seed ``seed_index`` on device stream ``device``
        (module docstring)."""
        profile = self.profile
        uploaded = tokens["uploaded"].to_numpy().astype(bool)
        k = tokens["k"].to_numpy().astype(np.int64)
        llm_only = self.variant == "llm_only"
        if self.variant in ("llm_only", "slm_only") and uploaded.any():
            raise ValueError(f"variant {self.variant!r} has no uploads, but the table marks some")
        rates = np.asarray(
            uplink_rate_bps(self.condition, self.gains(tokens, seed_index, device)), dtype=float
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
        out = {}
        for pid, rows in _groups(tokens, "position").items():
            legs, _ = self._prefill(pid)
            steps = 1 if legs else 0
            pending = 0
            for row in rows:
                if llm_only:
                    legs += [(VERIFY, 1), (END, 0.0)]
                    continue
                legs.append((WAIT, float(local[row])))
                if uploaded[row]:
                    payload = bits[row] + self.resync_bits_per_skipped * pending
                    legs.append((UP, float(payload / rates[row])))
                    if half_rtt:
                        legs.append((WAIT, half_rtt))
                    legs.append((VERIFY, pending + 1))
                    if half_rtt:
                        legs.append((WAIT, half_rtt))
                    pending = 0
                else:
                    pending += 1
                legs.append((END, 0.0))
            out[pid] = PromptProgram(
                legs,
                np.concatenate([np.zeros(steps, np.int64), np.ones(len(rows), np.int64)]),
                np.concatenate([np.zeros(steps, bool), np.ones(len(rows), bool)]),
            )
        return out

    def single_device_delays(
        self, tokens: pd.DataFrame, seed_index: int, edge: EdgeCost
    ) -> dict[Any, np.ndarray]:
        """Per prompt, the single-device evaluation's delay of each token (``apply_channel``),
        each upload's verification re-priced over its s + 1 tokens by ``edge``, after the
        prefill step (module docstring)."""
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
        uploaded = tokens["uploaded"].to_numpy().astype(bool)
        out = {}
        for pid, rows in _groups(tokens, "position").items():
            own = delays[rows].copy()
            skipped = 0
            for i, row in enumerate(rows):
                if uploaded[row]:
                    own[i] += edge.alone_s(skipped + 1) - self.profile.target_token_s
                    skipped = 0
                else:
                    skipped += 1
            legs, prefill_s = self._prefill(pid)
            out[pid] = np.concatenate([[prefill_s], own]) if legs else own
        return out


@dataclass(frozen=True)
class WisvPricing:
    """How a WISV variant's round table becomes programs under one channel and profile (the
    arguments of ``round_latencies``; ``seed`` the configured seed, ``head_s`` the decision
    head's time per round with a mismatch). Prompt lengths come from the rounds."""

    variant: str
    condition: ChannelCondition
    profile: LatencyProfile
    gamma: int
    protocol_params: Mapping[str, Any]
    seed: int
    head_s: float = 0.0
    prefill: str = "alone"

    step = "round"

    @property
    def anchor(self) -> tuple[int, float]:
        """(tokens per row, seconds) the evaluation charges one verification: gamma + 1
        tokens, ``target_verify(gamma)``."""
        return int(self.gamma) + 1, self.profile.target_verify(int(self.gamma))

    def priced(self, rounds: pd.DataFrame, seed_index: int, device: int = 0) -> pd.DataFrame:
        """``rounds`` with each (prompt, round)'s gain and rate under fading seed ``seed_index``
        on device stream ``device``; a CSI-reading variant's rounds must have been decoded on
        these very draws (its device stream is the decode's)."""
        base = fading_seed(self.seed, seed_index)
        if self.variant not in CSI_VARIANTS:
            base = device_base_seed(base, device)
        priced = attach_channel(rounds, self.condition, base)
        if self.variant in CSI_VARIANTS:
            if "gain" not in rounds or not np.allclose(
                rounds["gain"], priced["gain"], rtol=1e-12, atol=0
            ):
                raise ValueError(
                    f"{self.variant}: the rounds given for fading seed {seed_index} were decoded "
                    f"on other draws than that seed's under channel {self.condition.name!r}"
                )
        return priced

    def prompt_programs(
        self, rounds: pd.DataFrame, seed_index: int, device: int = 0
    ) -> dict[Any, PromptProgram]:
        """Each prompt's program under fading seed ``seed_index`` on device stream ``device``
        (module docstring)."""
        profile = self.profile
        gamma = int(self.gamma)
        if len(rounds) and not (rounds["num_drafted"] == gamma).all():
            raise ValueError(f"rounds were not drafted with gamma={gamma}")
        priced = self.priced(rounds, seed_index, device)
        lengths = priced["prompt_tokens"].to_numpy(dtype=float)
        rate = priced["rate_bps"].to_numpy(dtype=float)
        mismatches = priced["num_mismatches"].to_numpy(dtype=np.int64)
        committed = priced["num_committed"].to_numpy(dtype=np.int64)
        payloads = {
            int(m): round_payload(self.variant, gamma, int(m), self.protocol_params)
            for m in np.unique(mismatches)
        }
        draft_s = gamma * profile.draft_token_s
        half_rtt = self.condition.rtt_s / 2.0
        head = self.variant in HEAD_VARIANTS
        out = {}
        for pid, rows in _groups(priced, "round").items():
            legs, _ = prefill_step(self.variant, profile, self.prefill, lengths[rows[0]])
            steps = 1 if legs else 0
            for row in rows:
                m = int(mismatches[row])
                payload = payloads[m]
                legs += [
                    (WAIT, draft_s),
                    (UP, float(payload.uplink_bits / rate[row])),
                    (WAIT, half_rtt),
                    (VERIFY, gamma + 1),
                ]
                head_s = self.head_s if head and m > 0 else 0.0
                if payload.extra_round_trip:
                    # The edge asks for the mismatched positions' hidden states (RTT/2 down),
                    # the device sends them; the head runs; the answer goes down.
                    legs += [
                        (WAIT, half_rtt),
                        (UP, float(payload.extra_uplink_bits / rate[row])),
                        (WAIT, half_rtt + head_s + half_rtt),
                    ]
                else:
                    legs.append((WAIT, head_s + half_rtt))
                legs.append((END, 0.0))
            out[pid] = PromptProgram(
                legs,
                np.concatenate([np.zeros(steps, np.int64), committed[rows]]).astype(np.int64),
                np.concatenate([np.zeros(steps, bool), np.ones(len(rows), bool)]),
            )
        return out

    def single_device_delays(
        self, rounds: pd.DataFrame, seed_index: int, edge: EdgeCost
    ) -> dict[Any, np.ndarray]:
        """Per prompt, the prefill step (module docstring) and then each round's latency
        (``round_latencies``); ``edge`` is not needed (every request is an anchor one)."""
        priced = self.priced(rounds, seed_index)
        lengths = priced["prompt_tokens"].to_numpy(dtype=float)
        latencies = round_latencies(
            priced,
            self.variant,
            self.protocol_params,
            self.profile,
            self.condition.rtt_s,
            int(self.gamma),
            head_s=self.head_s,
        )
        out = {}
        for pid, rows in _groups(priced, "round").items():
            legs, prefill_s = prefill_step(
                self.variant, self.profile, self.prefill, lengths[rows[0]]
            )
            own = latencies[rows]
            out[pid] = np.concatenate([[prefill_s], own]) if legs else own
        return out
