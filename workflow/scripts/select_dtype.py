"""Rule select_dtype (edgespec.models.machine_setup): the dtype this machine decodes fastest in
(models.dtype: auto), or the configured one, with the measured reason; the pair's copies it
needs and the float32 linear-weight layout."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import torch

from edgespec.artifacts import write_json
from edgespec.models.machine_setup import select_precision

params = snakemake.params
torch.set_num_threads(snakemake.threads)
record = select_precision(
    params.model_dir,
    params.dtype,
    params.device,
    params.quantize,
    params.batch_size,
    params.gamma,
    # The layout probe runs with the threads each model job gets (models.threads, read from the
    # config rather than a param: a change of threads reruns no stage, and this probe only picks
    # a kernel).
    job_threads=int(snakemake.config["models"]["threads"]),
)
write_json(record, snakemake.output.precision)
