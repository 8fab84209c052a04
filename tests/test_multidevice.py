"""Many devices, one edge: the discrete-event simulation against the single-device evaluation,
band sharing, edge batching, conservation, saturation, the summary tables and the batched-forward
profiler."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pandas as pd
import pytest

from edgespec.config import (
    ConfigError,
    check_multidevice_settings,
    multidevice_batch_plan,
    validate_config,
)
from edgespec.cuhlm.evaluate import apply_channel, fading_base_seed, token_gains
from edgespec.multidevice.edge import BatchingPolicy, BatchTimes
from edgespec.multidevice.simulate import END, SOLO, UP, VERIFY, WAIT, simulate
from edgespec.multidevice.summary import (
    discrete_interval,
    headline,
    saturation_table,
    summary_table,
)
from edgespec.multidevice.sweep import SweepSettings, check_single_device, sweep
from edgespec.multidevice.uplink import tdma_finish
from edgespec.multidevice.workload import (
    CuhlmPricing,
    WisvPricing,
    coprime_strides,
    device_programs,
    device_prompts,
    prompt_order,
)
from edgespec.profiling import measure_target_batch_times
from edgespec.wireless.channel import ChannelCondition
from edgespec.wireless.delay import LatencyProfile
from edgespec.wisv.evaluate import attach_channel, fading_seed, price_over_seeds

VOCAB = 1000
SEED = 11
CONDITION = ChannelCondition(
    name="good", fading="rayleigh", bandwidth_hz=2e6, snr_db=10.0, rtt_s=0.01, correlation=0.8
)
PROFILE = LatencyProfile(
    draft_token_s=0.01,
    target_token_s=0.03,
    target_verify_s={1: 0.031, 4: 0.036, 8: 0.04},
    uncertainty_s=0.002,
    online_k_s=0.001,
    topk_s={1: 1e-4, 1000: 5e-4},
    draft_prefill_token_s=1e-4,
    target_prefill_token_s=3e-4,
)
BATCH = BatchTimes({1: {1: 0.03, 4: 0.04, 32: 0.09}, 5: {1: 0.036, 8: 0.06, 32: 0.12}})
PROTOCOL = {"vocab_size": VOCAB, "hidden_size": 64, "bits_per_value": 16}
RTOL = 1e-9


def token_table(prompts=5, tokens=12, upload_prob=0.6, seed=0, every_k=None) -> pd.DataFrame:
    """A decoded CU-HLM table: prompts of different lengths, uploads at random (or every
    ``every_k``-th token), k from 1 to |V|."""
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(prompts):
        for t in range(tokens + p):
            up = (t % every_k == 0) if every_k else bool(rng.random() < upload_prob)
            rows.append(
                {
                    "prompt_id": f"q{p}",
                    "position": t,
                    "uploaded": up,
                    "skipped": not up,
                    "k": int(rng.choice([1, 16, 200, VOCAB])) if up else 0,
                }
            )
    frame = pd.DataFrame(rows)
    return frame.sample(frac=1.0, random_state=seed).reset_index(drop=True)  # order-free


def round_table(prompts=4, gamma=4, tokens=14, seed=0) -> pd.DataFrame:
    """A decoded WISV round table (channel-free): mismatches and committed tokens at random."""
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(prompts):
        done, r = 0, 0
        while done < tokens:
            m = int(rng.integers(0, gamma + 1))
            committed = min(int(rng.integers(1, gamma + 2)), tokens - done)
            rows.append(
                {
                    "variant": "any",
                    "condition": "none",
                    "prompt_id": f"q{p}",
                    "prompt_tokens": 20 + 3 * p,
                    "round": r,
                    "num_drafted": gamma,
                    "num_accepted": max(committed - 1, 0),
                    "num_committed": committed,
                    "num_mismatches": m,
                    "num_semantic_accepts": 0,
                    "draft_forwards": gamma + 1,
                    "gain": np.nan,
                    "rate_bps": np.nan,
                }
            )
            done += committed
            r += 1
    return pd.DataFrame(rows)


def cuhlm(variant, condition=CONDITION, profile=PROFILE):
    return CuhlmPricing(variant, condition, profile, VOCAB, 8, SEED)


def wisv(variant, condition=CONDITION, gamma=4, head_s=0.002):
    return WisvPricing(variant, condition, PROFILE, gamma, PROTOCOL, SEED, head_s=head_s)


def one_run(pricing, table, seed_index, devices, uplink="equal_split", **kw):
    per_prompt = pricing.prompt_programs(table, seed_index)
    programs = device_programs(per_prompt, prompt_order(table), devices)
    policy = kw.pop("policy", BatchingPolicy())
    result = simulate(programs, uplink, BATCH, pricing.verify_tokens, policy, **kw)
    return result, programs


# ------------------------------------------------------------------ one device = the evaluation


@pytest.mark.parametrize("uplink", ["equal_split", "tdma"])
@pytest.mark.parametrize(
    "variant", ["hlm", "uhlm_risk_prone", "cuhlm_online", "fixed_topk", "llm_only", "slm_only"]
)
def test_one_device_reproduces_the_cuhlm_evaluation_exactly(variant, uplink):
    table = token_table(upload_prob=0.0 if variant in ("llm_only", "slm_only") else 0.6)
    base = fading_base_seed(SEED, CONDITION)
    for seed_index in (0, 3):
        result, programs = one_run(cuhlm(variant), table, seed_index, 1, uplink, slot_s=0.001)
        # The evaluation's own functions, on the evaluation's own draws.
        delays = apply_channel(
            table,
            variant,
            CONDITION,
            PROFILE,
            VOCAB,
            8,
            token_gains(table, CONDITION, base, seed_index),
            variant in ("uhlm_risk_prone", "cuhlm_online", "fixed_topk"),
        )
        expected = np.concatenate(
            [
                delays[table.index[table["prompt_id"] == p]][
                    np.argsort(table.loc[table["prompt_id"] == p, "position"].to_numpy())
                ]
                for p in programs[0].prompts
            ]
        )
        assert programs[0].prompts == sorted(table["prompt_id"].unique())
        np.testing.assert_allclose(result.step_latencies(0), expected, rtol=RTOL, atol=0)
        # And so the throughput: tokens over summed delay.
        assert len(table) / result.makespan_s == pytest.approx(len(table) / delays.sum(), rel=RTOL)


@pytest.mark.parametrize("uplink", ["equal_split", "tdma"])
@pytest.mark.parametrize(
    "variant", ["vanilla_sd", "topk_accept", "head_no_csi", "wisv_fh", "wisv_sh"]
)
def test_one_device_reproduces_the_wisv_evaluation_exactly(variant, uplink):
    rounds = round_table()
    assert (rounds["num_mismatches"] > 0).any() and (rounds["num_mismatches"] == 0).any()
    pricing = wisv(variant)
    for seed_index in (0, 2):
        table = rounds
        if variant in ("wisv_fh", "wisv_sh"):  # decoded on this seed's draws
            table = attach_channel(rounds, CONDITION, fading_seed(SEED, seed_index))
        result, programs = one_run(pricing, table, seed_index, 1, uplink, slot_s=0.002)
        costs = price_over_seeds(
            {seed_index: table}, variant, CONDITION, PROTOCOL, PROFILE, 4, SEED, head_s=0.002
        ).set_index("prompt_id")
        ends = result.step_ends[0]
        counted = programs[0].step_counted
        # Per answer: the prompt's prefill and its rounds, as the evaluation's latency_s.
        prefill_steps = np.flatnonzero(~counted)
        starts = np.concatenate([[0.0], ends])[prefill_steps]
        answer_ends = np.concatenate([ends[prefill_steps[1:] - 1], [ends[-1]]])
        got = pd.Series(answer_ends - starts, index=programs[0].prompts)
        np.testing.assert_allclose(
            got.to_numpy(), costs.loc[got.index, "latency_s"].to_numpy(), rtol=RTOL, atol=0
        )
        assert programs[0].tokens == costs["tokens"].sum()
        reference = pricing.single_device_delays(table, seed_index)
        assert check_single_device(result, programs[0], reference) < RTOL


def test_the_single_device_check_catches_a_different_pricing():
    table = token_table()
    result, programs = one_run(cuhlm("hlm"), table, 0, 1)
    reference = cuhlm("hlm", profile=LatencyProfile(0.01, 0.05)).single_device_delays(table, 0)
    with pytest.raises(ValueError, match="single-device evaluation"):
        check_single_device(result, programs[0], reference)


# ------------------------------------------------------------------------- sharing the band


def _wide(condition: ChannelCondition, factor: float) -> ChannelCondition:
    return ChannelCondition.from_dict(
        {**condition.to_dict(), "bandwidth_hz": condition.bandwidth_hz * factor}
    )


def _alone(pricing, table, seed_index, prompts):
    """Each device's step latencies when it runs alone (one device, unlimited edge)."""
    per_prompt = pricing.prompt_programs(table, seed_index)
    out = []
    for ids in prompts:
        from edgespec.multidevice.workload import DeviceProgram

        program = DeviceProgram.concatenate(ids, [per_prompt[p] for p in ids])
        single = simulate([program], "equal_split", BATCH, 1, BatchingPolicy(), unlimited_edge=True)
        out.append(single.step_latencies(0))
    return out


@pytest.mark.parametrize("devices", [2, 4, 5])
def test_band_scaled_by_n_with_unlimited_edge_gives_the_single_device_figures(devices):
    table = token_table(prompts=5)
    narrow, wide = cuhlm("hlm"), cuhlm("hlm", condition=_wide(CONDITION, devices))
    per_prompt = wide.prompt_programs(table, 1)
    programs = device_programs(per_prompt, prompt_order(table), devices)
    alone = _alone(narrow, table, 1, [p.prompts for p in programs])
    # TDMA's fluid limit: each device owns 1/N of N W, exactly its single-device band.
    fluid = simulate(programs, "tdma", BATCH, 1, BatchingPolicy(), slot_s=0.0, unlimited_edge=True)
    for i in range(devices):
        np.testing.assert_allclose(fluid.step_latencies(i), alone[i], rtol=RTOL, atol=1e-12)
    np.testing.assert_allclose(
        [p.tokens / f for p, f in zip(programs, fluid.finish_s, strict=True)],
        [p.tokens / a.sum() for p, a in zip(programs, alone, strict=True)],
        rtol=RTOL,
    )
    # Finite TDMA slots: every transmission (one per step here) ends within one frame of the
    # fluid share, earlier when it finds its slot starting, later when it waits for it.
    frame = devices * 0.002
    slotted = simulate(
        programs, "tdma", BATCH, 1, BatchingPolicy(), slot_s=0.002, unlimited_edge=True
    )
    for i in range(devices):
        extra = slotted.step_latencies(i) - alone[i]
        assert np.abs(extra).max() <= frame + 1e-12
        assert np.abs(extra).max() > 0
    # Equal split among those transmitting: never slower than alone, faster when others idle.
    shared = simulate(programs, "equal_split", BATCH, 1, BatchingPolicy(), unlimited_edge=True)
    gained = 0.0
    for i in range(devices):
        diff = alone[i] - shared.step_latencies(i)
        gained += diff.sum()
        assert shared.finish_s[i] <= alone[i].sum() * (1 + RTOL)
    assert gained > 0


def test_equal_split_of_a_scaled_band_among_devices_in_lockstep_is_the_single_device():
    """N copies of one device transmit together, so each gets exactly N W / N = W."""
    table = token_table(prompts=1)
    devices = 4
    wide = cuhlm("hlm", condition=_wide(CONDITION, devices))
    program = device_programs(wide.prompt_programs(table, 0), ["q0"], 1)[0]
    alone = _alone(cuhlm("hlm"), table, 0, [["q0"]])[0]
    shared = simulate(
        [program] * devices, "equal_split", BATCH, 1, BatchingPolicy(), unlimited_edge=True
    )
    for i in range(devices):
        np.testing.assert_allclose(shared.step_latencies(i), alone, rtol=RTOL, atol=1e-12)


def _transmitter(work_and_start):
    return [[(WAIT, start), (UP, work), (END, 0.0)] for work, start in work_and_start]


def test_equal_split_hand_computed():
    # A: 1 s of work from t=0; B: 3 s from t=0; C: 0.5 s from t=1.
    # 0-2: A and B at 1/2 each -> A done at 2 (B has 2 left); C joined at 1: from 1, three
    # share: A has 0.5 left at t=1, B 2.5, C 0.5 -> A and C end at 1 + 0.5*3 = 2.5; then B
    # alone with 2.5 - 0.5 = 2 left -> ends at 4.5.
    result = simulate(
        _transmitter([(1.0, 0.0), (3.0, 0.0), (0.5, 1.0)]),
        "equal_split",
        BATCH,
        1,
        BatchingPolicy(),
    )
    np.testing.assert_allclose(result.finish_s, [2.5, 4.5, 2.5], rtol=1e-12)
    assert result.uplink_busy_s == pytest.approx(4.5)


def test_tdma_hand_computed():
    # Slot 1 ms, 4 slots, device 2 owns [2, 3), [6, 7), ... ms.
    assert tdma_finish(0.0005, 0.0015, 2, 4, 0.001) == pytest.approx(0.0065)
    assert tdma_finish(0.0021, 0.0005, 2, 4, 0.001) == pytest.approx(0.0026)
    assert tdma_finish(0.0025, 0.001, 2, 4, 0.001) == pytest.approx(0.0065)
    assert tdma_finish(0.0, 0.002, 0, 4, 0.001) == pytest.approx(0.005)
    assert tdma_finish(1.0, 0.3, 1, 3, 0.0) == pytest.approx(1.9)
    assert tdma_finish(1.23, 0.3, 0, 1, 0.001) == 1.23 + 0.3
    result = simulate(
        _transmitter([(0.0015, 0.0005)] * 3), "tdma", BATCH, 1, BatchingPolicy(), slot_s=0.001
    )
    # Frame of three 1-ms slots: devices 0, 1, 2 own [0,1), [1,2), [2,3) ms of each frame;
    # device 0 sends 0.5 ms in [0.5, 1) and the rest in [3, 4).
    np.testing.assert_allclose(result.finish_s, [0.004, 0.0045, 0.0055], rtol=1e-9)


# ------------------------------------------------------------------------------ edge batching


def _requesters(arrivals, service=0.03):
    return [[(WAIT, a), (VERIFY, service), (END, 0.0)] for a in arrivals]


def test_batch_when_ready_with_window_and_max_batch_hand_computed():
    f3 = BATCH.factor(1, 3)
    f2 = BATCH.factor(1, 2)
    # No window: the first goes alone at 0; the other two wait and go together at 0.03.
    r = simulate(_requesters([0.0, 0.01, 0.02]), "equal_split", BATCH, 1, BatchingPolicy())
    assert r.batch_sizes == [1, 2]
    np.testing.assert_allclose(r.finish_s, [0.03, 0.03 + 0.03 * f2, 0.03 + 0.03 * f2])
    assert r.edge_wait_s == pytest.approx(0.02 + 0.01)
    # A window long enough: held until all three devices wait (t = 0.02), then one batch.
    r = simulate(_requesters([0.0, 0.01, 0.02]), "equal_split", BATCH, 1, BatchingPolicy(None, 0.5))
    assert r.batch_sizes == [3]
    np.testing.assert_allclose(r.finish_s, [0.02 + 0.03 * f3] * 3)
    # A short window: the oldest waits 0.015 s, then goes with the one that came.
    r = simulate(
        _requesters([0.0, 0.01, 0.02]), "equal_split", BATCH, 1, BatchingPolicy(None, 0.015)
    )
    assert r.batch_sizes == [2, 1]
    first = 0.015 + 0.03 * f2
    np.testing.assert_allclose(r.finish_s, [first, first, first + 0.03])
    # A cap: four at once, at most two per forward.
    r = simulate(_requesters([0.0] * 4), "equal_split", BATCH, 1, BatchingPolicy(2, 0.0))
    assert r.batch_sizes == [2, 2]
    np.testing.assert_allclose(r.finish_s, [0.03 * f2] * 2 + [0.06 * f2] * 2)
    # A cap above the number of devices is never reached (nor timed).
    r = simulate(_requesters([0.0] * 3), "equal_split", BATCH, 1, BatchingPolicy(64, 0.0))
    assert r.batch_sizes == [3]
    # One device never waits for companions, whatever the window.
    r = simulate(_requesters([0.0]), "equal_split", BATCH, 1, BatchingPolicy(None, 5.0))
    assert r.finish_s[0] == pytest.approx(0.03)


def test_solo_jobs_are_served_alone_in_arrival_order():
    programs = [
        [(SOLO, 0.1), (END, 0.0), (VERIFY, 0.03), (END, 0.0)],
        [(WAIT, 0.01), (VERIFY, 0.03), (END, 0.0)],
        [(WAIT, 0.02), (VERIFY, 0.03), (END, 0.0)],
        [(WAIT, 0.05), (SOLO, 0.02), (END, 0.0)],
    ]
    r = simulate(programs, "equal_split", BATCH, 1, BatchingPolicy())
    # Device 0's prefill runs alone 0-0.1. Then the oldest waiting request is device 1's
    # verification: it goes with every waiting verification (device 0's arrived at 0.1) ahead
    # of device 3's prefill, which then runs alone.
    assert r.solo_jobs == 2 and r.batch_sizes == [3]
    end = 0.1 + 0.03 * BATCH.factor(1, 3)
    np.testing.assert_allclose(r.finish_s, [end, end, end, end + 0.02])
    assert [d for d, _ in r.served] == [0, 1, 2, 0, 3]


def test_batch_times_interpolate_and_refuse_to_extrapolate():
    times = BatchTimes({"1": {"1": 0.1, "4": 0.16}, "9": {"1": 0.2, "4": 0.5}})
    assert times.factor(1, 1) == 1.0 and times.factor(9, 1) == 1.0
    assert times.seconds(1, 2) == pytest.approx(0.12)
    assert times.seconds(5, 1) == pytest.approx(0.15)
    assert times.seconds(5, 4) == pytest.approx(0.33)
    assert times.factor(9, 4) == pytest.approx(2.5)
    assert BatchTimes.from_dict(times.to_dict()).table == times.table
    # Timing noise never makes a larger batch cheaper: the running maximum over batch sizes.
    noisy = BatchTimes({"1": {"1": 0.1, "2": 0.09, "4": 0.2}})
    assert noisy.factor(1, 2) == 1.0 and noisy.seconds(1, 3) == pytest.approx(0.15)
    assert noisy.table[1][2] == 0.09  # the record keeps what was measured
    with pytest.raises(ValueError, match="largest timed batch"):
        times.seconds(1, 5)
    with pytest.raises(ValueError, match="outside the timed token counts"):
        times.seconds(10, 1)
    with pytest.raises(ValueError, match="batch size 1"):
        BatchTimes({"1": {"2": 0.1}})
    with pytest.raises(ValueError, match="> 0"):
        BatchTimes({"1": {"1": 0.0}})
    with pytest.raises(ValueError, match="window_s"):
        BatchingPolicy(None, -1.0)


# ---------------------------------------------------------------------------- conservation


@pytest.mark.parametrize(
    ("uplink", "policy"),
    [
        ("equal_split", BatchingPolicy()),
        ("equal_split", BatchingPolicy(3, 0.02)),
        ("tdma", BatchingPolicy(2, 0.0)),
        ("tdma", BatchingPolicy(None, 0.05)),
    ],
)
def test_every_token_and_round_is_served_exactly_once(uplink, policy):
    for pricing, table in (
        (cuhlm("uhlm_risk_prone"), token_table(prompts=6, upload_prob=0.5)),
        (wisv("wisv_sh"), attach_channel(round_table(prompts=6), CONDITION, fading_seed(SEED, 0))),
    ):
        per_prompt = pricing.prompt_programs(table, 0)
        programs = device_programs(per_prompt, prompt_order(table), 9)
        result = simulate(programs, uplink, BATCH, pricing.verify_tokens, policy, slot_s=0.001)
        requests = Counter(
            (d, i)
            for d, p in enumerate(programs)
            for i, (op, _) in enumerate(p.legs)
            if op in (VERIFY, SOLO)
        )
        served = Counter(result.served)
        assert served == requests and max(served.values()) == 1
        assert sum(result.batch_sizes) + result.solo_jobs == sum(requests.values())
        if policy.max_batch:
            assert max(result.batch_sizes) <= policy.max_batch
        for d, p in enumerate(programs):
            assert len(result.step_ends[d]) == len(p.step_tokens)  # every step committed once
            assert np.all(np.diff(result.step_ends[d]) >= 0)
        # Every device decodes the whole split: each prompt's tokens exactly once per device.
        assert all(sorted(p.prompts) == sorted(prompt_order(table)) for p in programs)
        expected = (
            table.groupby("prompt_id")["num_committed" if "num_committed" in table else "position"]
            .agg("sum" if "num_committed" in table else "size")
            .sum()
        )
        assert all(p.tokens == expected for p in programs)
        assert result.transmissions == sum(op == UP for p in programs for op, _ in p.legs)


# ------------------------------------------------------------------------------- saturation


SETTINGS = SweepSettings([1, 2, 4, 8, 16, 32], ["equal_split", "tdma"], 0.0005, BatchingPolicy())


@pytest.mark.parametrize("bottleneck", ["band", "edge"])
def test_a_method_that_skips_more_uploads_saturates_later(bottleneck):
    """Two methods on the same tokens, draws, compute and payloads; one uploads every token, the
    other every eighth. A narrow band (or a slow edge) saturates first under the first."""
    if bottleneck == "band":
        # An upload (200 entries, 3,600 bit at 69 kbit/s) takes 52 ms, a verification 10 ms,
        # the device 50 ms per token: half of every token's time is on the band.
        condition = ChannelCondition(name="narrow", fading="awgn", bandwidth_hz=2e4, snr_db=10.0)
        profile = LatencyProfile(draft_token_s=0.05, target_token_s=0.01)
    else:
        # Uploads take microseconds, a verification 50 ms, the device 50 ms per token.
        condition = ChannelCondition(name="wide", fading="awgn", bandwidth_hz=1e9, snr_db=30.0)
        profile = LatencyProfile(draft_token_s=0.05, target_token_s=0.05)
    frames = []
    for method, every in (("hlm", 1), ("uhlm_risk_prone", 8)):
        table = token_table(prompts=4, tokens=16, every_k=every)
        table["k"] = np.where(table["uploaded"], 200, 0)
        pricing = CuhlmPricing(method, condition, profile, VOCAB, 8, SEED)
        runs = sweep({0: table, 1: table}, pricing, BATCH, SETTINGS)
        frames.append(runs.assign(method=method, channel=condition.name))
    runs = pd.concat(frames, ignore_index=True)
    sat = saturation_table(runs, utilisation=0.9, efficiency=0.5).set_index(["method", "uplink"])
    for uplink in ("equal_split", "tdma"):
        every, sparse = sat.loc[("hlm", uplink)], sat.loc[("uhlm_risk_prone", uplink)]
        assert every["saturation_n"] < sparse["saturation_n"], uplink
        assert every["bottleneck"] == bottleneck
        assert every["scaling_limit_n"] <= sparse["scaling_limit_n"]
    summary = summary_table(runs)
    one = summary[summary["devices"] == 1]
    assert np.allclose(one["scaling"], 1.0) and np.allclose(one["efficiency"], 1.0)


def test_sweep_is_deterministic_and_shares_the_draws_across_methods():
    table = token_table(prompts=3, upload_prob=1.0)
    a = sweep({0: table, 1: table}, cuhlm("hlm"), BATCH, SETTINGS)
    b = sweep({0: table, 1: table}, cuhlm("hlm"), BATCH, SETTINGS)
    pd.testing.assert_frame_equal(a, b)
    assert not a[(a["devices"] == 32)].duplicated(["uplink"]).all()  # the seeds differ
    # Common random numbers: the same token of the same prompt under the same seed is sent at
    # the same rate by any method and any device that decodes it.
    other = table.assign(k=VOCAB)
    legs = {}
    for name, t in (("hlm", other), ("cuhlm_online", other.assign(k=VOCAB))):
        per_prompt = cuhlm(name).prompt_programs(t, 1)
        legs[name] = [v for op, v in per_prompt["q1"].legs if op == UP]
    assert legs["hlm"] == legs["cuhlm_online"]
    alone = cuhlm("hlm").prompt_programs(other[other["prompt_id"] == "q1"], 1)["q1"]
    assert [v for op, v in alone.legs if op == UP] == legs["hlm"]


def test_device_assignment_round_robin_over_the_split():
    assert coprime_strides(16) == [1, 15, 3, 13, 5, 11, 7, 9]
    assert coprime_strides(1) == [1]
    assert device_prompts(5, 1) == [[0, 1, 2, 3, 4]]
    orders = device_prompts(4, 8)
    assert [o[0] for o in orders] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert all(sorted(o) == [0, 1, 2, 3] for o in orders)
    assert len({tuple(o) for o in orders}) == 8  # devices i and i + P step differently
    assert device_prompts(4, 3, prompts_per_device=2) == [[0, 1], [1, 2], [2, 3]]


def test_summary_and_headline_on_hand_built_runs():
    rows = []
    for seed, slow in enumerate([1.0, 1.1, 0.9]):
        for n, agg, edge, band in ((1, 10.0, 0.3, 0.1), (2, 18.0, 0.95, 0.2), (4, 20.0, 1.0, 0.4)):
            rows.append(
                {
                    "method": "m",
                    "family": "cuhlm",
                    "step": "token",
                    "channel": "good",
                    "uplink": "equal_split",
                    "devices": n,
                    "seed": seed,
                    "prompts": 3,
                    "aggregate_tps": agg * slow,
                    "per_device_tps": agg * slow / n,
                    "latency_p50_s": 0.1 * n,
                    "latency_p95_s": 0.2 * n * slow,
                    "latency_mean_s": 0.1,
                    "edge_utilisation": edge,
                    "mean_batch": 1.0 * n,
                    "edge_wait_mean_s": 0.0,
                    "uplink_utilisation": band * (2 if seed == 2 else 1),
                }
            )
    runs = pd.DataFrame(rows)
    summary = summary_table(runs, level=0.9)
    top = summary[summary["devices"] == 4].iloc[0]
    assert top["seeds"] == 3 and top["scaling"] == pytest.approx(2.0)
    assert top["aggregate_tps"] == pytest.approx(20.0)
    assert top["aggregate_tps_lo"] < 20.0 < top["aggregate_tps_hi"]
    sat = saturation_table(runs, utilisation=0.9, efficiency=0.6).iloc[0]
    assert sat["edge_saturation_n"] == 2 and sat["bottleneck"] == "edge"
    assert math.isinf(sat["band_saturation_n"])  # band at most 0.8 of the time
    assert sat["scaling_limit_n"] == 4  # 20 / 4 / 10 = 0.5 < 0.6
    table = headline(summary, saturation_table(runs, 0.9, 0.6), "equal_split", "good")
    assert list(table.columns) == ["metric", "paper", "ours", "ours_lo", "ours_hi", "unit", "where"]
    assert len(table) == 5 and (table["paper"] == "-").all()
    assert set(table["unit"]) == {"tokens/s", "x", "s", "devices"}
    assert discrete_interval([2, 4, math.inf], 0.9) == (4.0, 2.0, math.inf)


# ---------------------------------------------------------------------- profiling and config


def test_batched_forwards_are_timed_at_every_size_on_the_prompt(tiny_target):
    prompt = list(range(1, 12))
    seen = []

    def hook(module, args, kwargs):
        cache = kwargs.get("cache")
        seen.append(
            (
                tuple(kwargs["input_ids"].shape),
                cache.get_seq_length() if cache is not None else None,
            )
        )

    handle = tiny_target.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        table = measure_target_batch_times(tiny_target, prompt, [1, 5], [1, 3], repeats=2)
    finally:
        handle.remove()
    assert set(table) == {"1", "5"} and all(set(r) == {"1", "3"} for r in table.values())
    assert all(s > 0 for r in table.values() for s in r.values())
    assert BatchTimes(table).factor(5, 1) == 1.0
    # One prefill of the prompt, then warm-up + 2 timed forwards per size, each on the prompt
    # (the previous forward cropped off), with the batch and tokens asked for.
    assert seen[0] == ((1, 11), 0)
    timed = seen[1:]
    assert Counter(shape for shape, _ in timed) == {(1, 1): 3, (1, 5): 3, (3, 1): 3, (3, 5): 3}
    assert {length for _, length in timed} == {len(prompt)}
    with pytest.raises(ValueError):
        measure_target_batch_times(tiny_target, prompt, [0], [1], repeats=1)


def test_multidevice_settings_are_checked_before_any_job():
    cfg = validate_config({})
    check_multidevice_settings(cfg)
    assert multidevice_batch_plan(cfg) == {"tokens": [1, 5], "sizes": [1, 2, 4, 8, 16, 32]}
    capped = validate_config({"multidevice": {"batching": {"max_batch": 8}}})
    assert multidevice_batch_plan(capped)["sizes"] == [1, 2, 4, 8]
    for bad, key in (
        ({"multidevice": {"channels": ["awful"]}}, "multidevice.channels"),
        ({"multidevice": {"wisv_gamma": 5}}, "multidevice.wisv_gamma"),
        (
            {"multidevice": {"methods": ["fixed_topk"]}, "cuhlm": {"variants": ["hlm"]}},
            "multidevice.methods",
        ),
        (
            {"latency": {"mode": "given"}, "multidevice": {"device_counts": [1, 64]}},
            "multidevice.target_batch_s",
        ),
        (
            {
                "latency": {"mode": "given"},
                "multidevice": {"target_batch_s": {"1": {"1": 0.1, "32": 0.2}}},
            },
            "multidevice.target_batch_s",
        ),
    ):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            check_multidevice_settings(validate_config(bad))
    with pytest.raises(ConfigError, match="multidevice.uplink"):
        validate_config({"multidevice": {"uplink": ["cdma"]}})
    check_multidevice_settings(
        validate_config({"multidevice": {"enabled": False, "channels": ["x"]}})
    )
