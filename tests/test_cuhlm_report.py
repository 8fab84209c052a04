"""The CU-HLM report (rule report_cuhlm): tables, cells and the Markdown page built from small
constructed artifacts."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from edgespec.cuhlm.quality import interval_cell
from edgespec.cuhlm.report import (
    FIGURES,
    JOINT_COLUMNS,
    ReportInputs,
    ReportSettings,
    build_report,
    calibration_text,
    draw_figures,
    slm_only_warning,
    variant_rows,
)
from edgespec.report import HEADLINE_COLUMNS

VOCAB = 64
CHANNEL = "rayleigh_snr10"
HLM_TPS = np.array([1.0, 2.0, 4.0])
ONLINE_TPS = np.array([2.0, 5.0, 8.0])  # per-seed gains 2, 2.5, 2


def _metrics() -> pd.DataFrame:
    rows = []
    for variant, tps in (("hlm", HLM_TPS), ("cuhlm_online", ONLINE_TPS)):
        for seed, t in enumerate(tps):
            rows.append(
                {
                    "variant": variant,
                    "channel": CHANNEL,
                    "fading": "rayleigh",
                    "snr_db": 10.0,
                    "profile": "primary",
                    "seed": seed,
                    "throughput_tps": t,
                    "mean_token_latency_s": 1 / t,
                    "end_to_end_latency_s": 10 / t,
                }
            )
    return pd.DataFrame(rows)


def _tokens(skipped) -> pd.DataFrame:
    """Two prompts of two tokens; ``skipped`` marks the tokens kept without upload."""
    skipped = np.asarray(skipped, bool)
    return pd.DataFrame(
        {
            "prompt_id": ["a", "a", "b", "b"],
            "position": [0, 1, 0, 1],
            "uploaded": ~skipped,
            "skipped": skipped,
            "k": np.where(skipped, 0, 8),
            "accepted": [True, True, False, True],
            "accept_prob": np.where(skipped, 0.9, np.nan),
            "measured_tvd": [0.1, 0.1, 0.1, 0.1],
            "output_tvd": [0.0, 0.0, 0.0, 0.0],
        }
    )


def _fit(slm_only=()) -> dict:
    return {
        "a": 0.5,
        "b": -0.1,
        "r2": 0.4,
        "pearson_r": 0.63,
        "n": 40,
        "u_th": 0.25,
        "threshold_rule": "risk_prone",
        "slm_only_variants": list(slm_only),
    }


def _inputs(fit=None) -> ReportInputs:
    joint = pd.DataFrame(
        [{c: 0 for c in JOINT_COLUMNS} | {"channel": CHANNEL, "fading": "rayleigh", "k_star": 5}]
    )
    return ReportInputs(
        fit=fit or _fit(),
        kstar={
            "vocab_size": VOCAB,
            "k_star": 7,
            "k_search": f"every integer k in [1, {VOCAB}]",
            "theta_tv": 0.1,
            "joint": {"risk_budget": 0.1, "k_star": 5, "u_th": -1.0},
            "replay": {"mean_abs_x_d_diff": 1e-7},
        },
        profile={
            "source": "given",
            "draft_token_s": 0.01,
            "target_token_s": 0.02,
            "uncertainty_s": 0.001,
        },
        provenance={"preset": "tiny_random", "description": "a constructed pair"},
        precision={"dtype": "float32", "reason": "configured (models.dtype)"},
        quantization=None,
        metrics=_metrics(),
        tokens={"hlm": _tokens([0, 0, 0, 0]), "cuhlm_online": _tokens([1, 0, 0, 0])},
        scores=pd.DataFrame(
            {
                "variant": ["hlm", "hlm", "cuhlm_online", "cuhlm_online"],
                "prompt_id": ["a", "b", "a", "b"],
                "semantic_accuracy": [0.5, 0.5, 0.5, 0.5],
            }
        ),
        thresholds=pd.DataFrame({"rule": ["risk_prone"], "u_th": [0.25]}),
        k_table=pd.DataFrame({"k": [1, VOCAB], "chosen": [False, True]}),
        joint=joint,
    )


SETTINGS = ReportSettings(
    variants=("hlm", "cuhlm_online"),
    seed_interval=0.9,
    bootstrap_interval=0.95,
    bootstrap_samples=200,
    paper_hardware={"enabled": False},
    uncertainty_samples=8,
    prob_bits=8,
    kstar_channel=CHANNEL,
    seed=3,
)


def test_interval_cell_reads_point_and_interval():
    row = pd.Series({"g": 2.0, "g_lo": 1.5, "g_hi": 3.25, "p": 0.25, "n": math.nan})
    assert interval_cell(row, "g", unit="x") == "2x [1.5, 3.25]"
    assert interval_cell(row, "p", 100, "%") == "25%"  # no interval columns: the point alone
    assert interval_cell(row, "n") == "n/a"
    row["g_lo"] = math.nan
    assert interval_cell(row, "g", unit="x") == "2x"


def test_report_tables_and_the_paper_comparison_by_hand():
    report = build_report(_inputs(), SETTINGS)
    summary = report.summary
    # one row per (variant, channel, profile), in the configured variant order
    assert summary["variant"].tolist() == ["hlm", "cuhlm_online"]
    online = summary.set_index("variant").loc["cuhlm_online"]
    # gains per seed 2, 2.5, 2: median 2, 90% interval [2, 2 + 0.9 * 0.5]
    assert online["throughput_gain"] == pytest.approx(2.0)
    assert online["throughput_gain_hi"] == pytest.approx(2.45)
    assert online["skip_rate"] == pytest.approx(0.25)
    assert report.profiles == {"primary": "given compute (latency.given)"}
    assert list(report.headline.columns) == list(HEADLINE_COLUMNS)
    gain = report.headline[
        report.headline["metric"] == "CU-HLM: token throughput vs standard HLM"
    ].iloc[0]
    assert (gain["paper"], gain["ours"], gain["ours_hi"]) == (206, 2.0, pytest.approx(2.45))
    page = report.markdown
    assert page.endswith("\n") and page.startswith("# CU-HLM family: measured results\n\n")
    assert (
        "| CU-HLM | token throughput vs standard HLM | 206x | 10 dB Rayleigh, online | "
        "2x [2, 2.45] |  |  |  | cuhlm_online | rayleigh_snr10 |"
    ) in page
    # a condition outside the sweep reads n/a, not the nearest one
    assert "| -20 dB, offline | n/a |  |  |  | cuhlm_offline | rayleigh_snr-20 |" in page
    assert "not evaluated (latency.paper_hardware.enabled: false)" in page
    assert "so a full upload is 0.00x the papers'" in page  # 64 / 32000
    assert "Offline k* = 7 of |V| = 64" in page and "k* = 5, u_th = -1." in page
    assert "Warning" not in page


def test_variant_rows_put_each_profile_side_by_side():
    report = build_report(_inputs(), SETTINGS)
    both = pd.concat([report.summary, report.summary.assign(profile="paper_hw")])
    rows = variant_rows(both, {"primary": "here", "paper_hw": "paper"})
    assert list(rows.columns[:6]) == [
        "variant",
        "channel",
        "gain over HLM (here)",
        "tokens/s (here)",
        "gain over HLM (paper)",
        "tokens/s (paper)",
    ]
    online = rows.set_index("variant").loc["cuhlm_online"]
    assert online["gain over HLM (paper)"] == "2x [2, 2.45]"
    assert online["skip rate"].startswith("25% [")
    assert rows["variant"].tolist() == ["hlm", "cuhlm_online"]
    empty = variant_rows(both.iloc[:0], {"primary": "here"})
    assert empty["note"].tolist() == ["none of these variants was evaluated (cuhlm.variants)"]


def test_the_slm_only_warning_follows_the_fit_record():
    assert slm_only_warning(_fit()) == ""
    assert "Warning" not in calibration_text(_fit())
    fit = _fit(["cuhlm_offline", "uhlm_risk_prone"])
    text = calibration_text(fit)
    assert text.startswith("Calibration: beta = 0.5000 u -0.1000 (R2 0.400, r 0.630, 40 tokens)")
    assert text.endswith(
        " **Warning**: a threshold >= 1 was clamped to 1; cuhlm_offline, uhlm_risk_prone skip "
        "every token and have become SLM-only."
    )
    assert "have become SLM-only" in build_report(_inputs(fit), SETTINGS).markdown


def test_figures_are_written_where_asked(tmp_path):
    inputs = _inputs()
    report = build_report(inputs, SETTINGS)
    paths = {name: tmp_path / f"{name}.png" for name in FIGURES}
    draw_figures(report, inputs, SETTINGS, np.linspace(0, 1, 11), paths)
    assert all(p.stat().st_size > 0 for p in paths.values())


def test_joint_moves_and_the_joint_text():
    from edgespec.cuhlm.report import joint_moves, joint_text

    sensitivity = pd.DataFrame(
        {
            "fading": "rayleigh",
            "risk_budget": [0.1, 0.1, 0.1, 0.1],
            "bandwidth_factor": [1.0, 1.0, 1e-3, 1e-3],
            "bandwidth_hz": [1e7, 1e7, 1e4, 1e4],
            "snr_db": [-20.0, 20.0, -20.0, 20.0],
            "k_star": [119, 119, 119, 30],
            "u_th": [0.55, 0.55, 0.55, 0.7],
            "upload_s": [1e-3, 1e-4, 1.0, 0.02],
            "status": "optimal",
        }
    )
    moves = joint_moves(sensitivity).set_index("bandwidth_factor")
    assert not moves.loc[1.0, "moves"] and moves.loc[1.0, "choices"] == 1
    assert moves.loc[1e-3, "moves"] and moves.loc[1e-3, "k_star"] == "30-119"
    assert moves.loc[1e-3, "max_upload_ms"] == pytest.approx(1000.0)
    joint = pd.DataFrame(
        {
            "snr_db": [-20.0, 20.0],
            "ergodic_rate_bps": [1e5, 6e7],
            "k_star": [119, 119],
            "u_th": [0.55, 0.55],
            "skip_risk": [0.0998, 0.0998],
        }
    )
    text = joint_text(joint, {"target_token_s": 0.1}, 0.1, prob_bits=8, vocab_size=151936)
    # B(119) = 119 (8 + 18) = 3094 bits = 387 B, 30.9 ms at 0.1 Mbit/s
    assert "(u_th, k*) = (0.55, 119) at every channel (-20 to 20 dB)" in text
    assert "skip risk 0.0998 is at the risk budget 0.1" in text
    assert "(387 B) takes 30.9 ms even at the slowest ergodic rate (0.1 Mbit/s)" in text
    assert "tau_LLM = 100 ms" in text
    moved = joint.assign(k_star=[119, 64])
    assert "moves with the channel" in joint_text(moved, {"target_token_s": 0.1}, 0.1, 8, 151936)
