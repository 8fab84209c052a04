"""Testbed against simulator: measured against modelled, per answer and per method and channel
(rule report_testbed; methods §11). Torch-free.

Measured terms of one answer's decode [s] (after the prompt's prefill, which both sides read
from the run's store): ``device_s`` the draft's forwards, sampling and decisions (the
uncertainty estimate where the method's device needs it; HLM's device computes u only so its
draws match the single-process decode, which records it, so that time is taken out of HLM's
latency), ``edge_s`` the target's forwards and verification (head included), ``serialise_s``
encoding, decoding and socket writes on both sides, ``uplink_s`` the link's transmission time
(frame bytes / the block's rate), ``retransmit_s`` its ARQ time, ``rtt_s`` its propagation
(RTT / 2 per frame), and ``other_s`` = latency - the rest (loopback copies, scheduling, the
link's sleep overshoot). Modelled terms: ``edgespec.testbed.predict``.

Per method and channel: the latency ratio measured / modelled (mean over prompts with a 95%
bootstrap interval), the term that differs most, bytes per upload or round (measured on the
link, the model's B, the stated overhead, and whether the link counted exactly the model's
bytes plus that overhead), and whether the committed tokens equal the single-process decode's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from edgespec.cuhlm.evaluate import uses_uncertainty
from edgespec.intervals import bootstrap_interval, format_interval
from edgespec.report import markdown_table
from edgespec.seeding import numpy_rng
from edgespec.testbed.answer import TOKENWISE_METHODS, wire_spec
from edgespec.testbed.predict import (
    expected_wire_rounds,
    expected_wire_tokens,
    predict_rounds,
    predict_tokens,
)
from edgespec.testbed.wire import TIMED_KINDS
from edgespec.wireless.channel import ChannelCondition
from edgespec.wisv.evaluate import head_round_s

TERMS = ("device_s", "edge_s", "serialise_s", "uplink_s", "retransmit_s", "rtt_s", "other_s")
TERM_NAMES = {
    "device_s": "device compute",
    "edge_s": "edge compute",
    "serialise_s": "serialisation",
    "uplink_s": "uplink",
    "retransmit_s": "retransmissions",
    "rtt_s": "RTT",
    "other_s": "other",
}
CLOCKS = (
    "device_compute_s",
    "device_uncertainty_s",
    "device_serialise_s",
    "edge_compute_s",
    "edge_serialise_s",
)
"""The sides' clocks [s] the measured terms read (``edgespec.testbed.endpoint.Stopwatch``)."""
NEAR_ONE = (0.8, 1.25)
"""A latency ratio whose interval lies within these bounds counts as near 1."""


def measured_terms(answers: pd.DataFrame, frames: pd.DataFrame) -> pd.DataFrame:
    """``answers`` with the measured latency ``e2e_s`` and its terms (module docstring)."""
    timed = frames[frames["kind"].isin([k.name for k in TIMED_KINDS])]
    link = timed.groupby(["method", "channel", "prompt_id"])[["tx_s", "retx_s", "prop_s"]].sum()
    out = answers.join(link, on=["method", "channel", "prompt_id"])
    # A clock a side never started (an edge that verified nothing) or an answer without timed
    # frames counts zero seconds.
    for column in (*CLOCKS, "tx_s", "retx_s", "prop_s"):
        out[column] = out[column].fillna(0.0) if column in out else 0.0
    unc = out["device_uncertainty_s"]
    counted = out["method"].map(lambda m: m in TOKENWISE_METHODS and uses_uncertainty(m))
    out["e2e_s"] = out["e2e_s"] - np.where(counted, 0.0, unc)
    out["device_s"] = out["device_compute_s"] + np.where(counted, unc, 0.0)
    out["edge_s"] = out["edge_compute_s"]
    out["serialise_s"] = out["device_serialise_s"] + out["edge_serialise_s"]
    out["uplink_s"], out["retransmit_s"], out["rtt_s"] = out["tx_s"], out["retx_s"], out["prop_s"]
    named = list(TERMS[:-1])
    out["other_s"] = out["e2e_s"] - out[named].sum(axis=1)
    return out


def link_bytes(frames: pd.DataFrame) -> pd.DataFrame:
    """Bytes the link carried in the timed decode, per answer and direction."""
    timed = frames[frames["kind"].isin([k.name for k in TIMED_KINDS])]
    table = timed.pivot_table(
        index=["method", "channel", "prompt_id"],
        columns="direction",
        values="bytes",
        aggfunc="sum",
        fill_value=0,
    )
    return (
        table.reindex(columns=["up", "down"], fill_value=0).add_prefix("link_").add_suffix("_bytes")
    )


def compare_answers(
    answers: pd.DataFrame,
    frames: pd.DataFrame,
    tokens: pd.DataFrame,
    rounds: pd.DataFrame,
    reference: pd.DataFrame,
    channels: Mapping[str, Mapping[str, Any]],
    profile,
    head_times: Mapping[str, Any] | None,
    sizes: Mapping[str, int],
    settings: Mapping[str, Any],
    seed: int,
) -> pd.DataFrame:
    """One row per answer: measured terms, the model's (``model_*``), the ratio, the bytes
    (link, model, expected with the overhead) and whether the tokens equal the reference's."""
    measured = measured_terms(answers, frames).join(
        link_bytes(frames), on=["method", "channel", "prompt_id"]
    )
    # An answer with no timed frame (every CU-HLM token skipped) put no bytes on the link.
    measured[["link_up_bytes", "link_down_bytes"]] = measured[
        ["link_up_bytes", "link_down_bytes"]
    ].fillna(0)
    parts = []
    for (method, channel), group in measured.groupby(["method", "channel"], sort=False):
        condition = ChannelCondition.from_dict({**channels[channel], "name": channel})
        spec = wire_spec(method, settings, sizes)
        index = int(settings["fading_seed"])
        if method in TOKENWISE_METHODS:
            table = _select(tokens, method, channel)
            model = predict_tokens(
                table, method, condition, profile, spec.vocab_size, spec.prob_bits, seed, index
            )
            wire = expected_wire_tokens(table, spec)
        else:
            table = _select(rounds, method, channel)
            params = {
                "vocab_size": spec.vocab_size,
                "hidden_size": spec.hidden_size,
                "bits_per_value": spec.hidden_bits,
            }
            head_s = head_round_s(method, head_times)
            model = predict_rounds(
                table, method, condition, profile, params, spec.gamma, head_s, seed, index
            )
            wire = expected_wire_rounds(table, method, params)
        merged = group.merge(model, on="prompt_id").merge(wire, on="prompt_id")
        parts.append(merged)
    out = pd.concat(parts, ignore_index=True)
    for term in ("serialise_s", "retransmit_s", "other_s"):
        out[f"model_{term}"] = 0.0  # terms the model does not have
    out["ratio"] = out["e2e_s"] / out["model_e2e_s"]
    out["bytes_equal"] = (out["link_up_bytes"] == out["wire_up_bytes"]) & (
        out["link_down_bytes"] == out["wire_down_bytes"]
    )
    out["tokens_equal"] = [_same_tokens(row, reference) for row in out.itertuples()]
    return out


def _select(table: pd.DataFrame, method: str, channel: str) -> pd.DataFrame:
    rows = table[(table["method"] == method) & (table["channel"] == channel)]
    return rows.reset_index(drop=True)


def _same_tokens(row, reference: pd.DataFrame) -> bool:
    """The answer's tokens are the reference's (or their prefix, where it stopped early)."""
    ref = reference[(reference["method"] == row.method) & (reference["prompt_id"] == row.prompt_id)]
    ref = ref[ref["channel"].isin([row.channel, "any"])]
    if len(ref) != 1:
        raise ValueError(f"{row.method}/{row.channel}/{row.prompt_id}: {len(ref)} references")
    expected = list(ref["tokens"].iloc[0])
    got = list(row.tokens)
    return got == expected[: len(got)] and (row.stopped != "answer" or got == expected)


def summarise(per_answer: pd.DataFrame, seed: int) -> pd.DataFrame:
    """One row per (method, channel): see the module docstring."""
    rows = []
    for (method, channel), group in per_answer.groupby(["method", "channel"], sort=False):
        rng = numpy_rng(seed, "testbed", "bootstrap", method, channel)
        ratio = bootstrap_interval(group["ratio"].to_numpy(), rng)
        diff = {t: float(group[t].sum() - group[f"model_{t}"].sum()) for t in TERMS}
        worst = max(diff, key=lambda t: abs(diff[t]))
        units = float(group["units"].sum()) or np.nan
        tokens = float(group["num_tokens"].sum()) or np.nan
        near = NEAR_ONE[0] <= ratio.low and ratio.high <= NEAR_ONE[1]
        rows.append(
            {
                "method": method,
                "channel": channel,
                "prompts": len(group),
                "tokens": int(group["num_tokens"].sum()),
                "units": int(group["units"].sum()),
                "stopped_early": int((group["stopped"] != "answer").sum()),
                "measured_e2e_s": float(group["e2e_s"].mean()),
                "model_e2e_s": float(group["model_e2e_s"].mean()),
                **ratio.as_dict("ratio"),
                "near_one": near,
                "main_term": TERM_NAMES[worst],
                "main_term_diff_s": diff[worst] / len(group),
                **{f"measured_{t}": float(group[t].mean()) for t in TERMS},
                **{
                    f"model_{t}": float(group.get(f"model_{t}", 0.0 * group["e2e_s"]).mean())
                    for t in TERMS
                },  # fmt: skip
                "uplink_bytes_per_unit": float(group["link_up_bytes"].sum()) / units,
                "model_uplink_bytes_per_unit": float(group["model_up_bits"].sum()) / 8 / units,
                "overhead_bytes_per_unit": float(
                    group["wire_up_bytes"].sum() - group["model_up_bits"].sum() / 8
                )
                / units,
                "uplink_bytes_per_token": float(group["link_up_bytes"].sum()) / tokens,
                "downlink_bytes_per_unit": float(group["link_down_bytes"].sum()) / units,
                "model_downlink_bytes_per_unit": float(group["model_down_bits"].sum()) / 8 / units,
                "bytes_equal": bool(group["bytes_equal"].all()),
                "tokens_equal": bool(group["tokens_equal"].all()),
            }
        )
    return pd.DataFrame(rows)


def reason(row: Mapping[str, Any]) -> str:
    """Why a ratio is not near 1: the term that differs most, measured against modelled."""
    if row["near_one"]:
        return "near 1"
    term = next(t for t, name in TERM_NAMES.items() if name == row["main_term"])
    return (
        f"{row['main_term']}: {row[f'measured_{term}']:.3g} s measured against "
        f"{row[f'model_{term}']:.3g} s modelled per answer"
    )


def context(models: Mapping[str, Any], settings: Mapping[str, Any], profile: Mapping) -> str:
    """What ran where, for the report: the pair, the sizes, the wire and the link, and where
    the simulator's compute times come from."""
    machine = profile.get("machine") or {}
    threads = machine.get("torch_threads")
    timed = f", timed at {threads} threads" if threads else ""
    losses = settings.get("packet_error_rate") or {}
    per = ", ".join(f"{c} {p:g}" for c, p in losses.items()) or "none"
    return (
        f"Pair: preset {models.get('preset')} ({models.get('dtype')} requested). Per method and "
        f"channel up to {settings['prompts']} evaluation prompts and "
        f"{settings['max_new_tokens']} new tokens each (an answer stops early once its "
        "modelled uplink time exceeds "
        f"{settings['max_uplink_s']:g} s), WISV rounds of {settings['gamma']} draft tokens, "
        f"fading seed {settings['fading_seed']}. Device and edge: one process and one CPU core "
        f"each; link: the user-space emulator on loopback (uplink rate per fading block, RTT / 2 "
        f"each way, no downlink rate; packet error rate: {per}); wire: "
        f"{settings['prob_bits']}-bit probabilities, {settings['hidden_bits']}-bit hidden "
        f"values, a 16-byte header per frame. The simulator's compute times: the run's latency "
        f"profile ({profile.get('source', 'n/a')}{timed}). Latencies are of the decode after the "
        "prompt's prefill, on a machine other jobs may share."
    )


def markdown(summary: pd.DataFrame, context: str) -> str:
    """The report's "testbed against simulator" section: ``context`` (what ran where), the
    table, and the terms of each method and channel, measured against modelled."""
    table = pd.DataFrame(
        {
            "method": summary["method"],
            "channel": summary["channel"],
            "prompts": summary["prompts"],
            "tokens": summary["tokens"],
            "uplink B/unit (link)": summary["uplink_bytes_per_unit"],
            "uplink B/unit (model B)": summary["model_uplink_bytes_per_unit"],
            "overhead B/unit": summary["overhead_bytes_per_unit"],
            "bytes = model + overhead": summary["bytes_equal"].map({True: "yes", False: "NO"}),
            "measured s": summary["measured_e2e_s"],
            "modelled s": summary["model_e2e_s"],
            "ratio [95%]": [
                format_interval(r.ratio, r.ratio_lo, r.ratio_hi, ".3g")
                for r in summary.itertuples()
            ],
            "tokens = single process": summary["tokens_equal"].map({True: "yes", False: "NO"}),
            "where they differ": [reason(r) for r in summary.to_dict("records")],
        }
    )
    terms = pd.DataFrame(
        [
            {
                "method": row["method"],
                "channel": row["channel"],
                **{
                    TERM_NAMES[t]: f"{row[f'measured_{t}']:.3g} / {row[f'model_{t}']:.3g}"
                    for t in TERMS
                },
            }
            for row in summary.to_dict("records")
        ]
    )
    return (
        "\n\n".join(
            [
                "# Testbed against simulator",
                context,
                markdown_table(table, ".4g"),
                "Terms per answer, measured / modelled [s] (the model has no serialisation, "
                "retransmissions or other):",
                markdown_table(terms),
            ]
        )
        + "\n"
    )
