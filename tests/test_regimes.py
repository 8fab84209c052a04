"""The WISV pricing regimes (edgespec.wisv.regimes, hardware.WisvTestbed) and what they do to
the policy: on the emulated testbed a repair's cost moves with the channel, so the relabeled
safe fraction and the CSI head's accept rate rise as the channel worsens (a constructed case);
and the relabel_csi and evaluate_wisv scripts run on constructed inputs."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from script_runner import Snakemake, run_script

from edgespec.config import ConfigError, check_wisv_settings, validate_config, wisv_channels
from edgespec.hardware import WisvTestbed
from edgespec.wireless.delay import LatencyProfile
from edgespec.wisv.csi import csi_ranges, repair_cost_rounds, round_compute_s, sample_csi
from edgespec.wisv.head_quality import accept_by_state
from edgespec.wisv.policy import trend
from edgespec.wisv.protocols import fh_payload
from edgespec.wisv.regimes import Pricing, check_regimes, regime_pricing
from edgespec.wisv.relabel import relabel_under_csi
from edgespec.wisv.training import LabeledSet, train_heads

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]
DEFAULT = yaml.safe_load((ROOT / "config.yaml").read_text())
CHANNELS = wisv_channels(validate_config(DEFAULT))
WISV = {
    "relabel": {**DEFAULT["wisv"]["relabel"], "num_csi_samples": 12, "gamma": 4},
    "correlation": 0.8,
    "csi_features": ["snr_db_instantaneous", "rate_mbps", "rtt_ms", "per"],
    "arq": {"packet_bits": 1080, "max_retransmissions": 3, "timeout_s": None},
}
WISV["relabel"].update({"lam_rounds_per_risk": 2.0, "risk_budget": None})


def _testbed() -> Pricing:
    return Pricing.from_dict(regime_pricing("testbed", hidden_bits=16, gammas=[4, 8]))


def _cpu() -> Pricing:
    """A measured-like regime: a 2-core CPU's half-second rounds."""
    profile = LatencyProfile(0.06, 0.2, {4: 0.21, 8: 0.23}, source="measured")
    provenance = {"models": {"target": {"logits_size": 151936}, "draft": {"hidden_size": 896}}}
    head_times = {"head_round_s": {"wisv_head": 1e-4, "no_csi_head": 1e-4}}
    return Pricing.from_dict(
        regime_pricing(
            "measured",
            hidden_bits=16,
            gammas=[4],
            measured_profile=profile.to_dict(),
            head_times=head_times,
            provenance=provenance,
        )
    )


def test_testbed_pricing_from_the_roofline_hand_computed():
    p = _testbed()
    # Llama-3.2-1B in fp16 at 204.8 GB/s, Llama-3.1-8B at 696 GB/s: one weight pass a forward.
    assert p.profile.draft_token_s == pytest.approx(1.24e9 * 2 / 204.8e9)
    assert p.profile.target_verify(4) == pytest.approx(8.03e9 * 2 / 696e9)
    assert p.profile.target_verify(8) == p.profile.target_verify(4)
    assert p.profile.draft_prefill_token_s == pytest.approx(2 * 1.24e9 / 42.5e12)
    assert p.profile.target_prefill_token_s == pytest.approx(2 * 8.03e9 / 149.7e12)
    assert p.protocol == {"vocab_size": 128256, "hidden_size": 2048, "bits_per_value": 16}
    # A logistic head over 2048 + 4096 hidden values and 4 CSI features, float32, at 696 GB/s.
    head = regime_pricing("testbed", hidden_bits=16, gammas=[4], csi_features=4)
    assert head["head_times"]["head_round_s"]["wisv_head"] == pytest.approx(6149 * 4 / 696e9)
    assert "Jetson AGX Orin" in p.description and "A40" in p.description
    with pytest.raises(ValueError, match="wisv.testbed: unknown"):
        WisvTestbed.from_dict({"gpu": 1})


def test_measured_pricing_reads_the_profile_head_times_and_sizes():
    p = _cpu()
    assert p.profile.draft_token_s == 0.06 and p.protocol["hidden_size"] == 896
    assert p.head_times["head_round_s"]["wisv_head"] == 1e-4
    with pytest.raises(ValueError, match="needs the profile"):
        regime_pricing("measured", hidden_bits=16, gammas=[4])


def test_regimes_config():
    assert check_regimes(["testbed"]) == ["measured", "testbed"]
    with pytest.raises(ValueError, match="wisv.regimes"):
        check_regimes(["cloud"])
    config = validate_config(DEFAULT)
    config["wisv"]["testbed_gammas"] = [16]
    with pytest.raises(ConfigError, match="wisv.testbed_gammas"):
        check_wisv_settings(config)
    config = validate_config(DEFAULT)
    config["wisv"]["channels"]["poor"]["per_a"] = 1.0
    with pytest.raises(ConfigError, match="packet-error fits"):
        check_wisv_settings(config)


def _mined(n_prompts: int = 15, per_prompt: int = 4, seed: int = 0):
    """Mined mismatches with graded risks spread over [0, 1], and hidden states that carry the
    risk (draft state 0) so that a head can learn it."""
    rng = np.random.default_rng(seed)
    n = n_prompts * per_prompt
    risk = rng.uniform(0.0, 1.0, n)
    table = pd.DataFrame(
        {
            "prompt_id": np.repeat([f"p{i}" for i in range(n_prompts)], per_prompt),
            "position": np.tile(np.arange(per_prompt), n_prompts),
            "draft_token": rng.integers(0, 100, n),
            "target_token": rng.integers(0, 100, n),
            "risk": risk,
            "label": (risk > 0.5).astype(np.int64),
        }
    )
    draft = np.column_stack([risk, rng.normal(size=(n, 2))]).astype(np.float32)
    target = rng.normal(size=(n, 2)).astype(np.float32)
    return table, draft, target


def test_under_the_testbed_the_policy_moves_with_the_channel():
    """The paper's channels priced on the emulated testbed: a repair costs from about 1.3 to
    1.9 rounds across the CSI samples, so the safe fraction rises with the repair cost, and a
    CSI head trained on those labels accepts more held-out mismatches on worse channels. On a
    CPU's half-second rounds the same channels barely move the cost."""
    table, draft, target = _mined()
    testbed = relabel_under_csi(table, _testbed(), CHANNELS, WISV, np.random.default_rng(1))
    cpu = relabel_under_csi(table, _cpu(), CHANNELS, WISV, np.random.default_rng(1))
    lo, hi = testbed.summary["repair_cost_rounds"]
    cpu_lo, cpu_hi = cpu.summary["repair_cost_rounds"]
    assert hi - lo > 0.5 and hi - lo > 5 * (cpu_hi - cpu_lo), (lo, hi, cpu_lo, cpu_hi)
    safe = trend(testbed.safe["repair_cost"], testbed.safe["safe_fraction"])
    assert safe["spearman"] > 0.8 and safe["at_worst"] - safe["at_best"] > 0.3
    torch.set_num_threads(1)
    data = LabeledSet(table, testbed.relabeled, draft, target, tuple(WISV["csi_features"]))
    settings = {
        "hidden": 16,
        "epochs": 80,
        "lr": 0.02,
        "weight_decay": 0.0,
        "patience": 80,
        "val_fraction": 0.3,
        "max_accuracy_drop": 0.5,
    }
    heads, validation = train_heads(data, settings, seed=2)
    states = (
        testbed.relabeled.drop_duplicates("csi_sample")
        .sort_values("csi_sample")[["csi_sample", "repair_cost"]]
        .reset_index(drop=True)
    )
    wisv_head = heads["wisv_head"]
    accept = accept_by_state(
        wisv_head.q_val,
        wisv_head.tau,
        states,
        testbed.relabeled.iloc[validation.relabel_split[1]],
    )
    rate = trend(accept["repair_cost"], accept["accept_rate"])
    assert rate["spearman"] > 0.5 and rate["at_worst"] > rate["at_best"]


def test_relabel_script_prices_every_csi_sample_itself(tmp_path):
    """workflow/scripts/relabel_csi.py on constructed labels: each CSI sample's rows carry
    that sample's own repair cost and labels solved under it (a script that priced every
    sample like the first, or solved the relabeling once for all samples, fails here)."""
    table, _, _ = _mined(seed=3)
    table.to_parquet(tmp_path / "m.parquet")
    pricing = regime_pricing("testbed", hidden_bits=16, gammas=[4])
    (tmp_path / "pricing.json").write_text(json.dumps(pricing))
    out = {k: tmp_path / f"{k}.x" for k in ("train", "safe", "summary", "figure")}
    run_script(
        "relabel_csi",
        Snakemake(
            input={"table": tmp_path / "m.parquet", "pricing": tmp_path / "pricing.json"},
            output=out,
            params={"wisv": WISV, "channels": CHANNELS, "seed": 5},
            log=tmp_path / "relabel.log",
        ),
    )
    train = pd.read_parquet(out["train"])
    p = Pricing.from_dict(pricing)
    samples = sample_csi(csi_ranges(CHANNELS, WISV["relabel"]), 12, _rng(5), 0.8, _fit())
    bits = fh_payload(4, 128256, 2048, 16).uplink_bits
    t0 = round_compute_s(p.profile, 4, p.head_times["head_round_s"]["wisv_head"])
    costs = [repair_cost_rounds(s, bits, t0) for s in samples]
    assert len(set(np.round(costs, 9))) == 12
    for i, cost in enumerate(costs):
        rows = train[train["csi_sample"] == i]
        assert rows["repair_cost"].to_numpy() == pytest.approx(cost)
        risk = rows["risk"].to_numpy()
        np.testing.assert_array_equal(rows["label_csi"], (2.0 * risk > cost).astype(int))
    summary = json.loads(out["summary"].read_text())
    assert summary["regime"] == "testbed"
    assert summary["repair_cost_rounds"] == pytest.approx([min(costs), max(costs)])


def _rng(seed):
    from edgespec.seeding import numpy_rng

    return numpy_rng(seed, "relabel")


def _fit():
    from edgespec.wisv.csi import per_fit

    return per_fit(CHANNELS)


def test_study_config_sizes_a_calibration_pool_of_a_thousand_mismatches():
    """config/study.yaml merged over config.yaml validates, grades risks over several
    continuations, and mines at most 8 mismatches from each of >= 500 head-training prompts
    (the default pair finds about 3 per prompt under a cap of 4: >= 1,000 mismatches), which
    are disjoint from the calibration and evaluation prompts."""
    from edgespec.data.prepare import split_sizes

    study = yaml.safe_load((ROOT / "config" / "study.yaml").read_text())
    merged = {**DEFAULT, **study, "wisv": {**DEFAULT["wisv"], **study["wisv"]}}
    merged["wisv"]["relabel"] = {**DEFAULT["wisv"]["relabel"], **study["wisv"]["relabel"]}
    config = validate_config(merged)
    check_wisv_settings(config)
    data = config["data"]
    sizes = [
        split_sizes(
            spec["n"],
            spec.get("calib_fraction") or data["calib_fraction"],
            spec.get("train_fraction") or data.get("train_fraction"),
        )
        for spec in data["datasets"].values()
    ]
    mined = sum(size["train"] for size in sizes)  # mine_labels reads the train split
    assert mined >= 500
    assert mined * config["wisv"]["max_mismatches_per_prompt"] >= 4000
    assert all(size["calib"] > 0 and size["eval"] > 0 for size in sizes)
    assert config["wisv"]["label_continuations"] > 1
