"""Device-side CU-HLM policies: skip rule, k rules, random skip, variant mapping."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from edgespec.cuhlm.bounds import online_k
from edgespec.cuhlm.calibration import LinearFit
from edgespec.cuhlm.policies import (
    VARIANTS,
    ExactTopKPolicy,
    FixedK,
    FullUpload,
    OnlineK,
    RandomSkipPolicy,
    ThresholdPolicy,
    build_policy,
    policy_from_artifacts,
)
from edgespec.decoding.compression import reconstruct_topk
from edgespec.decoding.config import DecodingConfig
from edgespec.decoding.tokenwise import UploadFull, generate_tokenwise

VOCAB = 61
FIT = LinearFit(a=0.8, b=-0.06, r2=0.5, pearson_r=0.7, n=100)


def _inputs(batch: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, VOCAB, generator=g, dtype=torch.float64) * 3
    probs = torch.softmax(logits, -1)
    tokens = torch.multinomial(probs, 1, generator=g).squeeze(1)
    return logits, probs, tokens


def _prompts(seed: int, lengths=(5, 9, 3, 12)) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lengths]


def test_threshold_zero_skips_only_certain_tokens():
    logits, probs, tokens = _inputs(6)
    u = torch.tensor([0.0, 0.05, 0.5, 0.0, 1.0, 1 / 20], dtype=torch.float32)
    policy = ThresholdPolicy(0.0, FullUpload(), uncertainty_samples=20)
    skip, k = policy.decide(logits, probs, tokens, u, torch.Generator())
    assert skip.tolist() == [True, False, False, True, False, False]
    assert k.tolist() == [0, VOCAB, VOCAB, 0, VOCAB, VOCAB]


def test_threshold_compares_float32_lattice_exactly():
    """A threshold read back from a trace (float32 u as a Python float) skips that u."""
    logits, probs, tokens = _inputs(3)
    u = torch.tensor([0.05, 0.1, 0.15], dtype=torch.float32)
    policy = ThresholdPolicy(float(u[1]), FullUpload(), uncertainty_samples=20)
    skip, _ = policy.decide(logits, probs, tokens, u, torch.Generator())
    assert skip.tolist() == [True, True, False]


@pytest.mark.parametrize("u_th", [None, -1.0, -0.01])
def test_no_threshold_never_skips(u_th):
    logits, probs, tokens = _inputs(4)
    policy = ThresholdPolicy(u_th, FixedK(7), uncertainty_samples=5)
    skip, k = policy.decide(logits, probs, tokens, torch.zeros(4), torch.Generator())
    assert not skip.any()
    assert k.tolist() == [7] * 4


def test_threshold_needs_uncertainty():
    with pytest.raises(ValueError, match="uncertainty"):
        ThresholdPolicy(0.1, FullUpload(), uncertainty_samples=0)
    with pytest.raises(ValueError, match="uncertainty"):
        ThresholdPolicy(None, OnlineK(FIT, 0.2), uncertainty_samples=0)
    with pytest.raises(ValueError):
        ThresholdPolicy(math.nan, FullUpload(), uncertainty_samples=4)
    ThresholdPolicy(None, FixedK(3), uncertainty_samples=0)  # full/fixed uploads need no u


def test_fixed_k_clipped_and_validated():
    _, probs, tokens = _inputs(3)
    assert FixedK(1000)(probs, tokens, torch.zeros(3)).tolist() == [VOCAB] * 3
    assert FixedK(4)(probs, tokens, torch.zeros(3)).tolist() == [4] * 3
    for bad in (0, -2, 2.5):
        with pytest.raises(ValueError):
            FixedK(bad)


def test_online_k_rule_matches_kselect_on_sent_rows():
    logits, probs, tokens = _inputs(8, seed=3)
    u = torch.tensor([0.0, 0.1, 0.3, 0.5, 0.0, 0.9, 0.2, 0.7])
    rule = OnlineK(FIT, theta_tv=0.15, k_max=40)
    policy = ThresholdPolicy(0.0, rule, uncertainty_samples=10)
    skip, k = policy.decide(logits, probs, tokens, u, torch.Generator())
    expected = online_k(probs, tokens, u, FIT, 0.15, 40)
    assert skip.tolist() == (u <= 0).tolist()
    assert k[~skip].tolist() == expected[~skip].tolist()
    assert (k[skip] == 0).all()
    assert ((k[~skip] >= 1) & (k[~skip] <= 40)).all()


def test_random_skip_rate_is_respected():
    n, rate = 20000, 0.3
    logits, probs, tokens = _inputs(n)
    policy = RandomSkipPolicy(rate)
    assert policy.uncertainty_samples == 0
    skip, k = policy.decide(logits, probs, tokens, torch.zeros(n), torch.Generator().manual_seed(5))
    assert abs(skip.double().mean().item() - rate) < 4 * math.sqrt(rate * (1 - rate) / n)
    assert (k[skip] == 0).all() and (k[~skip] == VOCAB).all()
    again, _ = policy.decide(
        logits, probs, tokens, torch.zeros(n), torch.Generator().manual_seed(5)
    )
    assert torch.equal(skip, again)  # the draws come from the generator passed in
    none, _ = RandomSkipPolicy(0.0).decide(logits, probs, tokens, None, torch.Generator())
    every, _ = RandomSkipPolicy(1.0).decide(logits, probs, tokens, None, torch.Generator())
    assert not none.any() and every.all()
    with pytest.raises(ValueError):
        RandomSkipPolicy(1.5)
    with pytest.raises(ValueError):
        RandomSkipPolicy(0.2, OnlineK(FIT, 0.1))


def test_random_skip_rate_in_decoding(tiny_target, tiny_draft_close):
    """Skipped tokens in a real decode occur at the configured rate (binomial bound)."""
    prompts = _prompts(2, lengths=(4,) * 40)
    cfg = DecodingConfig(max_new_tokens=10, temperature=1.0, batch_size=40)
    skipped = []
    generate_tokenwise(
        prompts,
        cfg,
        torch.Generator().manual_seed(3),
        draft=tiny_draft_close,
        target=tiny_target,
        policy=RandomSkipPolicy(0.4),
        on_step=lambda step: skipped.extend(step.skipped.tolist()),
    )
    n = len(skipped)
    assert n == 400
    assert abs(sum(skipped) / n - 0.4) < 4 * math.sqrt(0.4 * 0.6 / n)


@pytest.mark.parametrize("samples", [0, 8])
def test_full_k_threshold_policy_equals_upload_full(tiny_target, tiny_draft_close, samples):
    """k = |V| and no threshold is standard HLM token for token, under the same seed.

    Like with like: the engine draws the uncertainty samples from the decoding generator, so
    the two runs are coupled only when both compute u with the same M and theta_max.
    """
    prompts = _prompts(1)
    cfg = DecodingConfig(max_new_tokens=12, temperature=1.0, batch_size=3)

    def run(policy):
        return generate_tokenwise(
            prompts,
            cfg,
            torch.Generator().manual_seed(17),
            draft=tiny_draft_close,
            target=tiny_target,
            policy=policy,
        )

    hlm = run(UploadFull(uncertainty_samples=samples, theta_max=1.5))
    cuhlm = run(ThresholdPolicy(None, FixedK(VOCAB), uncertainty_samples=samples, theta_max=1.5))
    assert cuhlm == hlm
    if samples:
        # Unlike with unlike: the extra uncertainty draws shift the stream (deterministically).
        assert run(UploadFull()) != hlm


PARAMS = {
    "u_th_risk_averse": 0.1,
    "u_th_risk_prone": 0.35,
    "u_th": 0.2,
    "fit": FIT,
    "theta_tv": 0.25,
    "k_star": 16,
    "u_th_joint": 0.3,
    "k_joint": 9,
    "fixed_k": 4,
    "random_skip_rate": 0.3,
    "uncertainty_samples": 12,
    "theta_max": 1.5,
}


def test_build_policy_maps_every_variant():
    assert build_policy("llm_only", PARAMS) is None
    assert build_policy("slm_only", {}) is None
    hlm = build_policy("hlm", PARAMS)
    assert type(hlm) is UploadFull and hlm.uncertainty_samples == 12
    rnd = build_policy("random_skip", PARAMS)
    assert isinstance(rnd, RandomSkipPolicy) and rnd.skip_rate == 0.3
    assert rnd.uncertainty_samples == 0 and isinstance(rnd.k_rule, FullUpload)
    expected = {
        "uhlm_risk_averse": (0.1, FullUpload()),
        "uhlm_risk_prone": (0.35, FullUpload()),
        "fixed_topk": (0.2, FixedK(4)),
        "cuhlm_offline": (0.2, FixedK(16)),
        "cuhlm_online": (0.2, OnlineK(FIT, 0.25)),
        "cuhlm_exact": (0.2, FixedK(16)),
        "cuhlm_joint": (0.3, FixedK(9)),
    }
    _, probs, _ = _inputs(3)
    for variant, (u_th, rule) in expected.items():
        policy = build_policy(variant, PARAMS)
        assert isinstance(policy, ThresholdPolicy), variant
        assert policy.u_th == u_th and policy.k_rule == rule, variant
        assert policy.uncertainty_samples == 12 and policy.uncertainty_theta_max == 1.5
        # Only cuhlm_exact draws d from something other than x: the x_hat it uploads.
        drawn = policy.sampling_distribution(None, probs)
        if variant == "cuhlm_exact":
            assert isinstance(policy, ExactTopKPolicy)
            torch.testing.assert_close(drawn, reconstruct_topk(probs, 16))
        else:
            assert drawn is probs
    assert set(VARIANTS) == {"llm_only", "slm_only", "hlm", "random_skip", *expected}


def test_build_policy_errors():
    with pytest.raises(ValueError, match="unknown variant"):
        build_policy("cuhlm", PARAMS)
    with pytest.raises(ValueError, match="k_star"):
        build_policy("cuhlm_offline", {k: v for k, v in PARAMS.items() if k != "k_star"})
    with pytest.raises(ValueError, match="uncertainty"):
        build_policy("uhlm_risk_averse", {**PARAMS, "uncertainty_samples": 0})
    # A calibrated "skip nothing" threshold (negative) is valid and never skips.
    assert build_policy("cuhlm_offline", {**PARAMS, "u_th": -1.0}).u_th is None


# What each read of edgespec.variants.CUHLM_POLICY_READS hands a decode job (rule decode_cuhlm:
# config keys in params.policy, fit.json and kstar.json as inputs, the reference's skip rate).
READ_KEYS = {
    "uncertainty": ("uncertainty_samples", "theta_max"),
    "fit": ("fit", "u_th_risk_averse", "u_th_risk_prone", "u_th"),  # fit.json
    "u_th": ("fit", "u_th_risk_averse", "u_th_risk_prone", "u_th"),  # fit.json
    "k_star": ("k_star", "u_th_joint", "k_joint"),  # kstar.json
    "joint": ("k_star", "u_th_joint", "k_joint"),  # kstar.json
    "theta_tv": ("theta_tv",),
    "fixed_k": ("fixed_k",),
    "online_k_max": ("online_k_max",),
    "random_skip_rate": ("random_skip_rate",),
}


def _policy_fields(policy):
    return (
        type(policy),
        getattr(policy, "u_th", None),
        getattr(policy, "k_rule", None),
        getattr(policy, "uncertainty_samples", None),
        getattr(policy, "uncertainty_theta_max", None),
        getattr(policy, "skip_rate", None),
    )


def test_policy_reads_give_each_variant_everything_it_needs():
    """A decode job gets only what its variant's policy reads (so that other keys rerun
    nothing); that must build the same policy as every parameter would."""
    from edgespec.variants import CUHLM_POLICY_READS

    assert set(CUHLM_POLICY_READS) == set(VARIANTS)
    full = {**PARAMS, "online_k_max": 32}
    for variant, reads in CUHLM_POLICY_READS.items():
        assert reads <= set(READ_KEYS), variant
        keys = {key for read in reads for key in READ_KEYS[read]}
        only = {key: full[key] for key in keys}
        assert _policy_fields(build_policy(variant, only)) == _policy_fields(
            build_policy(variant, full)
        ), variant
    # the joint variant decodes kstar.json's joint solution, not the fit's threshold
    assert "joint" in CUHLM_POLICY_READS["cuhlm_joint"]
    assert "u_th" not in CUHLM_POLICY_READS["cuhlm_joint"]


# The records rule decode_cuhlm reads: fit.json, kstar.json (the values of PARAMS).
FIT_RECORD = {
    "a": FIT.a,
    "b": FIT.b,
    "r2": FIT.r2,
    "pearson_r": FIT.pearson_r,
    "n": FIT.n,
    "u_th_risk_averse": 0.1,
    "u_th_risk_prone": 0.35,
    "u_th": 0.2,
}
KSTAR_RECORD = {"k_star": 16, "joint": {"k_star": 9, "u_th": 0.3}}
SETTINGS = {"theta_tv": 0.25, "fixed_k": 4, "uncertainty_samples": 12, "theta_max": 1.5}


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "random_skip"])
def test_policy_from_the_artifacts_equals_the_one_from_its_parameters(variant):
    policy = policy_from_artifacts(variant, SETTINGS, FIT_RECORD, KSTAR_RECORD)
    assert _policy_fields(policy) == _policy_fields(build_policy(variant, PARAMS))
    if variant == "cuhlm_online":
        assert policy.k_rule.fit == FIT


def test_random_skip_reads_the_reference_skip_rate():
    reference = pd.DataFrame({"skipped": [True, False, False, True, False]})
    policy = policy_from_artifacts("random_skip", SETTINGS, reference=reference)
    assert isinstance(policy, RandomSkipPolicy) and policy.skip_rate == pytest.approx(0.4)
    with pytest.raises(ValueError, match="needs the reference variant's decoded tokens"):
        policy_from_artifacts("random_skip", SETTINGS)
    # fit.json without a rule threshold: the variants that use it skip nothing
    offline = policy_from_artifacts(
        "cuhlm_offline", SETTINGS, {**FIT_RECORD, "u_th": None}, KSTAR_RECORD
    )
    assert offline.u_th is None and offline.k_rule == FixedK(16)
