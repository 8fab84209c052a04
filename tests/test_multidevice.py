"""Many devices, one edge: the discrete-event simulation against the single-device evaluation,
band sharing, edge batching and its costs, equal work on the edge, independent devices, the
run metrics pinned on hand-computed cases, the sweep and the batched-forward timer."""

from __future__ import annotations

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
from edgespec.multidevice.batchprofile import BatchProfile
from edgespec.multidevice.devices import (
    Replicate,
    bootstrap_prompts,
    coprime_strides,
    device_channels,
    device_prompts,
    prompt_order,
    replicates,
)
from edgespec.multidevice.edge import BatchingPolicy, BatchTimes, EdgeCost
from edgespec.multidevice.simulate import END, SOLO, UP, VERIFY, WAIT, simulate
from edgespec.multidevice.sweep import (
    SweepSettings,
    check_single_device,
    run_metrics,
    sweep,
)
from edgespec.multidevice.uplink import tdma_finish
from edgespec.multidevice.workload import CuhlmPricing, DeviceProgram, WisvPricing
from edgespec.profiling import BatchedForwardTimer
from edgespec.wireless.channel import ChannelCondition
from edgespec.wireless.delay import LatencyProfile
from edgespec.wisv.evaluate import attach_channel, fading_seed, price_over_seeds

VOCAB = 1000
SEED = 11
CONDITION = ChannelCondition(
    name="good", fading="rayleigh", bandwidth_hz=2e6, snr_db=10.0, rtt_s=0.01, correlation=0.8
)
POOR = ChannelCondition(
    name="poor", fading="rayleigh", bandwidth_hz=2e6, snr_db=-5.0, rtt_s=0.03, correlation=0.8
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
EDGE = EdgeCost(BATCH, 1, 0.03)  # a lone 1-token request costs 0.03 s
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
                    "gain": np.nan,
                    "rate_bps": np.nan,
                }
            )
            done += committed
            r += 1
    return pd.DataFrame(rows)


def cuhlm(variant, condition=CONDITION, profile=PROFILE, lengths=None):
    prefill = "alone" if lengths is not None else "none"
    return CuhlmPricing(
        variant, condition, profile, VOCAB, 8, SEED, prompt_tokens=lengths, prefill=prefill
    )


def wisv(variant, condition=CONDITION, gamma=4, head_s=0.002, prefill="alone"):
    return WisvPricing(
        variant, condition, PROFILE, gamma, PROTOCOL, SEED, head_s=head_s, prefill=prefill
    )


def edge_of(pricing, times=BATCH):
    return EdgeCost(times, *pricing.anchor)


def programs_of(pricing, table, devices, seed_index=0):
    """Each device's program in a replicate on fading seed ``seed_index`` (device d on its own
    stream), the prompts as in the sweep."""
    rep = Replicate(seed_index, prompt_order(table))
    out = []
    for d, ids in enumerate(rep.assignment(devices, None)):
        seed, stream = rep.fading(d)
        per_prompt = pricing.prompt_programs(table, seed, stream)
        out.append(DeviceProgram.concatenate(ids, [per_prompt[p] for p in ids]))
    return out


def one_run(pricing, table, seed_index, devices, uplink="equal_split", **kw):
    programs = programs_of(pricing, table, devices, seed_index)
    policy = kw.pop("policy", BatchingPolicy())
    result = simulate(programs, uplink, edge_of(pricing), policy, **kw)
    return result, programs


def skipped_before_each_upload(table, prompt):
    rows = table[table["prompt_id"] == prompt].sort_values("position")
    out, run = [], 0
    for up in rows["uploaded"]:
        out.append(run if up else -1)
        run = 0 if up else run + 1
    return np.array(out)


# ------------------------------------------------------------------ one device = the evaluation


@pytest.mark.parametrize("uplink", ["equal_split", "tdma"])
@pytest.mark.parametrize(
    "variant", ["hlm", "uhlm_risk_prone", "cuhlm_online", "fixed_topk", "llm_only", "slm_only"]
)
def test_one_device_is_the_cuhlm_evaluation_plus_the_catch_up(variant, uplink):
    table = token_table(upload_prob=0.0 if variant in ("llm_only", "slm_only") else 0.35)
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
        expected, catch_up = [], []
        for p in programs[0].prompts:
            rows = table[table["prompt_id"] == p].sort_values("position")
            expected.append(delays[rows.index.to_numpy()])
            # An upload after s skipped tokens is verified over s + 1 tokens: with this table
            # (0.03 s at 1 token, 0.036 s at 5, linear and extrapolated along it) and the
            # profile's 0.03 s anchor, that costs 0.0015 s per skipped token more.
            s = skipped_before_each_upload(table, p)
            catch_up.append(np.where(s >= 0, 0.0015 * np.maximum(s, 0), 0.0))
        assert programs[0].prompts == sorted(table["prompt_id"].unique())
        got = result.step_latencies(0)
        np.testing.assert_allclose(
            got, np.concatenate(expected) + np.concatenate(catch_up), rtol=RTOL, atol=1e-15
        )
        if variant not in ("llm_only", "slm_only"):
            assert max(np.concatenate(catch_up)) >= 0.0015 * 5  # beyond the timed 5 tokens too
        reference = cuhlm(variant).single_device_delays(table, seed_index, edge_of(cuhlm(variant)))
        assert check_single_device(result, programs[0], reference) < RTOL


def test_an_upload_after_skipped_tokens_asks_the_edge_to_catch_up():
    table = token_table(prompts=1, tokens=10, upload_prob=0.5, seed=3)
    legs = cuhlm("hlm").prompt_programs(table, 0)["q0"].legs
    verified = [int(v) for op, v in legs if op == VERIFY]
    s = skipped_before_each_upload(table, "q0")
    assert verified == [int(x) + 1 for x in s[s >= 0]]
    assert max(verified) > 1


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
        reference = pricing.single_device_delays(table, seed_index, edge_of(pricing))
        assert check_single_device(result, programs[0], reference) < RTOL


def test_every_method_pays_its_prompts_prefill_the_same_way():
    table = token_table(prompts=3)
    lengths = {"q0": 20, "q1": 23, "q2": 26}
    rounds = round_table(prompts=3)  # prompt_tokens 20, 23, 26
    for pricing, frame in (
        (cuhlm("hlm", lengths=lengths), table),
        (cuhlm("llm_only", lengths=lengths), token_table(prompts=3, upload_prob=0.0)),
        (cuhlm("slm_only", lengths=lengths), token_table(prompts=3, upload_prob=0.0)),
        (wisv("vanilla_sd"), rounds),
    ):
        per_prompt = pricing.prompt_programs(frame, 0)
        for pid, length in lengths.items():
            program = per_prompt[pid]
            first_end = next(i for i, (op, _) in enumerate(program.legs) if op == END)
            prefill = program.legs[:first_end]
            draft = [v for op, v in prefill if op == WAIT]
            target = [v for op, v in prefill if op == SOLO]
            # The draft's prefill on the device, the target's on the edge, served alone.
            assert draft == (
                [] if pricing.variant == "llm_only" else [pytest.approx(length * 1e-4)]
            )
            assert target == (
                [] if pricing.variant == "slm_only" else [pytest.approx(length * 3e-4)]
            )
            assert not program.step_counted[0] and program.step_tokens[0] == 0
    # Policy "none": no method pays one.
    assert not any(
        op == SOLO
        for op, _ in wisv("vanilla_sd", prefill="none").prompt_programs(rounds, 0)["q0"].legs
    )
    with pytest.raises(ValueError, match="prompt length"):
        cuhlm("hlm", lengths={"q0": 20}).prompt_programs(table, 0)


def test_the_single_device_check_catches_a_different_pricing():
    table = token_table()
    result, programs = one_run(cuhlm("hlm"), table, 0, 1)
    other = cuhlm("hlm", profile=LatencyProfile(0.01, 0.05))
    reference = other.single_device_delays(table, 0, edge_of(other))
    with pytest.raises(ValueError, match="single-device evaluation"):
        check_single_device(result, programs[0], reference)


# ------------------------------------------------------------------------- sharing the band


def _wide(condition: ChannelCondition, factor: float) -> ChannelCondition:
    return ChannelCondition.from_dict(
        {**condition.to_dict(), "bandwidth_hz": condition.bandwidth_hz * factor}
    )


def _alone(pricing, programs):
    """Each device's step latencies when it runs alone (one device, unlimited edge)."""
    out = []
    for program in programs:
        single = simulate(
            [program], "equal_split", edge_of(pricing), BatchingPolicy(), unlimited_edge=True
        )
        out.append(single.step_latencies(0))
    return out


@pytest.mark.parametrize("devices", [2, 4, 5])
def test_band_scaled_by_n_with_unlimited_edge_gives_the_single_device_figures(devices):
    table = token_table(prompts=5)
    narrow, wide = cuhlm("hlm"), cuhlm("hlm", condition=_wide(CONDITION, devices))
    programs = programs_of(wide, table, devices, 1)
    alone = _alone(narrow, programs_of(narrow, table, devices, 1))
    edge = edge_of(wide)
    # TDMA's fluid limit: each device owns 1/N of N W, exactly its single-device band.
    fluid = simulate(programs, "tdma", edge, BatchingPolicy(), slot_s=0.0, unlimited_edge=True)
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
    slotted = simulate(programs, "tdma", edge, BatchingPolicy(), slot_s=0.002, unlimited_edge=True)
    for i in range(devices):
        extra = slotted.step_latencies(i) - alone[i]
        assert np.abs(extra).max() <= frame + 1e-12
        assert np.abs(extra).max() > 0
    # Equal split among those transmitting: never slower than alone, faster when others idle.
    shared = simulate(programs, "equal_split", edge, BatchingPolicy(), unlimited_edge=True)
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
    program = programs_of(wide, table, 1)[0]
    alone = _alone(cuhlm("hlm"), programs_of(cuhlm("hlm"), table, 1))[0]
    shared = simulate(
        [program] * devices, "equal_split", EDGE, BatchingPolicy(), unlimited_edge=True
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
        _transmitter([(1.0, 0.0), (3.0, 0.0), (0.5, 1.0)]), "equal_split", EDGE, BatchingPolicy()
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
        _transmitter([(0.0015, 0.0005)] * 3), "tdma", EDGE, BatchingPolicy(), slot_s=0.001
    )
    # Frame of three 1-ms slots: devices 0, 1, 2 own [0,1), [1,2), [2,3) ms of each frame;
    # device 0 sends 0.5 ms in [0.5, 1) and the rest in [3, 4).
    np.testing.assert_allclose(result.finish_s, [0.004, 0.0045, 0.0055], rtol=1e-9)


# ------------------------------------------------------------------------------ edge batching


def _requesters(arrivals, tokens=1):
    return [[(WAIT, a), (VERIFY, tokens), (END, 0.0)] for a in arrivals]


def test_batch_when_ready_with_window_and_max_batch_hand_computed():
    f3 = BATCH.factor(1, 3)
    f2 = BATCH.factor(1, 2)
    # No window: the first goes alone at 0; the other two wait and go together at 0.03.
    r = simulate(_requesters([0.0, 0.01, 0.02]), "equal_split", EDGE, BatchingPolicy())
    assert r.batch_sizes == [1, 2]
    np.testing.assert_allclose(r.finish_s, [0.03, 0.03 + 0.03 * f2, 0.03 + 0.03 * f2])
    assert r.edge_wait_s == pytest.approx(0.02 + 0.01)
    # A window long enough: held until all three devices wait (t = 0.02), then one batch.
    r = simulate(_requesters([0.0, 0.01, 0.02]), "equal_split", EDGE, BatchingPolicy(None, 0.5))
    assert r.batch_sizes == [3]
    np.testing.assert_allclose(r.finish_s, [0.02 + 0.03 * f3] * 3)
    # A short window: the oldest waits 0.015 s, then goes with the one that came.
    r = simulate(_requesters([0.0, 0.01, 0.02]), "equal_split", EDGE, BatchingPolicy(None, 0.015))
    assert r.batch_sizes == [2, 1]
    first = 0.015 + 0.03 * f2
    np.testing.assert_allclose(r.finish_s, [first, first, first + 0.03])
    # A cap: four at once, at most two per forward.
    r = simulate(_requesters([0.0] * 4), "equal_split", EDGE, BatchingPolicy(2, 0.0))
    assert r.batch_sizes == [2, 2]
    np.testing.assert_allclose(r.finish_s, [0.03 * f2] * 2 + [0.06 * f2] * 2)
    # A cap above the number of devices is never reached (nor timed).
    r = simulate(_requesters([0.0] * 3), "equal_split", EDGE, BatchingPolicy(64, 0.0))
    assert r.batch_sizes == [3]
    # One device never waits for companions, whatever the window.
    r = simulate(_requesters([0.0]), "equal_split", EDGE, BatchingPolicy(None, 5.0))
    assert r.finish_s[0] == pytest.approx(0.03)


def test_a_finished_device_is_no_companion_in_the_batching_window():
    # A and B ask together at 0 and go in one batch; A is then done. B asks again 0.1 s after
    # its answer: with a 5 s window it must not wait for A, which will never ask again.
    programs = [
        [(VERIFY, 1), (END, 0.0)],
        [(VERIFY, 1), (END, 0.0), (WAIT, 0.1), (VERIFY, 1), (END, 0.0)],
    ]
    r = simulate(programs, "equal_split", EDGE, BatchingPolicy(None, 5.0))
    first = 0.03 * BATCH.factor(1, 2)
    assert r.batch_sizes == [2, 1]
    np.testing.assert_allclose(r.finish_s, [first, first + 0.1 + 0.03])
    assert r.edge_wait_s == pytest.approx(0.0)


def test_a_batch_is_one_flattened_forward_over_its_rows():
    # Rows of 1 and 3 tokens: 4 tokens over 2 rows = seconds(2, 2) / seconds(1, 1) anchor units.
    # seconds(1, 2) = 0.03 + 0.01 / 3; seconds(5, 2) = 0.036 + 0.024 / 7; read at 2 tokens.
    at1, at5 = 0.03 + 0.01 / 3, 0.036 + 0.024 / 7
    expected = 0.03 * (at1 + (at5 - at1) / 4) / 0.03
    r = simulate(
        [[(VERIFY, 1), (END, 0.0)], [(VERIFY, 3), (END, 0.0)]],
        "equal_split",
        EDGE,
        BatchingPolicy(),
    )
    assert r.batch_sizes == [2] and r.finish_s[0] == pytest.approx(expected, rel=1e-12)
    assert EDGE.batch_s([1, 3]) == EDGE.batch_s([2, 2])  # only the total and the rows count
    # A WISV anchor: gamma + 1 = 5 tokens at target_verify(4) = 0.036 s.
    wisv_edge = edge_of(wisv("vanilla_sd"))
    assert wisv_edge.alone_s(5) == 0.036
    assert wisv_edge.batch_s([5] * 8) == pytest.approx(0.036 * 0.06 / 0.036)
    # Rows above the largest timed count are extrapolated, and counted.
    r = simulate([[(VERIFY, 9), (END, 0.0)]], "equal_split", EDGE, BatchingPolicy())
    assert r.finish_s[0] == pytest.approx(0.03 + 8 * 0.0015) and r.extrapolated_batches == 1


def test_solo_jobs_are_served_alone_in_arrival_order():
    programs = [
        [(SOLO, 0.1), (END, 0.0), (VERIFY, 1), (END, 0.0)],
        [(WAIT, 0.01), (VERIFY, 1), (END, 0.0)],
        [(WAIT, 0.02), (VERIFY, 1), (END, 0.0)],
        [(WAIT, 0.05), (SOLO, 0.02), (END, 0.0)],
    ]
    r = simulate(programs, "equal_split", EDGE, BatchingPolicy())
    # Device 0's prefill runs alone 0-0.1. Then the oldest waiting request is device 1's
    # verification: it goes with every waiting verification (device 0's arrived at 0.1) ahead
    # of device 3's prefill, which then runs alone.
    assert r.solo_jobs == 2 and r.batch_sizes == [3]
    end = 0.1 + 0.03 * BATCH.factor(1, 3)
    np.testing.assert_allclose(r.finish_s, [end, end, end, end + 0.02])
    assert [d for d, _ in r.served] == [0, 1, 2, 0, 3]
    assert r.prefill_busy_s == pytest.approx(0.12)


def test_batch_times_interpolate_extrapolate_tokens_and_never_batches():
    times = BatchTimes({"1": {"1": 0.1, "4": 0.16}, "9": {"1": 0.2, "4": 0.5}})
    assert times.factor(1, 1) == 1.0 and times.factor(9, 1) == 1.0
    assert times.seconds(1, 2) == pytest.approx(0.12)
    assert times.seconds(5, 1) == pytest.approx(0.15)
    assert times.seconds(5, 4) == pytest.approx(0.33)
    assert times.factor(9, 4) == pytest.approx(2.5)
    # Above the largest timed count: along the last two counts.
    assert times.seconds(13, 1) == pytest.approx(0.25) and times.extrapolates(13)
    assert BatchTimes.from_dict(times.to_dict()).table == times.table
    # A forward over more rows never takes less time: the isotonic fit pools a decreasing pair
    # into its mean (a running maximum would charge 0.1 from batch 2 on).
    noisy = BatchTimes({"1": {"1": 0.1, "2": 0.09, "4": 0.2}})
    assert noisy.seconds(1, 1) == pytest.approx(0.095) and noisy.seconds(1, 2) == pytest.approx(
        0.095
    )
    assert noisy.seconds(1, 3) == pytest.approx(0.1475)
    assert noisy.table[1][2] == 0.09  # the record keeps what was measured
    with pytest.raises(ValueError, match="largest timed batch"):
        times.seconds(1, 5)
    with pytest.raises(ValueError, match="one timed token count"):
        BatchTimes({"1": {"1": 0.1}}).seconds(2, 1)
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
    lengths = {f"q{p}": 10 + p for p in range(6)}
    for pricing, table in (
        (cuhlm("uhlm_risk_prone", lengths=lengths), token_table(prompts=6, upload_prob=0.5)),
        (wisv("vanilla_sd"), round_table(prompts=6)),
    ):
        programs = programs_of(pricing, table, 9)
        result = simulate(programs, uplink, edge_of(pricing), policy, slot_s=0.001)
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


# --------------------------------------------------------------------- independent devices


def _uploads(program):
    return [v for op, v in program.legs if op == UP]


def test_every_device_has_its_own_fading_stream_the_same_for_every_method():
    table = token_table(prompts=2, upload_prob=1.0).assign(k=VOCAB)
    # Devices 0 and 2 both start on prompt q0 (P = 2): their draws differ.
    a, _, b = programs_of(cuhlm("hlm"), table, 3, seed_index=1)
    assert a.prompts[0] == b.prompts[0] == "q0"
    n = len(table[table["prompt_id"] == "q0"])
    assert _uploads(a)[:n] != _uploads(b)[:n]
    # Device 0 is the single-device evaluation's draws; any device's are method-independent.
    alone = cuhlm("hlm").prompt_programs(table, 1)
    assert _uploads(alone["q0"]) == _uploads(a)[:n]
    other = programs_of(cuhlm("cuhlm_online"), table, 3, seed_index=1)
    assert [_uploads(p) for p in other] == [_uploads(p) for p in (a, _, b)]
    # The same for WISV rounds, keyed by (prompt, round), device stream and seed.
    rounds = round_table(prompts=2)
    w0, _, w2 = programs_of(wisv("vanilla_sd"), rounds, 3)
    r0 = len(rounds[rounds["prompt_id"] == "q0"])
    assert _uploads(w0)[:r0] != _uploads(w2)[:r0]
    assert _uploads(programs_of(wisv("topk_accept"), rounds, 3)[2])[:r0] == _uploads(w2)[:r0]


def test_csi_variants_cycle_the_decoded_seeds_over_devices():
    rep = Replicate(3, ["q0", "q1"], decoded_seeds=(0, 4))
    assert [rep.fading(d) for d in range(4)] == [(4, 0), (0, 0), (4, 0), (0, 0)]
    assert Replicate(3, ["q0"]).fading(5) == (3, 5)
    rounds = round_table(prompts=2)
    decoded = attach_channel(rounds, CONDITION, fading_seed(SEED, 4))
    with pytest.raises(ValueError, match="decoded on other draws"):
        wisv("wisv_sh").prompt_programs(decoded, 0)
    assert wisv("wisv_sh").prompt_programs(decoded, 4, device=7)  # its stream is the decode's


def test_replicates_resample_the_prompts_the_same_way_for_every_method():
    prompts = [f"q{i}" for i in range(8)]
    reps = replicates(prompts, 4, SEED)
    assert reps[0].prompts == prompts  # replicate 0: the split itself
    assert all(len(r.prompts) == 8 and set(r.prompts) <= set(prompts) for r in reps)
    assert any(len(set(r.prompts)) < 8 for r in reps[1:])  # drawn with replacement
    assert [r.prompts for r in reps] == [r.prompts for r in replicates(prompts, 4, SEED)]
    assert bootstrap_prompts(prompts, 2, SEED) != bootstrap_prompts(prompts, 3, SEED)
    assert device_channels(["good", "poor"], 5) == ["good", "poor", "good", "poor", "good"]


def test_device_assignment_round_robin_over_the_split():
    assert coprime_strides(16) == [1, 15, 3, 13, 5, 11, 7, 9]
    assert coprime_strides(1) == [1]
    assert device_prompts(5, 1) == [[0, 1, 2, 3, 4]]
    orders = device_prompts(4, 8)
    assert [o[0] for o in orders] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert all(sorted(o) == [0, 1, 2, 3] for o in orders)
    assert len({tuple(o) for o in orders}) == 8  # devices i and i + P step differently
    assert device_prompts(4, 3, prompts_per_device=2) == [[0, 1], [1, 2], [2, 3]]


# -------------------------------------------------------------------------- metrics, pinned


def _program(legs, tokens, counted):
    return DeviceProgram(
        prompts=["p"],
        legs=legs,
        step_tokens=np.array(tokens),
        step_counted=np.array(counted),
        edge_requests=sum(op in (VERIFY, SOLO) for op, _ in legs),
    )


def test_p50_and_p95_on_a_hand_computed_trace_with_the_prefill_left_out():
    # One device: a 100 s prefill (not a token), then tokens taking 1, 2, ..., 20 s.
    legs = [(SOLO, 100.0), (END, 0.0)]
    for i in range(1, 21):
        legs += [(WAIT, float(i)), (END, 0.0)]
    program = _program(legs, [0] + [1] * 20, [False] + [True] * 20)
    m = run_metrics(simulate([program], "equal_split", EDGE, BatchingPolicy()), [program])
    # numpy's linear quantiles of 1..20: p50 = 10.5, p95 = 1 + 0.95 * 19 = 19.05 (p90: 18.1).
    assert m["token_latency_p50_s"] == pytest.approx(10.5)
    assert m["token_latency_p95_s"] == pytest.approx(19.05)
    assert m["token_latency_mean_s"] == pytest.approx(10.5)
    assert m["steps"] == 20 and m["tokens"] == 20
    assert m["aggregate_tps"] == pytest.approx(20 / 310)  # the prefill does take time
    assert m["edge_utilisation"] == pytest.approx(100 / 310) and m["prefill_share"] == 1.0


def test_throughput_and_latency_of_two_devices_hand_computed():
    # A: two local tokens of 1 s. B: a 0.5 s prefill on the edge, then a round committing 3
    # tokens: 0.25 s of drafting and a lone 1-token verification (0.03 s), so B ends at 0.78.
    a = _program([(WAIT, 1.0), (END, 0.0), (WAIT, 1.0), (END, 0.0)], [1, 1], [True, True])
    b = _program(
        [(SOLO, 0.5), (END, 0.0), (WAIT, 0.25), (VERIFY, 1), (END, 0.0)], [0, 3], [False, True]
    )
    result = simulate([a, b], "equal_split", EDGE, BatchingPolicy())
    np.testing.assert_allclose(result.finish_s, [2.0, 0.78])
    m = run_metrics(result, [a, b])
    assert m["aggregate_tps"] == pytest.approx(5 / 2.0)
    assert m["per_device_tps"] == pytest.approx((2 / 2.0 + 3 / 0.78) / 2)
    assert m["min_device_tps"] == pytest.approx(1.0)
    # Per token: A's 1, 1 and B's round of 0.28 s over its 3 tokens.
    per_token = np.array([1.0, 1.0, 0.28 / 3, 0.28 / 3, 0.28 / 3])
    assert m["token_latency_p50_s"] == pytest.approx(np.quantile(per_token, 0.5))
    assert m["token_latency_mean_s"] == pytest.approx(per_token.mean())
    assert m["token_latency_p95_s"] == pytest.approx(1.0)
    assert m["step_latency_p95_s"] == pytest.approx(np.quantile([1.0, 1.0, 0.28], 0.95))
    assert m["edge_utilisation"] == pytest.approx(0.53 / 2.0)
    assert m["prefill_share"] == pytest.approx(0.5 / 0.53)
    assert m["mean_batch"] == 1.0 and m["edge_wait_mean_s"] == 0.0 and m["edge_requests"] == 2


# ---------------------------------------------------------------------------------- the sweep


SETTINGS = SweepSettings(
    [1, 2, 4, 8], ["equal_split", "tdma"], 0.0005, BatchingPolicy(), None, [2], [0.02]
)


def run_sweep(pricing, table, settings=SETTINGS, count=3, decoded=(), profile=None):
    profile = profile or BatchProfile(
        {0: {t: {b: [s] for b, s in row.items()} for t, row in BATCH.table.items()}}, "given"
    )
    reps = replicates(prompt_order(table), count, SEED, decoded)
    return sweep(
        lambda name, seed: table, {"good": pricing}, ["good"], reps, profile, settings, SEED
    )


def test_sweep_scenarios_replicates_and_the_single_device_check():
    table = token_table(prompts=3, upload_prob=0.7)
    runs = run_sweep(cuhlm("hlm"), table)
    labels = {"base", "max_batch=2", "window=20 ms"}
    assert set(runs["policy"]) == labels and set(runs["replicate"]) == {0, 1, 2}
    assert set(runs.loc[runs["policy"] != "base", "uplink"]) == {"equal_split"}
    assert len(runs) == 3 * (2 + 2) * 4
    single = runs[(runs["devices"] == 1) & (runs["replicate"] == 0)]
    assert single["single_device_rel_diff"].max() < RTOL
    assert runs.loc[runs["policy"] == "max_batch=2", "max_batch"].max() <= 2
    pd.testing.assert_frame_equal(runs, run_sweep(cuhlm("hlm"), table))  # deterministic
    assert (runs["fading_seeds"] == 3).all()
    csi = run_sweep(
        wisv("wisv_sh"),
        attach_channel(round_table(prompts=3), CONDITION, fading_seed(SEED, 0)),
        decoded=(0,),
    )
    assert (csi["fading_seeds"] == 1).all()


def test_timing_spread_reaches_the_replicates_but_not_replicate_zero():
    table = token_table(prompts=3, upload_prob=1.0)
    rng = np.random.default_rng(0)
    noisy = BatchProfile(
        {
            0: {
                t: {b: list(s * rng.uniform(0.7, 1.3, 7)) for b, s in row.items()}
                for t, row in BATCH.table.items()
            }
        }
    )
    plain = run_sweep(cuhlm("hlm"), table, profile=noisy)
    again = run_sweep(cuhlm("hlm"), table, profile=noisy)
    pd.testing.assert_frame_equal(plain, again)
    top = plain[(plain["devices"] == 8) & (plain["policy"] == "base")]
    # The same fading seed and prompts with the fitted profile and with a draw differ.
    assert top.groupby("replicate")["aggregate_tps"].first().nunique() == 3


def test_a_method_that_skips_more_uploads_carries_more_devices():
    """Two methods on the same tokens, draws, compute and payloads; one uploads every token,
    the other every eighth. The edge (50 ms a verification) bounds the first sooner."""
    from edgespec.multidevice.capacity import capacity_table
    from edgespec.multidevice.summary import summary_table

    condition = ChannelCondition(name="good", fading="awgn", bandwidth_hz=1e9, snr_db=30.0)
    profile = LatencyProfile(draft_token_s=0.05, target_token_s=0.05)
    settings = SweepSettings([1, 2, 4, 8, 16, 32], ["equal_split"], 0.0, BatchingPolicy())
    frames = []
    for method, every in (("hlm", 1), ("uhlm_risk_prone", 8)):
        table = token_table(prompts=4, tokens=16, every_k=every)
        table["k"] = np.where(table["uploaded"], 200, 0)
        pricing = CuhlmPricing(method, condition, profile, VOCAB, 8, SEED, prefill="none")
        runs = run_sweep(pricing, table, settings, count=2)
        frames.append(runs.assign(method=method, channel="good"))
    runs = pd.concat(frames, ignore_index=True)
    summary = summary_table(runs)
    limits = {"knee_gain": 0.1, "min_device_tokens_per_s": 5.0, "max_token_latency_p95_s": 1.0}
    cap = capacity_table(runs, summary, limits).set_index("method")
    assert cap.loc["hlm", "peak_tps"] < cap.loc["uhlm_risk_prone", "peak_tps"]
    assert cap.loc["hlm", "knee_n"] <= cap.loc["uhlm_risk_prone", "knee_n"]
    assert cap.loc["hlm", "service_n"] < cap.loc["uhlm_risk_prone", "service_n"]
    one = summary[summary["devices"] == 1]
    assert np.allclose(one["scaling"], 1.0) and np.allclose(one["efficiency"], 1.0)


# ---------------------------------------------------------------------- profiling and config


def test_batched_forwards_are_timed_on_each_context_and_size(tiny_target):
    prompt = list(range(1, 12))
    seen = []

    def hook(module, args, kwargs):
        cache = kwargs.get("cache")
        seen.append((tuple(kwargs["input_ids"].shape), cache.get_seq_length()))

    handle = tiny_target.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        timer = BatchedForwardTimer(tiny_target, prompt, [11, 20], [1, 3])
        prefills = list(seen)
        seen.clear()
        timer.warm_up([1, 5])
        assert timer(20, 5, 3) > 0 and timer(11, 1, 1) > 0
    finally:
        handle.remove()
    # One prefill per context at batch 1 (the prompt continued to 20 tokens), no other.
    assert prefills == [((1, 11), 0), ((1, 20), 0)]
    # Each forward sees its context, the previous one cropped off.
    assert Counter(seen) == {
        ((1, 1), 11): 2,
        ((1, 5), 11): 1,
        ((3, 1), 11): 1,
        ((3, 5), 11): 1,
        ((3, 5), 20): 1,
    }
    with pytest.raises(ValueError, match="contexts"):
        BatchedForwardTimer(tiny_target, prompt, [5], [1])


def test_multidevice_settings_are_checked_before_any_job():
    cfg = validate_config({})
    check_multidevice_settings(cfg)
    assert multidevice_batch_plan(cfg) == {"tokens": [1, 5], "sizes": [1, 2, 4, 8, 16, 32]}
    capped = validate_config(
        {"multidevice": {"batching": {"max_batch": 8}, "policy_sweep": {"max_batch": [3]}}}
    )
    assert multidevice_batch_plan(capped)["sizes"] == [1, 2, 3, 4, 8]
    for bad, key in (
        ({"multidevice": {"channels": ["awful"]}}, "multidevice.channels"),
        (
            {"multidevice": {"populations": {"mix": ["good", "awful"]}}},
            "multidevice.populations.mix",
        ),
        ({"multidevice": {"populations": {"poor": ["good"]}}}, "multidevice.populations.poor"),
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
    with pytest.raises(ConfigError, match="batch_repeats"):
        validate_config({"multidevice": {"batch_repeats": 2}})
    check_multidevice_settings(
        validate_config({"multidevice": {"enabled": False, "channels": ["x"]}})
    )
