"""The WISV report's figures' data (rule report_wisv; drawn by ``edgespec.plots``); torch-free.

:func:`latency_curves` prices each regime's CSI decode over a sweep of SNRs for the
FH-against-SH figure, :func:`policy_curves` gives the safe fraction and the head's accept rate
against the repair cost per regime, :func:`tau_curves` the heads' threshold tables and
:func:`learning_curves` their held-out AUC against training size.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from edgespec.wireless.arq import ArqSettings
from edgespec.wireless.channel import ChannelCondition, block_packet_error_rate, uplink_rate_bps
from edgespec.wisv.evaluate import head_round_s, round_latencies
from edgespec.wisv.regimes import Pricing

SNR_SWEEP_DB = np.arange(-20, 41, 2.5)
"""Average SNRs [dB] the FH-against-SH figure prices the WISV rounds at."""

HEAD_LABELS = {
    "wisv_head": "CSI head",
    "relabel_no_csi_head": "no-CSI head (relabeled)",
    "no_csi_head": "no-CSI head (original)",
}


def latency_curves(
    rounds: Mapping[str, pd.DataFrame],
    channels: Mapping[str, Mapping[str, Any]],
    pricing: Mapping[str, Pricing],
    snrs: np.ndarray = SNR_SWEEP_DB,
    arq: ArqSettings | None = None,
) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], str]:
    """FH against SH over channel quality: each regime's WISV ``rounds`` (one CSI decode, its
    gains; none where no WISV variant is configured) priced under its ``pricing`` and each
    channel's bandwidth, RTT and packet-error fit at every average SNR of ``snrs`` [dB], as
    the mean latency per answer [s] of each protocol, charged as the main evaluation charges
    them (every draft forward, the head's time per round, retransmissions under ``arq``, each
    prompt's prefill). FH wins at long RTT or fast uplinks, SH at short RTT and slow uplinks.
    Returns the curves by label and a note on what they price."""
    if not rounds:
        return {}, "no WISV variant configured"
    curves = {}
    gammas = set()
    for regime, table in rounds.items():
        p = pricing[regime]
        gamma = int(table["num_drafted"].iloc[0])
        gammas.add(gamma)
        prompts = table.groupby("prompt_id", sort=False)["prompt_tokens"].first().to_numpy()
        prefill = float(np.sum(p.profile.prefill_s(prompts)))
        for spec in channels.values():
            base = ChannelCondition.from_dict(spec)
            fields = {
                k: v for k, v in base.to_dict().items() if k not in ("tx_power_dbm", "distance_m")
            }
            for variant in ("wisv_fh", "wisv_sh"):
                head_s = head_round_s(variant, p.head_times)
                lat = []
                for snr in snrs:
                    cond = ChannelCondition.from_dict({**fields, "snr_db": float(snr)})
                    priced = table.assign(
                        rate_bps=np.asarray(uplink_rate_bps(cond, table["gain"])),
                        per=np.asarray(block_packet_error_rate(cond, table["gain"])),
                    )
                    per_round = round_latencies(
                        priced, variant, p.protocol, p.profile, cond.rtt_s, gamma, head_s, arq=arq
                    )
                    lat.append((per_round.sum() + prefill) / len(prompts))
                label = (
                    f"{regime}: {variant[5:].upper()}, W {base.bandwidth_hz / 1e6:g} MHz, "
                    f"RTT {base.rtt_s * 1e3:g} ms"
                )
                curves[label] = (snrs, np.asarray(lat))
    gamma_text = ", ".join(str(g) for g in sorted(gammas))
    return curves, f"WISV rounds at gamma={gamma_text} priced at each SNR (one fading seed)"


def policy_curves(
    safe: Mapping[str, pd.DataFrame], heads: Mapping[str, Mapping[str, Any]]
) -> dict[str, dict[str, Any]]:
    """Per regime, (repair cost, safe fraction) of the relabeling's CSI samples and (repair
    cost, accept rate) of the CSI head on the held-out mismatches (None where absent), for
    ``plots.policy_vs_channel``."""
    out = {}
    for regime, frame in safe.items():
        accept = heads.get(regime, {}).get("accept_by_state")
        out[regime] = {
            "safe": (frame["repair_cost"].to_numpy(), frame["safe_fraction"].to_numpy()),
            "accept": (
                (np.asarray(accept["repair_cost"]), np.asarray(accept["accept_rate"]))
                if accept
                else None
            ),
        }
    return out


def tau_curves(
    heads: Mapping[str, Mapping[str, Any]],
) -> tuple[dict[str, pd.DataFrame], dict[str, float]]:
    """Each regime's heads' tau tables and chosen taus (rule train_head's metrics), labelled
    ``<regime>: <head>``, for ``plots.accuracy_vs_tau``."""
    tables, chosen = {}, {}
    for regime, head in heads.items():
        for key, name in HEAD_LABELS.items():
            label = f"{regime}: {name}"
            tables[label] = pd.DataFrame(head[f"tau_table_{key}"])
            chosen[label] = head[key]["tau"]
    return tables, chosen


def learning_curves(heads: Mapping[str, Mapping[str, Any]]) -> dict[str, pd.DataFrame]:
    """Each regime's learning curves (train_head's ``learning_curve``), labelled
    ``<regime>: <head>``, for ``plots.learning_curve``."""
    return {
        f"{regime}: {HEAD_LABELS[key]}": pd.DataFrame(table)
        for regime, head in heads.items()
        for key, table in head.get("learning_curve", {}).items()
    }
