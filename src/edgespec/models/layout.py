"""A cached pair's float32 linear weights stored transposed, made once and then memory-mapped.

Where rule ``select_dtype`` finds float32 products faster through numpy's BLAS on transposed
weights than through oneDNN (``edgespec.models.precision.choose_linear_layout``), the model
jobs multiply by [in, out] contiguous copies of the linear weights
(``edgespec.models.cpu_linear.transposed_weight``). Transposing them as a job loads costs it
about 20 s on one thread for the default pair (8.2 GB), more than most decode jobs gain, so the
transposed weights are written once beside the float32 pair they come from,
``<pair>.linear-t/{draft,target}/linear_t.safetensors`` (one ``<module>.weight`` tensor per
``torch.nn.Linear``, [in, out]), and each job maps them (:func:`use_transposed_weights`): its
linear layers read that file's pages, shared by the jobs running side by side through the page
cache, and never the original's.

Like the dtype copies (``edgespec.models.cast``), a copy records the sha256 of the stored pair's
``provenance.json`` it was made from, is built in a temporary folder and renamed into place
under a lock, and a stale one is written again. Where the cache's folder is not writable the
models keep their weights as stored.
"""

from __future__ import annotations

import hashlib
import json
import logging
import struct
from pathlib import Path

from edgespec.models.cachedir import build_once, copy_is_current, give_usual_modes
from edgespec.models.presets import PROVENANCE_FILE

LAYOUT_RECORD = "layout.json"
TRANSPOSED_FILE = "linear_t.safetensors"
ROLES = ("draft", "target")

log = logging.getLogger("edgespec")


class LayoutError(RuntimeError):
    """A transposed-weights file that does not fit the model it is applied to."""


def transposed_dir_of(pair_dir: Path) -> Path:
    """Where the transposed linear weights of the float32 pair in ``pair_dir`` live."""
    pair_dir = Path(pair_dir)
    return pair_dir.parent / f"{pair_dir.name}.linear-t"


def provenance_digest(pair_dir: Path) -> str:
    """The sha256 of the provenance record of the stored pair ``pair_dir`` is, or comes from (a
    dtype copy names its source in ``cast.json``)."""
    pair_dir = Path(pair_dir)
    record = pair_dir / PROVENANCE_FILE
    if not record.is_file():
        from edgespec.models.cast import CAST_FILE

        source = json.loads((pair_dir / CAST_FILE).read_text())["source"]
        record = Path(source) / PROVENANCE_FILE
    return hashlib.sha256(record.read_bytes()).hexdigest()


def write_transposed(model, path: Path) -> int:
    """Write every float32 ``torch.nn.Linear`` weight of ``model`` transposed ([in, out]
    contiguous) to the safetensors file ``path``, under the module's parameter name. Returns how
    many weights were written.

    The file is written one tensor at a time (the format's header, then each tensor's bytes as
    it is transposed), so that at most one transposed weight is held in memory: building the
    whole dict for ``safetensors.torch.save_file``, which copies each tensor to bytes again,
    held the default target twice over (12.2 GB resident)."""
    import torch

    from edgespec.models.cpu_linear import FusedProjections, ProjectionSlice, plain_parameters

    weights = plain_parameters(model)  # stacked siblings under their own names
    keys = [
        f"{name}.weight"
        for name, module in model.named_modules()
        if isinstance(module, (torch.nn.Linear, ProjectionSlice))
        and not isinstance(module, FusedProjections)
        and weights[f"{name}.weight"].dtype is torch.float32
    ]
    header: dict = {"__metadata__": {"layout": "linear weights transposed, [in, out]"}}
    offset = 0
    for key in keys:
        out_features, in_features = weights[key].shape
        size = out_features * in_features * 4
        header[key] = {
            "dtype": "F32",
            "shape": [in_features, out_features],
            "data_offsets": [offset, offset + size],
        }
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # tensors start 8-byte aligned, as safetensors does
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(encoded)))
        fh.write(encoded)
        for key in keys:
            transposed = weights[key].detach().t().contiguous()
            fh.write(memoryview(transposed.numpy()).cast("B"))
            del transposed
    return len(keys)


def _write_pair(pair_dir: Path, build: Path, digest: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    for role in ROLES:
        (build / role).mkdir()
        model = AutoModelForCausalLM.from_pretrained(pair_dir / role, dtype=torch.float32)
        count = write_transposed(model, build / role / TRANSPOSED_FILE)
        log.info("%s: %d linear weights written transposed", role, count)
        del model
    record = {
        "source": str(Path(pair_dir).resolve()),
        "source_provenance_sha256": digest,
        "layout": "float32 linear weights, [in, out] contiguous",
    }
    (build / LAYOUT_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    give_usual_modes(build)


def ensure_transposed(pair_dir: Path) -> Path | None:
    """The folder of ``pair_dir``'s transposed linear weights (``pair_dir`` holds the pair in
    float32: the stored pair or its float32 copy), written now if missing or stale; None where
    it cannot be written."""
    pair_dir = Path(pair_dir)
    out_dir = transposed_dir_of(pair_dir)
    digest = provenance_digest(pair_dir)
    try:
        build_once(
            out_dir,
            lambda: copy_is_current(
                out_dir, LAYOUT_RECORD, digest, (f"{role}/{TRANSPOSED_FILE}" for role in ROLES)
            ),
            lambda build: _write_pair(pair_dir, build, digest),
            f"writing the float32 linear weights of {pair_dir} transposed to {out_dir} (once: "
            "later loads map them)",
            log.info,
        )
    except OSError as exc:
        log.warning(
            "could not write the transposed weights of %s beside it (%s); keeping the stored "
            "layout",
            pair_dir,
            exc,
        )
        return None
    return out_dir


def use_transposed_weights(model, path: Path) -> int:
    """Give every float32 ``torch.nn.Linear`` of ``model`` (in place) the weight stored
    transposed in the safetensors file ``path`` (:func:`write_transposed`), memory-mapped: its
    ``weight`` becomes the [out, in] view of the mapped [in, out] tensor, which
    ``edgespec.models.cpu_linear.linear`` multiplies with numpy's BLAS. Raises
    :class:`LayoutError` where the file lacks a layer or holds another shape. Returns how many
    layers changed."""
    import torch
    from safetensors import safe_open

    changed = 0
    with safe_open(str(path), framework="pt") as stored:
        keys = set(stored.keys())
        for name, module in model.named_modules():
            if not isinstance(module, torch.nn.Linear) or module.weight.dtype is not torch.float32:
                continue
            if module.weight.is_mkldnn:
                raise LayoutError(f"{name}: its weight is reordered for oneDNN; load it plain")
            key = f"{name}.weight"
            if key not in keys:
                raise LayoutError(f"{path} has no transposed weight for layer {name}")
            weight_t = stored.get_tensor(key)
            if weight_t.shape != module.weight.shape[::-1]:
                raise LayoutError(
                    f"{path}: {key} is {tuple(weight_t.shape)}, but the layer's weight is "
                    f"{tuple(module.weight.shape)} (expected it transposed)"
                )
            module.weight = torch.nn.Parameter(weight_t.t(), requires_grad=False)
            changed += 1
    return changed
