"""Rule profile_head (WISV wing, edgespec.wisv.head; edgespec.profiling): each WISV decision head's
compute per round, timed on untrained heads of the trained heads' sizes (the time depends on the
sizes only), or the emulated hardware's (latency.given.head_round_s)."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import logging  # noqa: E402

from edgespec.artifacts import read_json, write_json  # noqa: E402
from edgespec.wisv.head import HEAD_USES_CSI  # noqa: E402

params = snakemake.params
latency = params.latency
gamma = params.gamma
if latency["mode"] == "given":
    head_round_s = {key: latency["given"]["head_round_s"] for key in HEAD_USES_CSI}
    source = "given"
else:
    import torch

    from edgespec.profiling import measure_head_round_s
    from edgespec.wisv.head import untrained_heads

    torch.set_num_threads(snakemake.threads)
    models = read_json(snakemake.input.provenance)["models"]
    csi = [1.0] * len(params.csi_features)
    heads = untrained_heads(
        models["draft"]["hidden_size"],
        models["target"]["hidden_size"],
        len(csi),
        params.head_hidden,
    )
    head_round_s = {
        key: measure_head_round_s(head, gamma, csi if head.d_csi else None, latency["repeats"])
        for key, head in heads.items()
    }
    source = "measured"
logging.info("head time per round (gamma=%d, %s): %s", gamma, source, head_round_s)
write_json(
    {"head_round_s": head_round_s, "head_time_source": source, "head_time_gamma": gamma},
    snakemake.output.times,
)
