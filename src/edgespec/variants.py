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
