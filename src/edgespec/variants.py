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
    "cuhlm_exact",
    "cuhlm_joint",
)
SINGLE_MODEL_VARIANTS = ("llm_only", "slm_only")
"""Variants decoded with one model only (no policy)."""

UNCERTAINTY_VARIANTS = (
    "uhlm_risk_averse",
    "uhlm_risk_prone",
    "fixed_topk",
    "cuhlm_offline",
    "cuhlm_online",
    "cuhlm_exact",
    "cuhlm_joint",
)
"""Variants whose device computes u(t) to decide; their per-token delay includes tau_unc.
(``hlm`` may compute u too, to record it for analysis; the device does not need it, so it is
not charged.)"""

TOPK_VARIANTS = ("fixed_topk", "cuhlm_offline", "cuhlm_online", "cuhlm_exact", "cuhlm_joint")
"""Variants whose device extracts the top-k of x for an upload with k < |V|; each such upload
is charged the measured top-k extraction time."""

ONLINE_K_VARIANTS = ("cuhlm_online",)
"""Variants whose device selects k(t) per uploaded token (charged the measured selection time)."""

RECONSTRUCTION_SAMPLING_VARIANTS = ("cuhlm_exact",)
"""Variants whose device draws d(t) from the top-k reconstruction x_hat it would upload, so it
builds x_hat for every token, skipped or not (charged one top-k extraction per token)."""

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
    "cuhlm_exact": frozenset({"uncertainty", "u_th", "k_star"}),
    "cuhlm_joint": frozenset({"uncertainty", "joint"}),
}
"""What each CU-HLM variant's policy reads (``edgespec.cuhlm.policies.build_policy``):
``uncertainty`` (the config section), ``fit`` (the calibration fit and its two U-HLM
thresholds), ``u_th`` (the threshold of ``cuhlm.threshold_rule``, from the fit), ``k_star``
(the offline k*), ``joint`` (the joint (u_th, k) programme's solution at ``cuhlm.kstar_channel``,
both from kstar.json), ``theta_tv``, ``fixed_k``, ``online_k_max`` (config keys of ``cuhlm``)
and ``random_skip_rate`` (measured on the reference variant). The workflow hands a decode job
only these, so a change to anything else does not decode the variant again."""

WISV_VARIANTS = (
    "vanilla_sd",
    "topk_accept",
    "head_no_csi",
    "head_relabel_no_csi",
    "wisv_fh",
    "wisv_sh",
)
"""WISV-study variants: ``head_no_csi`` (original labels) and ``head_relabel_no_csi`` (the
relabeled labels, no CSI features) are the ablations of ``wisv_fh``/``wisv_sh``."""

WISV_CSI_VARIANTS = ("wisv_fh", "wisv_sh")
"""WISV variants whose decisions read the round's CSI: decoded per channel and fading seed
(one decode serves both protocols); the others are decoded once, channel-free."""
