"""CU-HLM variant evaluation: token records, losslessness, channel delays, metrics, scores."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import chisquare

from edgespec import scoring
from edgespec.cuhlm.calibration import LinearFit
from edgespec.cuhlm.decode import TOKEN_COLUMNS, decode_variant
from edgespec.cuhlm.evaluate import (
    apply_channel,
    device_seconds,
    fading_base_seed,
    price_variant,
    relative_to,
    token_gains,
    uses_uncertainty,
    variant_metrics,
)
from edgespec.cuhlm.policies import FixedK, FullUpload, ThresholdPolicy, build_policy
from edgespec.cuhlm.scores import text_scores
from edgespec.data.records import PromptRecord
from edgespec.decoding.config import DecodingConfig
from edgespec.wireless.channel import ChannelCondition
from edgespec.wireless.delay import LatencyProfile

VOCAB = 61
FIT = LinearFit(a=0.8, b=-0.06, r2=0.5, pearson_r=0.7, n=100)
PARAMS = {
    "u_th_risk_averse": 0.1,
    "u_th_risk_prone": 0.4,
    "u_th": 0.3,
    "fit": FIT,
    "theta_tv": 0.2,
    "k_star": 8,
    "u_th_joint": 0.2,
    "k_joint": 5,
    "fixed_k": 4,
    "random_skip_rate": 0.3,
    "uncertainty_samples": 8,
    "theta_max": 0.3,
}
PROFILE = LatencyProfile(draft_token_s=0.01, target_token_s=0.1, uncertainty_s=0.002)


class Exploding(torch.nn.Module):
    def forward(self, *args, **kwargs):
        raise AssertionError("model called")


def _prompts(seed: int, lengths=(5, 9, 3, 7)) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lengths]


def _decode(variant, draft, target, policy, prompts=None, max_new=10, batch_size=3, seed=1):
    prompts = prompts or _prompts(0)
    ids = [f"p{i}" for i in range(len(prompts))]
    cfg = DecodingConfig(max_new_tokens=max_new, temperature=1.0, batch_size=batch_size)
    gen = torch.Generator().manual_seed(seed)
    return decode_variant(variant, draft, target, prompts, ids, cfg, policy, gen)


@pytest.mark.parametrize(
    "variant", ["random_skip", "cuhlm_offline", "cuhlm_online", "cuhlm_exact", "cuhlm_joint"]
)
def test_token_records_are_consistent(tiny_target, tiny_draft_close, variant):
    policy = build_policy(variant, PARAMS)
    table, completions = _decode(variant, tiny_draft_close, tiny_target, policy)
    assert tuple(table.columns) == TOKEN_COLUMNS
    assert len(table) == sum(len(c) for c in completions)
    for i, completion in enumerate(completions):
        rows = table[table.prompt_id == f"p{i}"].sort_values("position")
        assert rows.position.tolist() == list(range(len(completion)))
        assert rows.committed_token.tolist() == completion
    skipped, uploaded = table.skipped.to_numpy(), table.uploaded.to_numpy()
    assert (skipped != uploaded).all()
    assert (table.k[skipped] == 0).all() and (table.k[uploaded] >= 1).all()
    assert (table.committed_token[skipped] == table.draft_token[skipped]).all()
    assert table.accepted[skipped].all()
    accepted_up = table[uploaded & table.accepted.to_numpy()]
    assert (accepted_up.committed_token == accepted_up.draft_token).all()
    np.testing.assert_allclose(
        table.accept_prob, np.minimum(1.0, table.y_d / table.x_d), rtol=1e-12
    )
    np.testing.assert_allclose(table.beta, 1.0 - table.accept_prob, atol=1e-15)
    for column in ("measured_tvd", "output_tvd"):
        assert (table[column][skipped | (table.k == VOCAB).to_numpy()] == 0).all()
        assert ((table[column] >= 0) & (table[column] <= 1)).all()
    u_th = PARAMS["u_th_joint"] if variant == "cuhlm_joint" else PARAMS["u_th"]
    if variant == "random_skip":
        assert table.u.isna().all() and skipped.any() and uploaded.any()
    else:
        assert table.u.notna().all()
        assert (table.u[skipped] <= u_th).all()
        assert (table.u[uploaded] > u_th).all()
    compressed = table[uploaded]
    if variant in ("cuhlm_offline", "cuhlm_exact"):
        assert (compressed.k == PARAMS["k_star"]).all()
    if variant == "cuhlm_joint":
        assert (compressed.k == PARAMS["k_joint"]).all()
    if variant in ("cuhlm_offline", "cuhlm_joint"):
        assert (compressed.measured_tvd > 0).any() and (compressed.output_tvd > 0).any()
    if variant == "cuhlm_exact":
        # Verified against the law d was drawn from: no residual or output distortion.
        assert len(compressed) and compressed.output_tvd.max() < 1e-12
        assert compressed.measured_tvd.max() < 1e-12


def test_slm_only_never_calls_target(tiny_draft_close):
    table, completions = _decode("slm_only", tiny_draft_close, Exploding(), None)
    assert all(len(c) == 10 for c in completions)
    assert table.skipped.all() and not table.uploaded.any() and (table.k == 0).all()
    assert table.y_d.isna().all() and table.beta.isna().all() and table.u.isna().all()
    assert (table.x_d > 0).all()


def test_llm_only_never_calls_draft(tiny_target):
    table, completions = _decode("llm_only", Exploding(), tiny_target, None)
    assert all(len(c) == 10 for c in completions)
    assert not table.skipped.any() and not table.uploaded.any()
    assert table.x_d.isna().all() and (table.draft_token == -1).all()


def _assert_target_law(tokens, target, prompt, n):
    with torch.no_grad():
        law = torch.softmax(target(torch.tensor([prompt])).logits[0, -1], -1)
    observed = torch.bincount(torch.tensor(tokens), minlength=VOCAB).double()
    keep = law * n >= 5  # chi-square needs expected counts >= 5; pool the rest
    exp, obs = law[keep] * n, observed[keep]
    if (law[~keep] * n).sum() >= 5:
        exp = torch.cat([exp, (law[~keep] * n).sum(0, keepdim=True)])
        obs = torch.cat([obs, observed[~keep].sum(0, keepdim=True)])
    assert chisquare(obs.numpy(), exp.numpy() * obs.sum().item() / exp.sum().item()).pvalue > 1e-3
    assert 0.5 * (observed / n - law).abs().sum() < 0.07


@pytest.mark.parametrize("variant", ["hlm", "llm_only"])
def test_hlm_and_llm_only_are_target_distributed(tiny_target, tiny_draft_independent, variant):
    prompt, n = [3, 17, 29], 2000
    policy = build_policy(variant, PARAMS)
    table, completions = _decode(
        variant, tiny_draft_independent, tiny_target, policy, [prompt] * n, 1, n, seed=11
    )
    if variant == "hlm":
        assert not table.accepted.all()  # the independent draft is rejected often
    _assert_target_law([c[0] for c in completions], tiny_target, prompt, n)


def test_threshold_zero_never_skips_uncertain_tokens(tiny_target, tiny_draft_close):
    # A small theta_max makes the perturbed samples near-argmax, so u = 0 happens (when the
    # sampled token is the argmax) as well as u > 0.
    policy = ThresholdPolicy(0.0, FullUpload(), uncertainty_samples=8, theta_max=0.05)
    table, _ = _decode("uhlm_risk_averse", tiny_draft_close, tiny_target, policy, max_new=12)
    assert (table.u > 0).any() and (table.u == 0).any()
    assert not table.skipped[table.u > 0].any()
    assert table.skipped[table.u == 0].all()


def test_full_k_cuhlm_equals_hlm_token_for_token(tiny_target, tiny_draft_close):
    """Same seed, same uncertainty draws (M, theta_max): k = |V| without skip is HLM."""
    params = {"uncertainty_samples": 8, "theta_max": 1.0}
    hlm_table, hlm = _decode("hlm", tiny_draft_close, tiny_target, build_policy("hlm", params))
    policy = ThresholdPolicy(None, FixedK(VOCAB), uncertainty_samples=8, theta_max=1.0)
    cu_table, cu = _decode("cuhlm_offline", tiny_draft_close, tiny_target, policy)
    assert cu == hlm
    pd.testing.assert_frame_equal(cu_table, hlm_table)
    assert (cu_table.measured_tvd == 0).all() and (cu_table.k == VOCAB).all()


def _table(rows) -> pd.DataFrame:
    base = {c: np.nan for c in TOKEN_COLUMNS}
    base.update(k=0, uploaded=False, skipped=False, accepted=True, measured_tvd=0.0, output_tvd=0.0)
    return pd.DataFrame([{**base, **r} for r in rows])


def test_apply_channel_hand_computed_awgn():
    # Rows deliberately out of order: delays come back in the table's order.
    table = _table(
        [
            {"prompt_id": "p", "position": 2, "uploaded": True, "k": VOCAB},
            {"prompt_id": "p", "position": 0, "uploaded": True, "k": 5},
            {"prompt_id": "p", "position": 1, "skipped": True},
        ]
    )
    cond = ChannelCondition(name="c", fading="awgn", bandwidth_hz=1e6, snr_db=10.0, rtt_s=0.02)
    rate = 1e6 * math.log2(1 + 10.0)
    per_entry = 8 + 6  # b_p + ceil(log2 61)
    device = 0.01 + 0.002
    edge = 0.1 + 0.02
    expected = [
        device + (VOCAB * per_entry + 6) / rate + edge,  # carries the skipped token's id
        device + 5 * per_entry / rate + edge,
        device,
    ]
    gains = token_gains(table, cond, base_seed=0)
    assert (gains == 1).all()
    got = apply_channel(
        table, "cuhlm_online", cond, PROFILE, VOCAB, 8, gains, True, resync_bits_per_skipped=6
    )
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    no_unc = apply_channel(table, "hlm", cond, PROFILE, VOCAB, 8, gains, False)
    np.testing.assert_allclose(no_unc, np.array(expected) - 0.002 - [6 / rate, 0, 0], rtol=1e-12)
    assert not uses_uncertainty("hlm") and uses_uncertainty("cuhlm_online")

    # Two prompts, rows interleaved: an upload carries only its own prompt's skipped ids
    # (q's trailing skip is never sent; p's upload carries p's one skip, not q's).
    two = _table(
        [
            {"prompt_id": "q", "position": 0, "uploaded": True, "k": 5},
            {"prompt_id": "p", "position": 0, "skipped": True},
            {"prompt_id": "q", "position": 1, "skipped": True},
            {"prompt_id": "p", "position": 1, "uploaded": True, "k": 5},
        ]
    )
    got = apply_channel(
        two, "cuhlm_online", cond, PROFILE, VOCAB, 8, np.ones(4), True, resync_bits_per_skipped=6
    )
    upload = device + 5 * per_entry / rate + edge
    np.testing.assert_allclose(got, [upload, device, device, upload + 6 / rate], rtol=1e-12)


def test_apply_channel_single_model_modes():
    table = _table([{"prompt_id": "a", "position": i} for i in range(3)])
    cond = ChannelCondition(name="r", fading="rayleigh", bandwidth_hz=1e6, snr_db=0.0, rtt_s=0.05)
    gains = token_gains(table, cond, base_seed=0)
    llm = apply_channel(table, "llm_only", cond, COSTLY, VOCAB, 8, gains, False)
    np.testing.assert_allclose(llm, [0.1] * 3)
    slm = table.assign(skipped=True)
    got = apply_channel(slm, "slm_only", cond, COSTLY, VOCAB, 8, gains, False)
    np.testing.assert_allclose(got, [0.01] * 3)
    with pytest.raises(ValueError, match="no uploads"):
        apply_channel(
            table.assign(uploaded=True, k=VOCAB), "llm_only", cond, PROFILE, VOCAB, 8, gains, False
        )
    with pytest.raises(ValueError, match="one entry per token"):
        apply_channel(table, "llm_only", cond, PROFILE, VOCAB, 8, gains[:2], False)


COSTLY = LatencyProfile(
    draft_token_s=0.01,
    target_token_s=0.1,
    uncertainty_s=0.002,
    online_k_s=0.005,
    topk_s={1: 0.001, 16: 0.002, 60: 0.003},
)


def test_device_costs_are_charged_per_variant():
    """Top-k variants pay one extraction per compressed upload, CU-HLM online also its k(t)
    selection, cuhlm_exact one extraction per token (it draws every token from x_hat); full
    uploads and skipped tokens of the others pay neither."""
    rows = [
        {"prompt_id": "p", "position": 0, "uploaded": True, "k": 16},
        {"prompt_id": "p", "position": 1, "skipped": True},
        {"prompt_id": "p", "position": 2, "uploaded": True, "k": VOCAB},
        {"prompt_id": "p", "position": 3, "uploaded": True, "k": 4},
    ]
    table = _table(rows)
    topk_4 = 0.001 + (0.002 - 0.001) * math.log(4) / math.log(16)
    expected = {
        "hlm": [0, 0, 0, 0],
        "uhlm_risk_prone": [0, 0, 0, 0],
        "fixed_topk": [0.002, 0, 0, topk_4],
        "cuhlm_offline": [0.002, 0, 0, topk_4],
        "cuhlm_joint": [0.002, 0, 0, topk_4],
        "cuhlm_online": [0.007, 0, 0.005, 0.005 + topk_4],
        "cuhlm_exact": [0.002] * 4,
    }
    cond = ChannelCondition(name="c", fading="awgn", bandwidth_hz=1e6, snr_db=10.0)
    gains = token_gains(table, cond, base_seed=0)
    for variant, extra in expected.items():
        got = device_seconds(table, variant, COSTLY, VOCAB, sampling_k=16)
        np.testing.assert_allclose(got, extra, rtol=1e-12, err_msg=variant)
        plain = apply_channel(table, variant, cond, PROFILE, VOCAB, 8, gains, False, sampling_k=16)
        costly = apply_channel(table, variant, cond, COSTLY, VOCAB, 8, gains, False, sampling_k=16)
        np.testing.assert_allclose(costly - plain, extra, rtol=1e-9, atol=1e-15, err_msg=variant)
    with pytest.raises(ValueError, match="sampling_k"):
        device_seconds(table, "cuhlm_exact", COSTLY, VOCAB)


def test_common_random_numbers_across_variants_snrs_and_seeds():
    cond = ChannelCondition(name="r", fading="rayleigh", bandwidth_hz=1e6, snr_db=0.0)
    rows = [{"prompt_id": p, "position": t} for t in range(4) for p in ("a", "b", "c")]
    first = _table(rows)
    shuffled = first.sample(frac=1.0, random_state=3).reset_index(drop=True)
    g1 = token_gains(first, cond, 42)
    g2 = token_gains(shuffled, cond, 42)
    key = list(zip(first.prompt_id, first.position, strict=True))
    by_key = dict(zip(key, g1, strict=True))
    assert [by_key[k] for k in zip(shuffled.prompt_id, shuffled.position, strict=True)] == list(g2)
    assert len(set(g1)) == len(g1)  # independent draws per token
    # Another variant with other completion lengths sees the same gain where both have a token.
    other = _table(
        [{"prompt_id": "a", "position": t} for t in range(7)] + [{"prompt_id": "c", "position": 0}]
    )
    g3 = token_gains(other, cond, 42)
    for (p, t), g in zip(zip(other.prompt_id, other.position, strict=True), g3, strict=True):
        if (p, t) in by_key:
            assert g == by_key[(p, t)]
    assert not np.array_equal(token_gains(first, cond, 43), g1)
    # Fading seeds: seed index 0 is g1, other indices are other realisations, each reproducible
    # and shared by every SNR of the fading model.
    assert np.array_equal(token_gains(first, cond, 42, 0), g1)
    g_seed1 = token_gains(first, cond, 42, 1)
    assert not np.array_equal(g_seed1, g1)
    by_key_1 = dict(zip(key, g_seed1, strict=True))
    g_shuffled_1 = token_gains(shuffled, cond, 42, 1)
    assert [by_key_1[k] for k in zip(shuffled.prompt_id, shuffled.position, strict=True)] == list(
        g_shuffled_1
    )
    louder = ChannelCondition(name="r20", fading="rayleigh", bandwidth_hz=1e6, snr_db=20.0)
    assert fading_base_seed(7, cond) == fading_base_seed(7, louder)
    assert np.array_equal(token_gains(first, louder, 42, 1), g_seed1)
    rician = ChannelCondition(name="k", fading="rician", k_factor=5.0, bandwidth_hz=1e6, snr_db=0.0)
    assert fading_base_seed(7, cond) != fading_base_seed(7, rician)
    with pytest.raises(ValueError, match="seed_index"):
        token_gains(first, cond, 42, -1)
    # Through apply_channel: two variants with equal token counts see the same rates.
    full = first.assign(uploaded=True, k=VOCAB)
    small = first.assign(uploaded=True, k=5)
    d_full = apply_channel(full, "hlm", cond, PROFILE, VOCAB, 8, g1, False)
    d_small = apply_channel(small, "cuhlm_offline", cond, PROFILE, VOCAB, 8, g1, False)
    fixed = 0.01 + 0.1
    np.testing.assert_allclose(VOCAB * 14 / (d_full - fixed), 5 * 14 / (d_small - fixed), rtol=1e-9)


def test_price_variant_shares_draws_across_variants_snrs_and_profiles():
    """price_variant: one row per (channel, profile, seed); per seed every variant and every
    SNR of a fading model use the same gains, so with equal tables two variants' upload
    times differ exactly by their payload ratio, seed by seed."""
    rows = [{"prompt_id": p, "position": t} for t in range(6) for p in ("a", "b")]
    full = _table(rows).assign(uploaded=True, k=VOCAB)
    small = _table(rows).assign(uploaded=True, k=5)
    conditions = {
        f"rayleigh_snr{snr}": ChannelCondition(
            name=f"rayleigh_snr{snr}", fading="rayleigh", bandwidth_hz=1e6, snr_db=float(snr)
        )
        for snr in (-10, 10)
    }
    profiles = {"primary": PROFILE, "paper_hw": COSTLY}
    a = price_variant(full, "hlm", conditions, profiles, VOCAB, 8, seed=5, fading_seeds=4)
    b = price_variant(
        small, "cuhlm_offline", conditions, profiles, VOCAB, 8, seed=5, fading_seeds=4
    )
    assert len(a) == 2 * 2 * 4 and set(a.seed) == {0, 1, 2, 3}
    assert set(a.profile) == {"primary", "paper_hw"} and set(a.channel) == set(conditions)
    primary = (a.profile == "primary").to_numpy()
    upload_a = a.total_delay_s[primary].to_numpy() - len(rows) * (0.01 + 0.1)
    upload_b = b.total_delay_s[primary].to_numpy() - len(rows) * (
        0.01 + 0.1 + 0.002
    )  # cuhlm_offline pays tau_unc
    np.testing.assert_allclose(upload_a / upload_b, VOCAB / 5, rtol=1e-9)
    per_seed = a[primary].groupby("seed").total_delay_s.first()
    assert per_seed.nunique() == 4  # seeds are different realisations
    again = price_variant(full, "hlm", conditions, profiles, VOCAB, 8, seed=5, fading_seeds=4)
    pd.testing.assert_frame_equal(a, again)


def test_variant_metrics_hand_built():
    table = _table(
        [
            {
                "prompt_id": "a",
                "position": 0,
                "uploaded": True,
                "k": 10,
                "measured_tvd": 0.1,
                "output_tvd": 0.04,
            },
            {"prompt_id": "a", "position": 1, "skipped": True, "accept_prob": 0.9},
            {
                "prompt_id": "a",
                "position": 2,
                "uploaded": True,
                "k": VOCAB,
                "accepted": False,
                "accept_prob": 0.2,
            },
            {"prompt_id": "b", "position": 0, "skipped": True, "accept_prob": 0.5},
        ]
    )
    delays = np.array([1.0, 2.0, 3.0, 4.0])
    m = variant_metrics(table, delays, VOCAB, 8)
    bits = (10 + VOCAB) * 14
    expected = {
        "tokens": 4,
        "num_prompts": 2,
        "uploads": 2,
        "total_delay_s": 10.0,
        "throughput_tps": 0.4,
        "mean_token_latency_s": 2.5,
        "end_to_end_latency_s": 5.0,
        "uplink_bits_per_token": bits / 4,
        "uplink_bytes_per_token": bits / 32,
        "skip_rate": 0.5,
        "transmission_rate": 0.5,
        "true_skip_rate": 0.7,
        "vocab_compression": 1 - 35.5 / VOCAB,
        "mean_k": 35.5,
        "measured_tvd_mean": 0.05,
        "output_tvd_mean": 0.02,
        "acceptance_rate": 0.5,
        "interaction_rounds_per_answer": 1.0,
    }
    assert m.keys() == expected.keys()
    for key, value in expected.items():
        assert m[key] == pytest.approx(value, rel=1e-12), key
    # b's skipped token follows no upload, so only a's skipped id is resent.
    with_resync = variant_metrics(table, delays, VOCAB, 8, resync_bits_per_skipped=6)
    assert with_resync["uplink_bits_per_token"] == pytest.approx((bits + 6) / 4)
    none_skipped = variant_metrics(
        table.assign(skipped=False, uploaded=True, k=VOCAB), delays, VOCAB, 8
    )
    assert math.isnan(none_skipped["true_skip_rate"])
    assert none_skipped["vocab_compression"] == 0.0


def test_metrics_end_to_end_on_decoded_tables(tiny_target, tiny_draft_close):
    cond = ChannelCondition(name="r", fading="rayleigh", bandwidth_hz=1e6, snr_db=10.0)
    out = {}
    for variant in ("hlm", "cuhlm_offline", "llm_only"):
        table, _ = _decode(variant, tiny_draft_close, tiny_target, build_policy(variant, PARAMS))
        delays = apply_channel(
            table,
            variant,
            cond,
            PROFILE,
            VOCAB,
            8,
            token_gains(table, cond, base_seed=0),
            uses_uncertainty(variant),
        )
        assert delays.shape == (len(table),) and (delays > 0).all()
        out[variant] = variant_metrics(table, delays, VOCAB, 8)
    rel = relative_to(out)
    assert rel["hlm"]["throughput_gain"] == 1.0
    assert rel["cuhlm_offline"]["uplink_bits_ratio"] < 1.0
    assert rel["llm_only"]["throughput_gain"] > 0
    assert "throughput_gain" not in out["hlm"]  # inputs are not modified


def test_relative_to_ratios():
    metrics = {
        "hlm": {"throughput_tps": 2.0, "uplink_bits_per_token": 100.0, "exact_match": 0.8},
        "cuhlm_online": {"throughput_tps": 8.0, "uplink_bits_per_token": 5.0, "exact_match": 0.6},
    }
    rel = relative_to(metrics)
    assert rel["cuhlm_online"]["throughput_gain"] == 4.0
    assert rel["cuhlm_online"]["uplink_bits_ratio"] == 0.05
    assert rel["cuhlm_online"]["relative_exact_match"] == pytest.approx(0.75)
    with pytest.raises(KeyError):
        relative_to(metrics, reference="vanilla_sd")


def _fake_embed(texts, batch_size=64):
    """Deterministic bag-of-letters embeddings (no model download in unit tests)."""
    out = torch.zeros(len(texts), 27)
    for i, text in enumerate(texts):
        for ch in text.lower():
            out[i, ord(ch) - 97 if "a" <= ch <= "z" else 26] += 1
    return torch.nn.functional.normalize(out + 1e-6, dim=-1)


def test_text_scores(monkeypatch):
    monkeypatch.setattr(scoring, "embed", _fake_embed)
    records = [
        PromptRecord("q1", "What is 6*7?", "6*7 = 42", "42", "arithmetic", "arithmetic"),
        PromptRecord("q2", "Say hi", None, None, "instruction", "instructions"),
        {"id": "q3", "task": "qa", "reference": "Paris", "gold_answer": "Paris"},
    ]
    texts = ["The answer is 42", "hello there", "It is Lyon"]
    llm = ["so 6*7 = 42", "hello there", "Paris"]
    frame = text_scores(texts, records, llm)
    assert frame.prompt_id.tolist() == ["q1", "q2", "q3"]
    assert frame.exact_match[0] == 1.0 and frame.exact_match[2] == 0.0
    assert math.isnan(frame.exact_match[1])
    assert frame.semantic_reference.tolist() == ["dataset", "llm_only", "dataset"]
    assert frame.semantic_accuracy[1] == pytest.approx(1.0)  # vs the identical LLM output
    assert frame.similarity_to_llm[1] == pytest.approx(1.0)
    assert frame.similarity_to_llm[0] < 1.0
    assert frame.answer_fidelity.tolist() == [1.0, 1.0, 0.0]
    alone = text_scores(texts, records, None)
    assert alone.similarity_to_llm.isna().all() and alone.answer_fidelity.isna().all()
    assert math.isnan(alone.semantic_accuracy[1]) and pd.isna(alone.semantic_reference[1])


def test_replay_token_by_token_equals_one_forward_per_prompt(tiny_draft_close):
    """optimize_k replays an int8 draft a token at a time; for a float draft both replays give
    the distributions that proposed each completion token."""
    from edgespec.cuhlm.traces import replay_draft_probs

    prompts = [[3, 17, 29], [40, 2, 11, 58, 7]]
    completions = [[5, 9, 12, 1], [33, 8]]
    with torch.inference_mode():
        whole = list(replay_draft_probs(tiny_draft_close, prompts, completions, 1.0))
        stepped = list(
            replay_draft_probs(tiny_draft_close, prompts, completions, 1.0, token_by_token=True)
        )
        direct = torch.softmax(tiny_draft_close(torch.tensor([[3, 17, 29, 5]])).logits[0], -1)
    assert [p.shape[0] for p in stepped] == [4, 2]
    for a, b in zip(whole, stepped, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-9)
    # row t proposed completion token t: the last prompt token's row, then completion[0]'s
    torch.testing.assert_close(stepped[0][:2], direct[2:4], rtol=0, atol=1e-9)


def test_trace_result_meta_and_hidden_arrays():
    from edgespec.cuhlm.traces import TraceResult
    from edgespec.data.records import PromptRecord

    class Tokenizer:
        def decode(self, ids, skip_special_tokens):
            assert skip_special_tokens
            return " ".join(map(str, ids))

    tokens = pd.DataFrame({"prompt_id": ["p", "p", "q"]})
    tokens.attrs["k_grid"] = [1, 4, 32]
    hidden = np.ones((3, 2), dtype=np.float16)
    result = TraceResult(tokens, hidden, None, [[5, 6], [7]])
    records = [PromptRecord(i, "x", None, None, "chat", "constructed", "calib") for i in "pq"]
    meta = result.meta("chat", records, 1.5, Tokenizer(), decoding={"batch_size": 2})
    assert meta["vocab_size"] == 32 and meta["k_grid"] == [1, 4, 32]
    assert (meta["prompts"], meta["tokens"], meta["tokens_per_second"]) == (2, 3, 2.0)
    assert meta["completions"] == {"p": "5 6", "q": "7"}
    assert meta["decoding"] == {"batch_size": 2} and meta["dataset"] == "chat"
    assert result.meta("chat", records, 0.0, Tokenizer())["tokens_per_second"] is None
    arrays = result.hidden_arrays()
    assert arrays["draft"] is hidden and arrays["target"].shape == (3, 0)
    assert arrays["target"].dtype == np.float16
