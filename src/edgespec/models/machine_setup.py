"""This machine's decoding precision for a run (rule ``select_dtype``): the dtype
(:func:`edgespec.models.precision.choose_dtype`), the pair's copies that dtype needs written
once while the rule holds every core (the cast copy, this machine's reordered weights), and,
in float32, the layout of the linear weights (:func:`edgespec.models.precision.
choose_linear_layout`, probed with the threads each model job gets). The record it returns is
``results/machine/precision.json``, which every model stage reads
(:func:`edgespec.runconfig.model_settings`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from edgespec.models.cpu_linear import set_blas_threads
from edgespec.models.layout import ensure_transposed
from edgespec.models.load import pair_source
from edgespec.models.precision import choose_dtype, choose_linear_layout
from edgespec.models.presets import ModelPairError
from edgespec.models.reordered import ensure_reordered, machine_id

log = logging.getLogger(__name__)


def target_mlp_shape(model_dir: str | Path) -> dict[str, int]:
    """``hidden_size`` and ``intermediate_size`` of the target in the model cache
    ``model_dir`` (its ``target/config.json``; a multimodal config's ``text_config``)."""
    path = Path(model_dir) / "target" / "config.json"
    if not path.is_file():
        raise ModelPairError(
            f"no target config at {path}: the model cache is incomplete; fetch it again with "
            "`snakemake --forcerun fetch_models`"
        )
    config = json.loads(path.read_text())
    text = config.get("text_config", config)
    missing = [k for k in ("hidden_size", "intermediate_size") if k not in text]
    if missing:
        raise ModelPairError(f"{path} has no {', '.join(missing)}")
    return {"hidden_size": text["hidden_size"], "intermediate_size": text["intermediate_size"]}


def select_precision(
    model_dir: str | Path,
    dtype: str,
    device: str,
    quantize: str,
    batch_size: int,
    gamma: int,
    job_threads: int,
) -> dict:
    """The precision record of the pair cached in ``model_dir`` (module docstring):
    ``models.dtype`` ``dtype`` (auto: the faster here), ``models.device``, ``models.quantize``,
    the decoding shapes (``batch_size`` rows x 1 and x ``gamma`` + 1 tokens) both probes time,
    and ``job_threads`` (``models.threads``) for the layout probe. The dtype probe runs with
    the threads torch has now, recorded as ``torch_threads``."""
    shapes = {
        **target_mlp_shape(model_dir),
        "batch_size": batch_size,
        "gamma": gamma,
        "quantize": quantize,
    }
    choice = choose_dtype(dtype, device, **shapes)
    log.info("decoding dtype %s: %s", choice.dtype, choice.reason)
    # Written here, once, while this rule holds every core: the first job to load the pair in
    # that dtype would otherwise write it, and a rule that times the models could be that job.
    source = pair_source(model_dir, choice.dtype)
    # Where the model jobs reorder their weights for oneDNN as they load (bf16 on a CPU with
    # native bf16), this machine's reordered weights are written once here, each job maps them.
    reordered = ensure_reordered(source, choice.dtype) if device == "cpu" else None
    if reordered is not None:
        log.info("reordered linear weights for this machine: %s", reordered)
    probe_threads = torch.get_num_threads()
    torch.set_num_threads(job_threads)
    set_blas_threads(job_threads)
    try:
        layout = choose_linear_layout(choice.dtype, device, **shapes)
    finally:
        torch.set_num_threads(probe_threads)
        set_blas_threads(probe_threads)
    log.info("float32 linear weights %s: %s", layout.layout, layout.reason)
    if layout.layout == "transposed" and ensure_transposed(source) is None:
        layout.layout, layout.reason = "plain", layout.reason + "; the copy could not be written"
    return {
        **choice.to_dict(),
        "torch_threads": probe_threads,
        "linear_layout": {**layout.to_dict(), "threads": job_threads},
        "reordered_weights": {
            "machine": machine_id(),
            "folder": None if reordered is None else reordered.name,
        },
    }
