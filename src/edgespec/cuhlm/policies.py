"""Device-side per-token policies of the CU-HLM family (methods §3.3-3.5).

A policy sees only what the device knows (draft logits z, draft distribution x, draft token d,
uncertainty u) and decides per row whether to keep d without verification (skip) and, if not,
how many distribution entries to upload (k; k = |V| is standard HLM). Upload sizes come from a
*k rule*: :class:`FullUpload` (k = |V|), :class:`FixedK` (one k, e.g. the offline k*) or
:class:`OnlineK` (CU-HLM online, k(t) from :func:`edgespec.cuhlm.bounds.online_k`).

Random-number use (it matters for coupled comparisons): the engine draws the M uncertainty
samples from the decoding generator before it calls :meth:`TokenPolicy.decide`, and
:class:`RandomSkipPolicy` draws one uniform per row in ``decide``. A :class:`ThresholdPolicy`
consumes nothing in ``decide``. Two runs with equally seeded generators therefore see the same
draws exactly when they compute uncertainty with the same M (and theta_max) and neither skips
at random: ``ThresholdPolicy(None, FixedK(V), M, theta_max)`` and
``UploadFull(M, theta_max)`` decode token for token alike, for any M (M = 0 included).

Variant ids (:data:`VARIANTS`) name the methods of methods §3.5; :func:`build_policy` maps a variant
and the calibrated parameters to its policy.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from edgespec import checks
from edgespec.cuhlm.bounds import online_k
from edgespec.cuhlm.calibration import LinearFit
from edgespec.decoding.compression import reconstruct_topk
from edgespec.decoding.tokenwise import TokenPolicy, UploadFull
from edgespec.variants import CUHLM_VARIANTS, SINGLE_MODEL_VARIANTS

VARIANTS = CUHLM_VARIANTS
"""Every variant id, in the order reports list them."""

# ---------------------------------------------------------------------------------------------
# k rules
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FullUpload:
    """k = |V|: upload the whole distribution (standard HLM, U-HLM)."""

    needs_uncertainty = False

    def __call__(self, probs: torch.Tensor, draft_tokens: torch.Tensor, u: torch.Tensor):
        batch, vocab = probs.shape
        return torch.full((batch,), vocab, dtype=torch.long)


@dataclass(frozen=True)
class FixedK:
    """One k for every token (CU-HLM offline's k*, or the un-optimised fixed top-k baseline),
    clipped to |V|."""

    k: int
    needs_uncertainty = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "k", checks.integer("FixedK k", self.k))

    def __call__(self, probs: torch.Tensor, draft_tokens: torch.Tensor, u: torch.Tensor):
        batch, vocab = probs.shape
        return torch.full((batch,), min(self.k, vocab), dtype=torch.long)


@dataclass(frozen=True)
class OnlineK:
    """CU-HLM online: k(t) = the smallest k whose online bound U_TV(t; k) <= ``theta_tv``
    (:func:`edgespec.cuhlm.bounds.online_k`; ``k_max`` caps the search, default |V|)."""

    fit: LinearFit
    theta_tv: float
    k_max: int | None = None
    eta: float = 1.0
    needs_uncertainty = True

    def __post_init__(self) -> None:
        if not (math.isfinite(self.theta_tv) and self.theta_tv > 0):
            raise ValueError(f"OnlineK needs a finite theta_tv > 0, got {self.theta_tv!r}")

    def __call__(self, probs: torch.Tensor, draft_tokens: torch.Tensor, u: torch.Tensor):
        vocab = probs.shape[-1]
        cap = None if self.k_max is None else min(int(self.k_max), vocab)
        return online_k(probs, draft_tokens, u, self.fit, self.theta_tv, cap, self.eta)


KRule = FullUpload | FixedK | OnlineK


# ---------------------------------------------------------------------------------------------
# Policies
# ---------------------------------------------------------------------------------------------


class ThresholdPolicy(TokenPolicy):
    """Opportunistic skip plus a k rule (U-HLM, fixed top-k, CU-HLM offline and online).

    Skip iff u(t) <= ``u_th`` (the exact comparison calibration uses); ``u_th`` None or
    negative never skips. Non-skipped rows upload k from ``k_rule``. A threshold (or
    :class:`OnlineK`) needs u, so it needs ``uncertainty_samples`` > 0.
    """

    def __init__(
        self,
        u_th: float | None,
        k_rule: KRule | None = None,
        uncertainty_samples: int = 0,
        theta_max: float = 2.0,
    ):
        if u_th is not None and not math.isfinite(float(u_th)):
            raise ValueError(f"u_th must be a finite number or None, got {u_th!r}")
        self.u_th = None if u_th is None or float(u_th) < 0 else float(u_th)
        self.k_rule = k_rule if k_rule is not None else FullUpload()
        self.uncertainty_samples = checks.integer("uncertainty_samples", uncertainty_samples, 0)
        self.uncertainty_theta_max = float(theta_max)
        if self.uncertainty_samples == 0 and (
            self.u_th is not None or self.k_rule.needs_uncertainty
        ):
            raise ValueError(
                "a skip threshold or the online k rule needs the uncertainty u(t): "
                "set uncertainty_samples > 0"
            )

    def decide(self, draft_logits, draft_probs, draft_tokens, uncertainty, generator):
        batch = draft_probs.shape[0]
        if self.u_th is None:
            skip = torch.zeros(batch, dtype=torch.bool)
        else:
            skip = uncertainty.to(torch.float64).cpu() <= self.u_th
        k = torch.zeros(batch, dtype=torch.long)
        send = ~skip
        if send.any():
            rows = send.nonzero().squeeze(1)
            k[rows] = (
                self.k_rule(draft_probs[rows], draft_tokens[rows], uncertainty[rows])
                .to(torch.long)
                .cpu()
            )
        return skip, k

    def __repr__(self) -> str:
        return (
            f"ThresholdPolicy(u_th={self.u_th}, k_rule={self.k_rule}, "
            f"uncertainty_samples={self.uncertainty_samples}, "
            f"theta_max={self.uncertainty_theta_max})"
        )


class ExactTopKPolicy(ThresholdPolicy):
    """``cuhlm_exact`` (the project's variant, no paper has it): the skip rule and fixed k of
    CU-HLM offline, but the device draws d(t) from the reconstruction x_hat = top-k of x that it
    uploads (:meth:`sampling_distribution`), not from x.

    The edge verifies against x_hat, the law d was drawn from, so every uploaded token is
    verified exactly (methods §3.4; ``edgespec.cuhlm.distortion``): with skipping off the
    committed tokens follow y. The upload is the same k entries as CU-HLM offline (zero extra
    bytes); the price is a proposal that puts the tail's mass uniformly on the tail tokens,
    which lowers acceptance. Skipped tokens keep the x_hat draw.
    """

    def __init__(
        self, u_th: float | None, k: int, uncertainty_samples: int = 0, theta_max: float = 2.0
    ):
        super().__init__(u_th, FixedK(k), uncertainty_samples, theta_max)

    def sampling_distribution(self, draft_logits, draft_probs):
        return reconstruct_topk(draft_probs, min(self.k_rule.k, draft_probs.shape[-1]))

    def __repr__(self) -> str:
        return "Exact" + super().__repr__()


class RandomSkipPolicy(TokenPolicy):
    """Skip each token independently with probability ``skip_rate`` (the random-skip baseline,
    run at U-HLM's skip rate); uncertainty is not computed. Draws one uniform per row from the
    decoding generator."""

    def __init__(self, skip_rate: float, k_rule: KRule | None = None):
        if not 0.0 <= float(skip_rate) <= 1.0:
            raise ValueError(f"skip_rate must lie in [0, 1], got {skip_rate!r}")
        self.skip_rate = float(skip_rate)
        self.k_rule = k_rule if k_rule is not None else FullUpload()
        if self.k_rule.needs_uncertainty:
            raise ValueError("RandomSkipPolicy computes no uncertainty; use FullUpload or FixedK")
        self.uncertainty_samples = 0

    def decide(self, draft_logits, draft_probs, draft_tokens, uncertainty, generator):
        batch = draft_probs.shape[0]
        skip = torch.rand(batch, generator=generator, dtype=torch.float64) < self.skip_rate
        k = torch.where(skip, 0, self.k_rule(draft_probs, draft_tokens, uncertainty).cpu())
        return skip, k.to(torch.long)

    def __repr__(self) -> str:
        return f"RandomSkipPolicy(skip_rate={self.skip_rate}, k_rule={self.k_rule})"


def _param(params: Mapping[str, Any], key: str, variant: str):
    if key not in params or params[key] is None:
        raise ValueError(f"variant {variant!r} needs the parameter {key!r}")
    return params[key]


def build_policy(variant: str, params: Mapping[str, Any]) -> TokenPolicy | None:
    """The policy of ``variant`` (one of :data:`VARIANTS`); None for llm_only / slm_only.

    ``params`` keys (only those the variant uses are required): ``uncertainty_samples`` (M),
    ``theta_max``, ``u_th_risk_averse``, ``u_th_risk_prone``, ``u_th`` (the threshold the
    fixed-top-k and CU-HLM variants use), ``fit`` (:class:`LinearFit`), ``theta_tv``,
    ``k_star``, ``fixed_k``, ``random_skip_rate``, ``u_th_joint`` and ``k_joint`` (the joint
    programme's solution at ``cuhlm.kstar_channel``); optional ``online_k_max`` and ``eta`` for
    CU-HLM online.

    - ``hlm``: :class:`UploadFull`; it computes u with M samples (when M > 0) only to record
      it: the same draws as the threshold variants, so equally seeded runs stay coupled.
    - ``random_skip``: :class:`RandomSkipPolicy` at ``random_skip_rate``, full uploads.
    - ``uhlm_risk_averse`` / ``uhlm_risk_prone``: threshold skip, full uploads.
    - ``fixed_topk``: threshold ``u_th`` with a fixed, un-optimised ``fixed_k`` (the project's
      choice: the same skip rule as CU-HLM offline, so the pair isolates the choice of k).
    - ``cuhlm_offline``: threshold ``u_th``, k = ``k_star``.
    - ``cuhlm_online``: threshold ``u_th``, k(t) by :class:`OnlineK`.
    - ``cuhlm_exact``: :class:`ExactTopKPolicy`, threshold ``u_th``, k = ``k_star``, d ~ x_hat.
    - ``cuhlm_joint``: threshold ``u_th_joint``, k = ``k_joint`` (both from the joint programme).
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; known: {', '.join(VARIANTS)}")
    if variant in SINGLE_MODEL_VARIANTS:
        return None
    m = int(params.get("uncertainty_samples", 0) or 0)
    theta_max = float(params.get("theta_max", 2.0))
    if variant == "hlm":
        return UploadFull(uncertainty_samples=m, theta_max=theta_max)
    if variant == "random_skip":
        return RandomSkipPolicy(float(_param(params, "random_skip_rate", variant)), FullUpload())
    if variant == "uhlm_risk_averse":
        u_th, rule = _param(params, "u_th_risk_averse", variant), FullUpload()
    elif variant == "uhlm_risk_prone":
        u_th, rule = _param(params, "u_th_risk_prone", variant), FullUpload()
    elif variant == "fixed_topk":
        u_th = _param(params, "u_th", variant)
        rule = FixedK(int(_param(params, "fixed_k", variant)))
    elif variant == "cuhlm_offline":
        u_th = _param(params, "u_th", variant)
        rule = FixedK(int(_param(params, "k_star", variant)))
    elif variant == "cuhlm_exact":
        u_th = float(_param(params, "u_th", variant))
        return ExactTopKPolicy(u_th, int(_param(params, "k_star", variant)), m, theta_max)
    elif variant == "cuhlm_joint":
        u_th = _param(params, "u_th_joint", variant)
        rule = FixedK(int(_param(params, "k_joint", variant)))
    else:  # cuhlm_online
        u_th = _param(params, "u_th", variant)
        rule = OnlineK(
            fit=_param(params, "fit", variant),
            theta_tv=float(_param(params, "theta_tv", variant)),
            k_max=params.get("online_k_max"),
            eta=float(params.get("eta", 1.0)),
        )
    return ThresholdPolicy(float(u_th), rule, m, theta_max)


def policy_from_artifacts(
    variant: str,
    settings: Mapping[str, Any],
    fit: dict | None = None,
    kstar: dict | None = None,
    reference: pd.DataFrame | None = None,
) -> TokenPolicy | None:
    """:func:`build_policy` of ``variant`` from the config keys it reads (``settings``:
    ``edgespec.variants.CUHLM_POLICY_READS``) and the calibration artifacts it reads: the
    ``fit.json`` record (the fit and the risk-averse, risk-prone and rule thresholds; a
    missing rule threshold skips nothing), the ``kstar.json`` record (the offline k* and the
    joint programme's (u_th, k*) at ``cuhlm.kstar_channel``) and, for ``random_skip``, the
    reference variant's decoded tokens, whose measured skip rate it skips at."""
    params = dict(settings)
    if fit is not None:
        params["fit"] = LinearFit.from_record(fit)
        params["u_th_risk_averse"] = fit["u_th_risk_averse"]
        params["u_th_risk_prone"] = fit["u_th_risk_prone"]
        params["u_th"] = fit["u_th"] if fit["u_th"] is not None else -1.0
    if kstar is not None:
        params["k_star"] = kstar["k_star"]
        params["u_th_joint"] = kstar["joint"]["u_th"]
        params["k_joint"] = kstar["joint"]["k_star"]
    if variant == "random_skip":
        if reference is None:
            raise ValueError("variant 'random_skip' needs the reference variant's decoded tokens")
        params["random_skip_rate"] = float(reference["skipped"].mean())
        logging.getLogger(__name__).info(
            "random skip at the measured rate %.4f", params["random_skip_rate"]
        )
    return build_policy(variant, params)
