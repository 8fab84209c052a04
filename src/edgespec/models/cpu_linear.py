"""CPU linear layers through oneDNN: float32 instead of MKL's GEMM, weights reordered once.

PyTorch computes a float32 ``F.linear`` on the CPU with a BLAS GEMM (MKL in the PyPI wheels)
and only bf16/fp16 products with oneDNN. oneDNN's inner product
(``torch.ops.mkldnn._linear_pointwise``, the kernel PyTorch's own compiler uses for CPU linear
layers) gives the same float32 results, rounding apart, faster at decoding shapes.

- bf16 products already go through oneDNN, but with the weight in its plain [out, in] layout,
  reordered into oneDNN's blocked layout on every call. Where the CPU has native bf16
  (``torch.ops.mkldnn._reorder_linear_weight`` refuses otherwise) bf16 weights are reordered
  once, at load, or mapped from a copy reordered once per machine (``stored``,
  ``edgespec.models.reordered``).
- float32 weights keep their layout in the workflow's jobs (reordering 8 GB at load costs a job
  more than it saves); :func:`reorder_all_weights` reorders them where a process loads a model
  once and decodes a few rows at a time (the engine benchmark, rule ``mine_labels``). They can
  also be stored transposed and multiplied by numpy's BLAS (:func:`transposed_weight`,
  ``edgespec.models.layout``), chosen per machine by rule ``select_dtype``.
- Sibling projections that read the same input (query/key/value, gate/up) are stacked into one
  reordered product where weights are reordered anyway (:func:`fuse_projections`); the model
  still calls ``q_proj(x)`` etc., each a :class:`ProjectionSlice` of one
  :class:`FusedProjections` layer. Same bits at 1 to 2400 rows.

GPUs and models that need gradients keep ``F.linear``. A reordered weight cannot move to
another device or dtype: :func:`plain_linear` gives the model its plain layers back first.
The measurements behind each choice (per CPU, shape and thread count) are in ``docs/speed.md``
("Linear layers through oneDNN", "float32 weights stored transposed", "Stacked projections").
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable

import torch


@functools.cache
def onednn_available() -> bool:
    """Whether this PyTorch build has oneDNN and its linear primitive (asked once: every
    routed layer's forward asks)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, through oneDNN for float32 CPU tensors without gradients
    and for a weight reordered by :func:`pack_weight`, through numpy's BLAS for a float32 weight
    stored transposed (:func:`transposed_weight`)."""
    if weight.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    if (
        x.dtype is torch.float32
        and x.device.type == "cpu"
        and weight.dtype is torch.float32
        and weight.device.type == "cpu"
        and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
    ):
        if is_transposed(weight):
            return _blas_linear(x, weight.t(), bias)
        if onednn_available():
            return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return torch.nn.functional.linear(x, weight, bias)


def is_transposed(weight: torch.Tensor) -> bool:
    """Whether a 2-D [out, in] ``weight`` is the transposed view of an [in, out] contiguous
    tensor (and not also contiguous itself, as a one-row or one-column weight is)."""
    return (
        weight.dim() == 2 and not weight.is_contiguous() and weight.stride() == (1, weight.shape[0])
    )


def transposed_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` ([out, in]) with the same values, stored transposed: the [out, in] view of an
    [in, out] contiguous copy, which :func:`linear` multiplies with numpy's BLAS."""
    return weight.detach().t().contiguous().t()


def _blas_linear(
    x: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x @ weight_t (+ bias) by numpy's BLAS, ``weight_t`` [in, out] contiguous (no copies of
    the weight: numpy reads the tensor's memory, the memory-mapped checkpoint's pages)."""
    import numpy as np

    rows = x.reshape(-1, x.shape[-1])
    if not rows.is_contiguous():
        rows = rows.contiguous()
    out = torch.from_numpy(np.matmul(rows.numpy(), weight_t.numpy()))
    if bias is not None:
        out.add_(bias)
    return out.view(*x.shape[:-1], weight_t.shape[1])


def set_blas_threads(threads: int) -> None:
    """Limit numpy's BLAS (and any other BLAS this process loaded) to ``threads`` threads, as
    ``torch.set_num_threads`` limits torch's: jobs run side by side, one thread each."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=int(threads), user_api="blas")


PACKED_DTYPES = (torch.bfloat16,)
"""dtypes whose linear weights are kept reordered for oneDNN (module docstring: float32 is not,
as reordering at load cost a workflow job more time than it saved)."""


@functools.cache
def packing_supported(dtype: torch.dtype) -> bool:
    """Whether weights of ``dtype`` are kept reordered on this CPU: a dtype of
    :data:`PACKED_DTYPES` that oneDNN can reorder here (bf16 needs native bf16 support)."""
    if dtype not in PACKED_DTYPES or not onednn_available():
        return False
    if not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        return False
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(8, 8, dtype=dtype), None)
    except RuntimeError:  # "bf16 path needs the cpu support avx_ne_convert or avx512bw, ..."
        return False
    return True


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` reordered once into oneDNN's blocked layout where :func:`packing_supported`
    says so (same [out, in] shape, read only by :func:`linear`), else ``weight`` itself."""
    if weight.device.type != "cpu" or not packing_supported(weight.dtype):
        return weight
    return reorder_weight(weight)


def reorder_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` reordered into oneDNN's blocked layout, whatever :data:`PACKED_DTYPES` says
    (for measuring a layout, as ``bench/bench_layout.py`` does; models use :func:`pack_weight`)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)


class OneDNNLinear(torch.nn.Linear):
    """``torch.nn.Linear`` whose CPU inference goes through :func:`linear`, its weight
    reordered where :func:`pack_weight` reorders it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)

    def __deepcopy__(self, memo):
        # A reordered tensor cannot be deep-copied (no memory format to preserve): copy the plain
        # weight and reorder the copy.
        clone = self.__class__.__new__(self.__class__)
        memo[id(self)] = clone
        for key, value in self.__dict__.items():
            if key == "_parameters":
                value = {
                    name: _reordered_parameter(p)
                    if p is not None and p.is_mkldnn
                    else copy.deepcopy(p, memo)
                    for name, p in value.items()
                }
            else:
                value = copy.deepcopy(value, memo)
            clone.__dict__[key] = value
        return clone


def _plain(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` in its plain layout (a reordered one read back, bit for bit)."""
    return weight.to_dense() if weight.is_mkldnn else weight


def _reordered_parameter(weight: torch.Tensor) -> torch.nn.Parameter:
    """A new inference-only parameter holding ``weight`` (plain or reordered) reordered."""
    return torch.nn.Parameter(pack_weight(_plain(weight)), requires_grad=False)


def use_onednn_linear(model: torch.nn.Module, stored=None) -> int:
    """Route every ``torch.nn.Linear`` of a float32 or bf16 CPU ``model`` through oneDNN, in
    place: float32 layers keep their parameters; bf16 ones, where :func:`packing_supported`,
    get their weights reordered (a tied output embedding gets its own reordered copy, the input
    embedding keeps the plain one). Other models, and bf16 ones where reordering is not
    supported (PyTorch already sends their products to oneDNN), are left as they are. Sibling
    projections whose weights are reordered are stacked into one product first
    (:func:`fuse_projections`). ``stored``: a ``edgespec.models.reordered.StoredWeights`` whose
    weights, reordered beforehand, are mapped instead of reordered here where it has them.
    Returns how many of the model's linear layers changed."""
    param = next(model.parameters(), None)
    if param is None or param.device.type != "cpu" or not onednn_available():
        return 0
    if param.dtype is not torch.float32 and not packing_supported(param.dtype):
        return 0
    changed = 0
    for module in model.modules():
        if type(module) is torch.nn.Linear:
            module.__class__ = OneDNNLinear
            changed += 1
    fuse_projections(model, packing_supported, stored)
    for name, module in model.named_modules():
        if type(module) is not OneDNNLinear or module.weight.is_mkldnn:
            continue
        if packing_supported(module.weight.dtype):
            module.weight = _reordered_or_stored(name, module.weight, stored)
    return changed


def _reordered_or_stored(name: str, weight: torch.Tensor, stored) -> torch.nn.Parameter:
    """Layer ``name``'s ``weight`` reordered: mapped from ``stored`` where it holds it, else
    reordered now (whatever :data:`PACKED_DTYPES` says; a ``RuntimeError`` where oneDNN cannot
    reorder the dtype here)."""
    if stored is not None:
        mapped = stored.take(name, weight.shape, weight.dtype, plain=lambda: _plain(weight))
        if mapped is not None:
            return torch.nn.Parameter(mapped, requires_grad=False)
    return torch.nn.Parameter(reorder_weight(_plain(weight)), requires_grad=False)


def reorder_all_weights(model: torch.nn.Module, stored=None) -> int:
    """Reorder the weight of every layer :func:`use_onednn_linear` routed, whatever
    :data:`PACKED_DTYPES` says (float32 too; bf16 only where the CPU can), in place, stack
    sibling projections (:func:`fuse_projections`), then give the remaining tensors their own
    memory (:func:`own_storage`). ``stored`` as for :func:`use_onednn_linear`. Returns how many
    layers' weights were reordered (stacked ones included)."""

    def plain_layers() -> int:
        return sum(type(m) is OneDNNLinear and not m.weight.is_mkldnn for m in model.modules())

    before = plain_layers()
    fuse_projections(
        model, lambda dtype: dtype is torch.float32 or packing_supported(dtype), stored
    )
    for name, module in model.named_modules():
        if type(module) is OneDNNLinear and not module.weight.is_mkldnn:
            try:
                module.weight = _reordered_or_stored(name, module.weight, stored)
            except RuntimeError:  # bf16 without native support
                continue
    reordered = before - plain_layers()
    if reordered:
        own_storage(model)
    return reordered


def own_storage(model: torch.nn.Module) -> None:
    """Give every plain parameter and buffer of ``model`` its own memory, in place (ties kept).

    A model loaded from safetensors holds views of the memory-mapped file; once its linear
    weights are reordered copies, the few tensors left (embeddings, norms, biases) would keep
    the whole mapping, and so the file's pages, resident beside them."""
    # By the original's id, so tied tensors stay tied; the original is held until the end so
    # that its id cannot be reused meanwhile.
    copies: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def private(tensor: torch.Tensor) -> torch.Tensor:
        if id(tensor) not in copies:
            clone = tensor.detach().clone()
            if isinstance(tensor, torch.nn.Parameter):
                clone = torch.nn.Parameter(clone, requires_grad=tensor.requires_grad)
            copies[id(tensor)] = (tensor, clone)
        return copies[id(tensor)][1]

    for module in model.modules():
        for tensors in (module._parameters, module._buffers):
            for name, tensor in list(tensors.items()):
                if tensor is not None and not tensor.is_mkldnn:
                    tensors[name] = private(tensor)


def plain_linear(model: torch.nn.Module) -> None:
    """Undo :func:`use_onednn_linear` (in place), reordered weights back in their plain layout
    (bit for bit): tools that map layers by their exact class, such as dynamic quantisation,
    and moves to another device or dtype see ``torch.nn.Linear`` (stacked sibling projections
    separate again)."""
    unfuse_projections(model)
    for module in model.modules():
        if type(module) is OneDNNLinear:
            if module.weight.is_mkldnn:
                module.weight = torch.nn.Parameter(module.weight.to_dense(), requires_grad=False)
            module.__class__ = torch.nn.Linear


def plain_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter of ``model`` by name (a tied one under each of its names), reordered
    weights in their plain layout and stacked siblings under their own names
    (:func:`fuse_projections`): the weights as stored, to inspect or compare."""
    stacked = {
        f"{name}.{kind}"
        for name, module in model.named_modules(remove_duplicate=False)
        if isinstance(module, FusedProjections)
        for kind in ("weight", "bias")
    }
    plain = {
        name: _plain(param)
        for name, param in model.named_parameters(remove_duplicate=False)
        if name not in stacked
    }
    return plain | member_parameters(model)


SIBLING_GROUPS: dict[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}
"""Stacked layer name -> the sibling layers it replaces (the names Llama-family models in
transformers give them; modules without all of a group's siblings keep them separate)."""


class _Stash:
    """The last stacked product, until every slice has taken its columns (never copied with
    the model: a copy starts empty)."""

    def __init__(self) -> None:
        self.input: torch.Tensor | None = None
        self.outputs: list[torch.Tensor | None] = []

    def __deepcopy__(self, memo) -> _Stash:
        return _Stash()


class FusedProjections(OneDNNLinear):
    """One linear layer whose output columns are several sibling layers' outputs, in order."""

    def __init__(
        self,
        members: tuple[str, ...],
        sizes: tuple[int, ...],
        in_features: int,
        bias: bool,
        dtype: torch.dtype,
    ):
        super().__init__(in_features, sum(sizes), bias=bias, device="meta", dtype=dtype)
        self.members = members
        self.sizes = sizes
        self.stash = _Stash()

    def part(self, x: torch.Tensor, index: int) -> torch.Tensor:
        """Member ``index``'s output for input ``x``, from the stacked product."""
        stash = self.stash
        if stash.input is not x or stash.outputs[index] is None:
            stash.input = x
            stash.outputs = list(self(x).split(self.sizes, dim=-1))
        out = stash.outputs[index]
        stash.outputs[index] = None
        if all(o is None for o in stash.outputs):
            stash.input, stash.outputs = None, []
        return out


class ProjectionSlice(torch.nn.Module):
    """Where a sibling layer was: its columns of a :class:`FusedProjections` layer."""

    def __init__(self, fused: FusedProjections, index: int):
        super().__init__()
        # Not a submodule: the stacked layer is registered once, on the parent.
        self.__dict__["fused"] = fused
        self.index = index
        self.in_features = fused.in_features
        self.out_features = fused.sizes[index]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fused.part(x, self.index)

    def extra_repr(self) -> str:
        return f"columns of {self.fused.members}: {self.fused.members[self.index]}"


def _can_stack(layers: list[torch.nn.Module], reorderable: Callable[[torch.dtype], bool]) -> bool:
    first = layers[0]
    dtype = first.weight.dtype
    return all(
        type(layer) is OneDNNLinear
        and layer.weight.device.type == "cpu"
        and layer.weight.dtype is dtype
        and layer.in_features == first.in_features
        and (layer.bias is None) == (first.bias is None)
        for layer in layers
    ) and (all(layer.weight.is_mkldnn for layer in layers) or reorderable(dtype))


def fuse_projections(
    model: torch.nn.Module,
    reorderable: Callable[[torch.dtype], bool] = packing_supported,
    stored=None,
) -> int:
    """Stack each group of :data:`SIBLING_GROUPS` whose layers all go through oneDNN (same input
    size, dtype, and all or none with a bias) into one :class:`FusedProjections` with a
    reordered weight, in place, where their weights are reordered already or ``reorderable``
    says their dtype will be (plain weights are never stacked: that would copy them for no
    layout gain). Returns how many groups were stacked; a model without such groups is
    unchanged. ``stored`` as for :func:`use_onednn_linear`: a stacked weight it holds (under
    the stacked layer's name) is mapped, not stacked and reordered here."""
    fused = 0
    for parent_name, parent in list(model.named_modules()):
        prefix = f"{parent_name}." if parent_name else ""
        children = dict(parent.named_children())
        for stacked_name, members in SIBLING_GROUPS.items():
            if stacked_name in children or not all(m in children for m in members):
                continue
            layers = [children[m] for m in members]
            if not _can_stack(layers, reorderable):
                continue
            first = layers[0]
            stacked = FusedProjections(
                members,
                tuple(layer.out_features for layer in layers),
                first.in_features,
                bias=first.bias is not None,
                dtype=first.weight.dtype,
            )

            def stacked_plain(layers=layers) -> torch.Tensor:
                return torch.cat([_plain(layer.weight).detach() for layer in layers])

            weight = None
            if stored is not None:
                weight = stored.take(
                    prefix + stacked_name,
                    (stacked.out_features, stacked.in_features),
                    first.weight.dtype,
                    plain=stacked_plain,
                )
            if weight is None:
                weight = reorder_weight(stacked_plain())
            stacked.weight = torch.nn.Parameter(weight, requires_grad=False)
            if first.bias is not None:
                stacked.bias = torch.nn.Parameter(
                    torch.cat([layer.bias.detach() for layer in layers]), requires_grad=False
                )
            parent.add_module(stacked_name, stacked)
            for index, member in enumerate(members):
                parent.add_module(member, ProjectionSlice(stacked, index))
            fused += 1
    return fused


def unfuse_projections(model: torch.nn.Module) -> int:
    """Undo :func:`fuse_projections`, in place: each sibling is a :class:`OneDNNLinear` again,
    its weight reordered alone (values bit for bit as before). Returns how many groups were
    split."""
    split = 0
    for parent in list(model.modules()):
        for stacked_name, stacked in list(parent.named_children()):
            if not isinstance(stacked, FusedProjections):
                continue
            weights = _plain(stacked.weight).split(stacked.sizes)
            biases = (
                stacked.bias.split(stacked.sizes)
                if stacked.bias is not None
                else [None] * len(stacked.sizes)
            )
            for member, weight, bias in zip(stacked.members, weights, biases, strict=True):
                layer = OneDNNLinear(
                    stacked.in_features,
                    weight.shape[0],
                    bias=bias is not None,
                    device="meta",
                    dtype=weight.dtype,
                )
                layer.weight = torch.nn.Parameter(reorder_weight(weight), requires_grad=False)
                if bias is not None:
                    layer.bias = torch.nn.Parameter(bias.clone(), requires_grad=False)
                parent.add_module(member, layer)
            delattr(parent, stacked_name)
            split += 1
    return split


def member_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The separate siblings' parameters by their names before :func:`fuse_projections`
    (``...q_proj.weight``, plain layout), read from each stacked layer's rows."""
    found = {}
    for name, stacked in model.named_modules(remove_duplicate=False):
        if not isinstance(stacked, FusedProjections):
            continue
        parent = name.rpartition(".")[0]
        prefix = f"{parent}." if parent else ""
        for kind in ("weight", "bias"):
            tensor = getattr(stacked, kind)
            if tensor is None:
                continue
            for member, part in zip(
                stacked.members, _plain(tensor).split(stacked.sizes), strict=True
            ):
                found[f"{prefix}{member}.{kind}"] = part
    return found
