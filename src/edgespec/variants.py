"""Variant ids of both studies, in the order reports list them (no heavy imports: the workflow
reads them while it parses)."""

CUHLM_VARIANTS = (
    "llm_only",
    "slm_only",
    "hlm",
    "random_skip",
    "uhlm_risk_averse",
    "uhlm_risk_prone",
    "fixed_topk",
    "cuhlm_offline",
    "cuhlm_online",
)
SINGLE_MODEL_VARIANTS = ("llm_only", "slm_only")
"""Variants decoded with one model only (no policy)."""

UNCERTAINTY_VARIANTS = (
    "uhlm_risk_averse",
    "uhlm_risk_prone",
    "fixed_topk",
    "cuhlm_offline",
    "cuhlm_online",
)
"""Variants whose device computes u(t) to decide; their per-token delay includes tau_unc.
(``hlm`` may compute u too, to record it for analysis; the device does not need it, so it is
not charged.)"""

CUHLM_POLICY_READS: dict[str, frozenset[str]] = {
    "llm_only": frozenset(),
    "slm_only": frozenset(),
    "hlm": frozenset({"uncertainty"}),
    "random_skip": frozenset({"random_skip_rate"}),
    "uhlm_risk_averse": frozenset({"uncertainty", "fit"}),
    "uhlm_risk_prone": frozenset({"uncertainty", "fit"}),
    "fixed_topk": frozenset({"uncertainty", "u_th", "fixed_k"}),
    "cuhlm_offline": frozenset({"uncertainty", "u_th", "k_star"}),
    "cuhlm_online": frozenset({"uncertainty", "u_th", "fit", "theta_tv", "online_k_max"}),
}
"""What each CU-HLM variant's policy reads (``edgespec.cuhlm.policies.build_policy``):
``uncertainty`` (the config section), ``fit`` (the calibration fit and its two U-HLM
thresholds), ``u_th`` (the threshold of ``cuhlm.threshold_rule``, or k*'s under
``cuhlm.joint_threshold``), ``k_star``, ``theta_tv``, ``fixed_k``, ``online_k_max`` (config
keys of ``cuhlm``) and ``random_skip_rate`` (measured on the reference variant). The workflow
hands a decode job only these, so a change to anything else does not decode the variant again."""

WISV_VARIANTS = ("vanilla_sd", "topk_accept", "head_no_csi", "wisv_fh", "wisv_sh")
