"""The testbed end to end on a tiny random pair: device, edge and link as three processes over
loopback TCP. Every protocol's answers commit the single-process decode's tokens and put the
model's bytes plus the stated overhead on the wire; a dead edge or a damaged frame stops the
device with a named error, never a hang (each fault starts processes of its own: slow)."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pandas as pd
import pytest

from edgespec.data.records import PromptRecord
from edgespec.models.load import load_pair_from_dir
from edgespec.models.pair import fetch_pair
from edgespec.testbed.link import LinkPlan
from edgespec.testbed.reference import reference_tokens
from edgespec.testbed.session import Testbed, TestbedError
from edgespec.testbed.stage import answer_decoding, device_policies, run_channel
from edgespec.testbed.summary import compare_answers, markdown, summarise
from edgespec.wireless.delay import LatencyProfile
from edgespec.wisv.head import DecisionHead, save_head

CORPUS = ["def add(a, b):\n    return a + b", "x = [i * i for i in range(10)]", "print('hi')"]
METHODS = ["hlm", "cuhlm_online", "vanilla_sd", "wisv_fh", "wisv_sh"]
SEED = 11
SETTINGS = {
    "max_new_tokens": 8,
    "gamma": 4,
    "fading_seed": 0,
    "prob_bits": 32,
    "hidden_bits": 32,
    "max_uplink_s": 10.0,
    "packet_error_rate": {},
    "packet_bytes": 1500,
    "arq_timeout_s": None,
    "reply_timeout_s": 60.0,
}
CHANNELS = {
    "fast": {"fading": "rayleigh", "bandwidth_hz": 2e6, "snr_db": 20.0, "rtt_s": 0.002},
}
FIT = {"a": 0.8, "b": -0.05, "r2": 0.5, "pearson_r": 0.7, "n": 100}
FIT.update(u_th_risk_averse=0.06, u_th_risk_prone=0.2, u_th=0.2)
POLICY = {"uncertainty_samples": 4, "theta_max": 2.0, "theta_tv": 0.1, "online_k_max": None}
RECORDS = [PromptRecord(f"p{i}", "x", None, None, "instruction", "instructions") for i in (0, 1)]
PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16, 17, 18, 19]]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("testbed")
    cache = root / "cache" / "tiny_random"
    fetch_pair("tiny_random", cache, corpus=CORPUS, progress=False)
    models = json.loads((cache / "provenance.json").read_text())["models"]
    sizes = {
        "vocab_size": models["target"]["logits_size"],
        "hidden_size": models["draft"]["hidden_size"],
    }
    head = DecisionHead(sizes["hidden_size"], sizes["hidden_size"], 3)
    csi = ["snr_db_instantaneous", "rate_mbps", "rtt_ms"]
    save_head(head, root / "head.pt", {"tau": 0.45, "csi_features": csi})
    heads = {"wisv_fh": str(root / "head.pt"), "wisv_sh": str(root / "head.pt")}
    return cache, sizes, heads


@pytest.fixture(scope="module")
def answered(pair):
    """Every method's answers to both prompts through the testbed, and the single-process
    reference decodes."""
    cache, sizes, heads = pair
    policies = device_policies(METHODS, POLICY, FIT)
    with Testbed(cache, {"dtype": "float32"}, heads=heads) as testbed:
        tables = run_channel(
            testbed,
            "fast",
            CHANNELS["fast"],
            METHODS,
            RECORDS,
            PROMPTS,
            SETTINGS,
            sizes,
            1.0,
            0,
            policies,
            SEED,
        )
        eos = testbed.eos_token_ids
    draft, target, _ = load_pair_from_dir(cache, {"dtype": "float32"}, 1)
    decoding = {"temperature": 1.0, "eos_token_ids": eos, "pad_token_id": 0}
    reference = reference_tokens(
        (draft, target),
        METHODS,
        CHANNELS,
        RECORDS,
        PROMPTS,
        SETTINGS,
        decoding,
        policies,
        heads,
        SEED,
    )
    return tables, reference, sizes


def _compare(answered):
    tables, reference, sizes = answered
    profile = LatencyProfile(0.001, 0.002, {4: 0.003}, 0.0005)
    return compare_answers(
        tables["answers"],
        tables["frames"],
        tables["tokens"],
        tables["rounds"],
        reference,
        CHANNELS,
        profile,
        {"head_round_s": {"wisv_head": 0.0001}},
        sizes,
        SETTINGS,
        SEED,
    )


def test_every_protocol_commits_the_single_process_decodes_tokens(answered):
    tables, reference, _ = answered
    answers = tables["answers"]
    assert sorted(answers["method"].unique()) == sorted(METHODS)
    for row in answers.itertuples():
        ref = reference[
            (reference["method"] == row.method) & (reference["prompt_id"] == row.prompt_id)
        ]
        assert list(row.tokens) == list(ref["tokens"].iloc[0]), row.method
        assert len(row.tokens) > 0
    assert _compare(answered)["tokens_equal"].all()


def test_each_protocol_sends_its_own_messages(answered):
    frames = answered[0]["frames"]
    kinds = {m: set(frames[frames["method"] == m]["kind"]) for m in METHODS}
    assert {"TOKEN_UP", "TOKEN_VERDICT"} <= kinds["hlm"]
    assert "DRAFT_IDS" in kinds["vanilla_sd"] and "DRAFT_FH" not in kinds["vanilla_sd"]
    assert "DRAFT_FH" in kinds["wisv_fh"] and "HIDDEN" not in kinds["wisv_fh"]
    assert {"DRAFT_IDS", "REQUEST", "HIDDEN"} <= kinds["wisv_sh"]
    hlm = frames[(frames["method"] == "hlm") & (frames["kind"] == "TOKEN_UP")]
    cuhlm = frames[(frames["method"] == "cuhlm_online") & (frames["kind"] == "TOKEN_UP")]
    assert hlm["bytes"].min() > cuhlm["bytes"].max()  # the full distribution against a top-k


def test_the_link_carries_exactly_the_models_bytes_plus_the_stated_overhead(answered):
    per_answer = _compare(answered)
    assert per_answer["bytes_equal"].all()
    assert (per_answer["link_up_bytes"] > per_answer["model_up_bits"] / 8).all()
    tokens = answered[0]["tokens"]
    uploads = tokens[tokens["uploaded"]]
    assert ((uploads["k"] == answered[2]["vocab_size"]) == (uploads["method"] == "hlm")).all()
    summary = summarise(per_answer, SEED)
    assert summary["bytes_equal"].all() and summary["tokens_equal"].all()
    assert np.isfinite(summary["ratio"]).all() and (summary["ratio_lo"] <= summary["ratio"]).all()
    text = markdown(summary, "tiny pair")
    assert "# Testbed against simulator" in text and "wisv_sh" in text


def test_sh_requests_exactly_the_mismatched_positions(answered):
    rounds = answered[0]["rounds"]
    sh = rounds[rounds["method"] == "wisv_sh"]
    assert (sh["requested"] == sh["num_mismatches"]).all() and sh["num_mismatches"].any()
    fh = rounds[rounds["method"] == "wisv_fh"]
    pd.testing.assert_series_equal(
        fh["num_accepted"].reset_index(drop=True), sh["num_accepted"].reset_index(drop=True)
    )


def _slow_job(pair, label):
    """One HLM answer over a 20 kbit/s uplink: each upload takes a few tenths of a second."""
    from edgespec.testbed.answer import AnswerJob
    from edgespec.testbed.messages import WireSpec

    cache, sizes, _ = pair
    spec = WireSpec(sizes["vocab_size"], 32, sizes["hidden_size"], 32, 1)
    cfg = answer_decoding("hlm", SETTINGS, 1.0, [], 0)
    policy = device_policies(["hlm"], POLICY)["hlm"]
    rates = (2e4,) * SETTINGS["max_new_tokens"]
    job = AnswerJob(
        "hlm", "slow", label, tuple(PROMPTS[0]), spec, cfg, 1, rates, (1.0,) * 8, 0.01,
        100.0, 30.0, 5.0, policy=policy,
    )  # fmt: skip
    return job, rates


@pytest.mark.slow
def test_a_killed_edge_stops_the_device_with_a_clear_error_at_once(pair):
    cache, _, heads = pair
    job, rates = _slow_job(pair, "killed")
    with Testbed(cache, {"dtype": "float32"}, heads=heads) as testbed:
        errors = []

        def answer():
            try:
                testbed.run(job, LinkPlan(rates, 0.01, label=job.label), deadline_s=60.0)
            except TestbedError as err:
                errors.append((time.monotonic(), str(err)))

        worker = threading.Thread(target=answer)
        worker.start()
        time.sleep(1.0)
        killed = time.monotonic()
        testbed.kill("edge")
        worker.join(timeout=30.0)
        assert not worker.is_alive(), "the device hung on a dead edge"
    assert errors, "a dead edge went unnoticed"
    when, text = errors[0]
    assert when - killed < 10.0
    assert "device failed" in text and "closed" in text and "edge process exited" in text


@pytest.mark.slow
@pytest.mark.parametrize("how", ["payload", "length"])
def test_a_frame_damaged_on_the_link_is_named_by_the_edge(pair, how):
    cache, _, heads = pair
    job, rates = _slow_job(pair, how)
    plan = LinkPlan((1e7,) * 8, 0.001, corrupt=(("up", 1, how),), label=job.label)
    with Testbed(cache, {"dtype": "float32"}, heads=heads, frame_s=2.0) as testbed:
        start = time.monotonic()
        with pytest.raises(TestbedError) as err:
            testbed.run(job, plan, deadline_s=60.0)
        assert time.monotonic() - start < 30.0
    text = str(err.value)
    assert "the edge failed" in text
    assert ("checksum" in text) or (how == "length" and "truncated" in text)


@pytest.mark.slow
def test_sh_rounds_without_a_mismatch_request_nothing_and_still_verify(pair, tmp_path):
    """A pair whose target is the draft itself: every draft matches, so no SH round requests
    hidden states, and the edge's head still verifies the round (rows of zeros it never reads)."""
    import shutil

    cache, sizes, heads = pair
    twin = tmp_path / "twin"
    shutil.copytree(cache, twin)
    for item in (twin / "draft").iterdir():
        if item.suffix in (".json", ".safetensors"):
            shutil.copy2(item, twin / "target" / item.name)
    policies = device_policies(["wisv_sh"], POLICY)
    with Testbed(twin, {"dtype": "float32"}, heads=heads) as testbed:
        tables = run_channel(
            testbed, "fast", CHANNELS["fast"], ["wisv_sh"], RECORDS[:1], PROMPTS[:1],
            SETTINGS, sizes, 1.0, 0, policies, SEED,
        )  # fmt: skip
    rounds, frames = tables["rounds"], tables["frames"]
    assert len(rounds) > 0 and (rounds["num_mismatches"] == 0).all()
    assert (rounds["num_accepted"] == SETTINGS["gamma"]).all()
    assert not frames["kind"].isin(["REQUEST", "HIDDEN"]).any()
