"""Linear weights reordered for oneDNN, stored once per machine and memory-mapped by every job.

Where bf16 is native, each model job reorders its linear weights into oneDNN's blocked layout as
it loads (``edgespec.models.cpu_linear``): decoding is faster, but the reorder costs a job
several seconds, almost all of it the kernel handing out fresh memory. On the 2-core Zen 5 EPYC
VM (one thread, the default pair in bf16), stacking and reordering the target took 4.1-5.3 s of
wall time, 3.3-4.5 s of it system time, for 1.0-1.2 million page faults; the draft 0.6 s. A
decode job of 16 prompts decodes in 10-20 s there, so loading plain weights instead made job
``decode_wisv topk_accept g4`` shorter in all (17.5 against 23.2 s) although it decoded slower
(12.3 against 9.6 s).

The reordered bytes do not depend on the job, only on the weights, the machine's instruction
set and the PyTorch build (its oneDNN). So rule ``select_dtype`` writes them once beside the
pair (:func:`ensure_reordered`): ``<pair>.onednn-<machine>/{draft,target}.bin``, each weight
page-aligned, with ``{draft,target}.json`` holding each weight's module name, shape, dtype,
offset and oneDNN memory descriptor (``torch.ops.mkldnn._get_mkldnn_serialized_md``). A job
maps the file read-only and wraps each weight's bytes as a oneDNN tensor without copying
(:class:`StoredWeights`, through ``aoti_torch_create_tensor_from_blob_v2``, the call PyTorch's
AOTInductor loads its own reordered constants with). The pages come from the page cache, shared
by the jobs running side by side, instead of each job's private copy. On that Zen 5 VM the
default pair's store is 3.8 GB and took 20 s to write; a ``load_pair`` took 2.9 s against
9.5-12 s reordering, with the same logits bit for bit, and job ``decode_wisv topk_accept g4``
took 14.1 s against 20.0-21.4 s (peak RSS 4.8 against 8.6 GB), ``vanilla_sd g8`` 21.5 s against
27.8 s, decoding as fast (runs interleaved, two of each).

``<machine>`` is a digest of everything the blocked layout depends on (:func:`machine_fingerprint`:
the PyTorch version and commit, its CPU capability, the CPU's vendor, family, model and flags,
and oneDNN's ISA cap), so machines of different kinds sharing one cache (a cluster) each get
their own copy, and a job whose machine has none reorders at load as before. A copy records the
provenance digest of the pair it came from, like the other copies (``edgespec.models.cast``,
``edgespec.models.layout``), and is built in a temporary folder and renamed into place under a
lock. Each load also reorders the first stored weight it takes afresh and compares the bytes and
descriptors (:class:`StoredWeights`): a copy that disagrees is not used.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import logging
import mmap
import os
import platform
from pathlib import Path
from typing import Any

from edgespec.models.cachedir import build_once, copy_is_current, give_usual_modes
from edgespec.models.layout import provenance_digest
from edgespec.models.precision import cpu_flags

STORE_RECORD = "reordered.json"
ROLES = ("draft", "target")
ALIGNMENT = 4096
"""Each weight starts on a page boundary of the file, so its mapped bytes are page-aligned too
(oneDNN asks for 64)."""

log = logging.getLogger("edgespec")


class StoredWeightsError(Exception):
    """Stored reordered weights that cannot be used here (another layout, another shape, a
    PyTorch build that cannot map them). Not a ``RuntimeError``, which is what oneDNN raises
    where it cannot reorder a dtype at all."""


def _cpu_identity(cpuinfo: str | Path = "/proc/cpuinfo") -> dict[str, Any]:
    """Vendor, family and model of the first processor the kernel lists, and its flags
    (:func:`edgespec.models.precision.cpu_flags`)."""
    wanted = {"vendor_id": "vendor", "cpu family": "family", "model": "model"}
    found: dict[str, Any] = {}
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        if not line.strip() and found:
            break
        key, _, value = line.partition(":")
        if key.strip() in wanted:
            found[wanted[key.strip()]] = value.strip()
    return {**found, "flags": sorted(cpu_flags(cpuinfo))}


def machine_fingerprint() -> dict[str, Any]:
    """What oneDNN's blocked layout of a weight depends on besides its shape and dtype."""
    import torch

    return {
        "torch": torch.__version__,
        "torch_commit": getattr(torch.version, "git_version", None),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "arch": platform.machine(),
        "cpu": _cpu_identity(),
        "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA")
        or os.environ.get("DNNL_MAX_CPU_ISA"),
    }


def machine_id(fingerprint: dict[str, Any] | None = None) -> str:
    """A short digest of :func:`machine_fingerprint`, to name this machine's copy."""
    fingerprint = machine_fingerprint() if fingerprint is None else fingerprint
    encoded = json.dumps(fingerprint, sort_keys=True).encode()
    return hashlib.sha256(encoded).hexdigest()[:16]


def reordered_dir_of(pair_dir: Path, machine: str | None = None) -> Path:
    """Where this machine's (or ``machine``'s) reordered weights of the pair in ``pair_dir``
    live: a sibling folder."""
    pair_dir = Path(pair_dir)
    return pair_dir.parent / f"{pair_dir.name}.onednn-{machine or machine_id()}"


@functools.cache
def _aoti():
    """The C functions that wrap memory as a oneDNN tensor, or a reason they are missing."""
    import torch

    steal = getattr(
        getattr(torch._C, "_aoti", None), "alloc_tensor_by_stealing_from_void_ptr", None
    )
    try:
        lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        create = lib.aoti_torch_create_tensor_from_blob_v2
        codes = {
            name: getattr(lib, f"aoti_torch_{name}")
            for name in (
                "dtype_bfloat16",
                "dtype_float32",
                "dtype_float16",
                "device_type_cpu",
                "layout__mkldnn",
            )
        }
    except (OSError, AttributeError) as exc:
        return f"this PyTorch build cannot wrap memory as a oneDNN tensor ({exc})"
    if steal is None or not torch.backends.mkldnn.is_available():
        return "this PyTorch build cannot wrap memory as a oneDNN tensor"
    create.restype = ctypes.c_int32
    create.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.POINTER(ctypes.c_int64),
        ctypes.POINTER(ctypes.c_int64),
        ctypes.c_int64,
        ctypes.c_int32,
        ctypes.c_int32,
        ctypes.c_int32,
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.c_int32,
        ctypes.POINTER(ctypes.c_uint8),
        ctypes.c_int64,
    ]
    for function in codes.values():
        function.restype = ctypes.c_int32
    values = {name: function() for name, function in codes.items()}
    capsule = ctypes.pythonapi.PyCapsule_New
    capsule.restype = ctypes.py_object
    capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return create, values, capsule, steal


def mapping_supported() -> str | None:
    """None where stored reordered weights can be mapped here, else why not."""
    found = _aoti()
    return found if isinstance(found, str) else None


def _wrap(address: int, shape: list[int], dtype_name: str, descriptor: bytes):
    """A oneDNN tensor of ``shape`` over the memory at ``address`` (not copied, not owned)."""
    found = _aoti()
    if isinstance(found, str):
        raise StoredWeightsError(found)
    create, codes, capsule, steal = found
    code = codes.get(f"dtype_{dtype_name}")
    if code is None:
        raise StoredWeightsError(f"no stored reordered weights in {dtype_name}")
    sizes = (ctypes.c_int64 * len(shape))(*shape)
    strides = (ctypes.c_int64 * len(shape))(*_contiguous_strides(shape))
    meta = (ctypes.c_uint8 * len(descriptor)).from_buffer_copy(descriptor)
    handle = ctypes.c_void_p()
    status = create(
        address,
        len(shape),
        sizes,
        strides,
        0,
        code,
        codes["device_type_cpu"],
        0,
        ctypes.byref(handle),
        codes["layout__mkldnn"],
        meta,
        len(descriptor),
    )
    if status != 0 or not handle.value:
        raise StoredWeightsError(f"PyTorch refused to wrap a stored weight (status {status})")
    return steal(capsule(handle.value, None, None))


def _contiguous_strides(shape: list[int]) -> list[int]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return strides[::-1]


def _tensor_bytes(weight) -> tuple[memoryview, bytes]:
    """A reordered weight's bytes (a view of its memory, valid while ``weight`` lives) and its
    oneDNN memory descriptor."""
    import torch

    nbytes = int(torch.ops.mkldnn._nbytes(weight))
    address = int(torch.ops.mkldnn.data_ptr(weight))
    data = memoryview((ctypes.c_char * nbytes).from_address(address)).cast("B")
    descriptor = bytes(torch.ops.mkldnn._get_mkldnn_serialized_md(weight).tolist())
    return data, descriptor


def reordered_layers(model) -> list[tuple[str, Any]]:
    """(name, module) of every oneDNN linear layer of ``model`` whose weight is reordered."""
    from edgespec.models.cpu_linear import OneDNNLinear

    return [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, OneDNNLinear) and module.weight.is_mkldnn
    ]


def write_reordered(model, folder: Path, role: str) -> int:
    """Write the reordered weight of every layer of ``model`` that has one to
    ``folder/<role>.bin`` (page-aligned) and its index ``folder/<role>.json``. Returns how many
    weights were written."""
    folder = Path(folder)
    entries: dict[str, dict[str, Any]] = {}
    offset = 0
    with open(folder / f"{role}.bin", "wb") as fh:
        for name, module in reordered_layers(model):
            weight = module.weight
            data, descriptor = _tensor_bytes(weight)
            padding = -offset % ALIGNMENT
            fh.write(b"\0" * padding)
            offset += padding
            fh.write(data)
            entries[name] = {
                "shape": list(weight.shape),
                "dtype": str(weight.dtype).removeprefix("torch."),
                "offset": offset,
                "nbytes": len(data),
                "descriptor": descriptor.hex(),
            }
            offset += len(data)
    index = {"machine": machine_fingerprint(), "weights": entries}
    (folder / f"{role}.json").write_text(json.dumps(index, indent=1) + "\n")
    return len(entries)


_MAPS: dict[tuple, tuple[Any, mmap.mmap, int]] = {}
"""Open maps of stored weights by (path, inode, size, mtime), kept for the process's life: the
tensors wrapping them do not own their memory, so a map is never closed under them."""


def _map(path: Path) -> tuple[mmap.mmap, int]:
    import numpy as np

    stat = path.stat()
    key = (str(path.resolve()), stat.st_ino, stat.st_size, stat.st_mtime_ns)
    if key not in _MAPS:
        fh = open(path, "rb")
        mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        address = np.frombuffer(mapped, dtype=np.uint8).ctypes.data
        _MAPS[key] = (fh, mapped, address)
    _, mapped, address = _MAPS[key]
    return mapped, address


class StoredWeights:
    """One model's stored reordered weights (:func:`write_reordered`), mapped: :meth:`take`
    gives a layer's weight as a oneDNN tensor over the file's pages.

    The first weight taken with its plain values is checked against a fresh reorder of those
    values (same descriptor, same bytes); :class:`StoredWeightsError` where it differs."""

    def __init__(self, bin_path: Path, index: dict[str, Any]):
        self.path = Path(bin_path)
        self.entries: dict[str, dict[str, Any]] = index["weights"]
        self.taken: set[str] = set()
        self.checked = False
        mapped, self.address = _map(self.path)
        end = max((e["offset"] + e["nbytes"] for e in self.entries.values()), default=0)
        if end > len(mapped):
            raise StoredWeightsError(f"{self.path} is shorter than its index says ({end} bytes)")

    def take(self, name: str, shape, dtype, plain=None):
        """Layer ``name``'s stored weight (``shape``, ``dtype``), or None where none is stored.
        ``plain``: a function giving the layer's plain weight, to check the first one taken."""
        entry = self.entries.get(name)
        if entry is None:
            return None
        dtype_name = str(dtype).removeprefix("torch.")
        if list(shape) != entry["shape"] or dtype_name != entry["dtype"]:
            raise StoredWeightsError(
                f"{self.path}: {name} is stored as {entry['dtype']} {entry['shape']}, but the "
                f"layer is {dtype_name} {list(shape)}"
            )
        descriptor = bytes.fromhex(entry["descriptor"])
        weight = _wrap(self.address + entry["offset"], entry["shape"], dtype_name, descriptor)
        if not self.checked and plain is not None:
            self._check(name, weight, descriptor, plain())
        self.taken.add(name)
        return weight

    def _check(self, name: str, weight, descriptor: bytes, plain) -> None:
        from edgespec.models.cpu_linear import reorder_weight

        fresh = reorder_weight(plain)  # held: the view below does not keep it alive
        fresh_data, fresh_descriptor = _tensor_bytes(fresh)
        stored_data, _ = _tensor_bytes(weight)
        if fresh_descriptor != descriptor or fresh_data != stored_data:
            what = "layout" if fresh_descriptor != descriptor else "values"
            raise StoredWeightsError(
                f"{self.path}: {name} differs from the layer's weight reordered here ({what})"
            )
        self.checked = True

    def untaken(self) -> list[str]:
        return sorted(set(self.entries) - self.taken)


def stored_weights_for(model_path: Path) -> StoredWeights | None:
    """This machine's stored reordered weights of the model in ``model_path``
    (``<pair>/<role>``), or None where there are none for its pair and machine."""
    model_path = Path(model_path)
    pair_dir, role = model_path.parent, model_path.name
    fingerprint = machine_fingerprint()
    out_dir = reordered_dir_of(pair_dir, machine_id(fingerprint))
    files = (f"{role}.bin", f"{role}.json")
    try:
        current = copy_is_current(out_dir, STORE_RECORD, provenance_digest(pair_dir), files)
    except (OSError, ValueError, KeyError):
        return None
    if not current:
        return None
    reason = mapping_supported()
    if reason is not None:
        log.info("not using the stored reordered weights in %s: %s", out_dir, reason)
        return None
    index = json.loads((out_dir / f"{role}.json").read_text())
    if index.get("machine") != fingerprint:
        return None
    return StoredWeights(out_dir / f"{role}.bin", index)


def _write_pair(pair_dir: Path, build: Path, dtype_name: str, digest: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from edgespec.models.cpu_linear import use_onednn_linear

    counts = {}
    for role in ROLES:
        model = AutoModelForCausalLM.from_pretrained(
            pair_dir / role, dtype=getattr(torch, dtype_name)
        )
        model.eval()
        use_onednn_linear(model)
        counts[role] = write_reordered(model, build, role)
        del model
    record = {
        "source": str(Path(pair_dir).resolve()),
        "source_provenance_sha256": digest,
        "dtype": dtype_name,
        "machine": machine_fingerprint(),
        "weights": counts,
    }
    (build / STORE_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    give_usual_modes(build)


def ensure_reordered(pair_dir: Path, dtype_name: str) -> Path | None:
    """The folder of this machine's reordered weights of the pair in ``pair_dir`` (stored in
    ``dtype_name``), written now if missing or stale; None where they cannot be written or
    mapped here, or the models' weights are not reordered in this dtype on this machine."""
    import torch

    from edgespec.models.cpu_linear import packing_supported

    pair_dir = Path(pair_dir)
    if not packing_supported(getattr(torch, dtype_name)):
        return None
    reason = mapping_supported()
    if reason is not None:
        log.info("reordering the weights in each job: %s", reason)
        return None
    out_dir = reordered_dir_of(pair_dir)
    digest = provenance_digest(pair_dir)
    files = [f"{role}.{suffix}" for role in ROLES for suffix in ("bin", "json")]
    try:
        build_once(
            out_dir,
            lambda: copy_is_current(out_dir, STORE_RECORD, digest, files),
            lambda build: _write_pair(pair_dir, build, dtype_name, digest),
            f"writing the linear weights of {pair_dir} reordered for this machine's oneDNN to "
            f"{out_dir} (once: later loads map them)",
            log.info,
        )
    except OSError as exc:
        log.warning(
            "could not write the reordered weights of %s beside it (%s); each job reorders "
            "them as it loads",
            pair_dir,
            exc,
        )
        return None
    return out_dir
