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
WISV_VARIANTS = ("vanilla_sd", "topk_accept", "head_no_csi", "wisv_fh", "wisv_sh")
