"""Rule select_dtype (edgespec.models.precision): the dtype this machine decodes fastest in
(models.dtype: auto), or the configured one, with the measured reason."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import json
import logging
from pathlib import Path

import torch

from edgespec.artifacts import write_json
from edgespec.models.cpu_linear import set_blas_threads
from edgespec.models.layout import ensure_transposed
from edgespec.models.load import pair_source
from edgespec.models.precision import choose_dtype, choose_linear_layout
from edgespec.models.reordered import ensure_reordered, machine_id

params = snakemake.params
torch.set_num_threads(snakemake.threads)
# The target's shapes from its config in the model cache (which may be shared by several
# working directories; this directory's provenance record names the pair).
target_config = json.loads((Path(params.model_dir) / "target" / "config.json").read_text())
text_config = target_config.get("text_config", target_config)
# What both probes time: the target's MLP products at the decoding shapes.
shapes = {
    "hidden_size": text_config["hidden_size"],
    "intermediate_size": text_config["intermediate_size"],
    "batch_size": params.batch_size,
    "gamma": params.gamma,
    "quantize": params.quantize,
}
choice = choose_dtype(params.dtype, params.device, **shapes)
logging.info("decoding dtype %s: %s", choice.dtype, choice.reason)
# The pair in that dtype is written here, once, while this rule holds every core: the first job
# to load it would otherwise write it, and a rule that times the models could be that job.
source = pair_source(params.model_dir, choice.dtype)
# Where the model jobs reorder their weights for oneDNN as they load (bf16 on a CPU with native
# bf16), this machine's reordered weights are written once here, and each job maps them.
reordered = ensure_reordered(source, choice.dtype) if params.device == "cpu" else None
if reordered is not None:
    logging.info("reordered linear weights for this machine: %s", reordered)
probe_threads = torch.get_num_threads()
# The layout probe runs with the threads each model job gets (models.threads, read from the
# config rather than a param: a change of threads reruns no stage, and this probe only picks a
# kernel).
job_threads = int(snakemake.config["models"]["threads"])
torch.set_num_threads(job_threads)
set_blas_threads(job_threads)
layout = choose_linear_layout(choice.dtype, params.device, **shapes)
torch.set_num_threads(probe_threads)
set_blas_threads(probe_threads)
logging.info("float32 linear weights %s: %s", layout.layout, layout.reason)
if layout.layout == "transposed" and ensure_transposed(source) is None:
    layout.layout, layout.reason = "plain", layout.reason + "; the copy could not be written"
record = {
    **choice.to_dict(),
    "torch_threads": probe_threads,
    "linear_layout": {**layout.to_dict(), "threads": job_threads},
    "reordered_weights": {
        "machine": machine_id(),
        "folder": None if reordered is None else reordered.name,
    },
}
write_json(record, snakemake.output.precision)
