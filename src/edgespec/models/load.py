"""Loading a cached draft/target pair, with the tokenizer check first (methods §7).

:func:`load_pair` checks that the two tokenizers agree (vocabulary, special tokens, encodings
of probe texts) before any weights load, so a mismatched pair fails in seconds with a message
naming the difference (:class:`TokenizerMismatchError`); then it loads both models and checks
their logits sizes. Models load from a local directory, a GGUF file, or a hub id (with a clear
error when the hub is unreachable). :func:`stop_token_ids` gives the ids that end a reply.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from edgespec.models.cast import ensure_cast
from edgespec.models.cpu_linear import packing_supported, plain_linear, use_onednn_linear
from edgespec.models.precision import quantized_roles, weights_dtype
from edgespec.models.presets import PROVENANCE_FILE, ModelPairError, TokenizerMismatchError
from edgespec.models.reordered import StoredWeightsError, stored_weights_for

_PROBE_TEXTS = (
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b  # 12345",
    "Ünïcödé — 数学 ✓",
)
SPECIAL_TOKEN_ATTRS = ("eos_token_id", "bos_token_id", "pad_token_id", "unk_token_id")

log = logging.getLogger("edgespec")


def resolve_torch_dtype(dtype: Any):
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    name = str(dtype).removeprefix("torch.")
    aliases = {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16", "float": "float32"}
    name = aliases.get(name, name)
    if name not in ("bfloat16", "float32", "float16", "float64"):
        raise ModelPairError(f"unsupported dtype {dtype!r}: use bfloat16, float32 or float16")
    return getattr(torch, name)


def canonical_dtype_name(dtype: Any) -> str:
    return str(resolve_torch_dtype(dtype)).removeprefix("torch.")


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the hub answers an HTTP(S) request sent the way downloads will be sent.

    A real request (HEAD of ``HF_ENDPOINT``) through ``urllib``, which takes ``HTTPS_PROXY``,
    ``HTTP_PROXY`` and ``NO_PROXY`` from the environment as ``huggingface_hub`` does; a raw TCP
    connection to the hub would call it unreachable behind a proxy where every download works.
    Any HTTP answer below 500 counts (a 401 or 404 is still the hub answering); no answer
    within ``timeout`` seconds, a refused proxy tunnel or a 5xx from a proxy does not.
    """
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return False
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/") + "/"
    # A fresh opener: urllib's module-level one keeps the proxies of the moment it was built.
    opener = urllib.request.build_opener()
    try:
        with opener.open(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout):
            return True
    except urllib.error.HTTPError as err:
        return err.code < 500
    except (OSError, ValueError):  # URLError, timeouts, TLS errors; ValueError: a bad URL
        return False


def _hub_unreachable_error(model_id: str, role: str, exc: BaseException | None) -> ModelPairError:
    why = f" ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})" if exc else ""
    return ModelPairError(
        f"cannot load {role} model {model_id!r}: it is not a local path and the Hugging Face hub "
        f"is unreachable (or the id is wrong / gated){why}. Download it where the hub is "
        "reachable (e.g. `huggingface-cli download <id> --local-dir DIR`) and pass the local "
        "directory or .gguf file instead, e.g. custom={'draft': {'id': '/path/to/draft'}, "
        "'target': {'id': '/path/to/target.gguf'}}"
    )


def from_pretrained_or_hub(loader, location: str, gguf_file: str | None, role: str, **kwargs):
    """``loader.from_pretrained`` for a local dir or a hub id, with a clear offline error."""
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    if Path(location).expanduser().exists():
        return loader.from_pretrained(str(Path(location).expanduser()), **kwargs)
    if location.startswith(("/", ".", "~")) or location.count("/") > 1:
        raise ModelPairError(f"{role} model path {location!r} does not exist")
    if _hub_reachable():
        try:
            return loader.from_pretrained(location, **kwargs)
        except (OSError, ValueError) as exc:
            raise ModelPairError(
                f"cannot load {role} model {location!r} from the Hugging Face hub "
                f"({type(exc).__name__}: {str(exc).splitlines()[0][:300]})"
            ) from exc
    try:  # maybe it is in the local HF cache already
        return loader.from_pretrained(location, local_files_only=True, **kwargs)
    except (OSError, ValueError) as exc:
        raise _hub_unreachable_error(location, role, exc) from exc


def split_location(path: str | Path, gguf_file: str | None = None) -> tuple[str, str | None]:
    p = Path(path).expanduser()
    if gguf_file is None and p.suffix == ".gguf" and p.is_file():
        return str(p.parent), p.name
    return str(path), gguf_file


def load_tokenizer(path: str | Path, gguf_file: str | None = None, role: str = "model"):
    """AutoTokenizer for a saved dir, a hub id, or a GGUF (``gguf_file=`` or a ``.gguf`` path)."""
    from transformers import AutoTokenizer

    location, gguf_file = split_location(path, gguf_file)
    return from_pretrained_or_hub(AutoTokenizer, location, gguf_file, role)


def _special_desc(tok, attr: str) -> str:
    tid = getattr(tok, attr, None)
    if tid is None:
        return "None"
    try:
        text = tok.convert_ids_to_tokens(int(tid))
    except Exception:  # noqa: BLE001 - only for the message
        text = "?"
    return f"{tid} ({text!r})"


def check_tokenizers_match(draft_tok, target_tok) -> None:
    """Raise :class:`TokenizerMismatchError` naming every difference found.

    Compared: vocabulary size, the token -> id map (first differing tokens are named), special
    token ids (eos, bos, pad, unk) and the encoding of a few probe strings.
    """
    problems: list[str] = []
    n_draft, n_target = len(draft_tok), len(target_tok)
    if n_draft != n_target:
        problems.append(f"vocabulary size differs: draft {n_draft} vs target {n_target}")
    v_draft, v_target = draft_tok.get_vocab(), target_tok.get_vocab()
    if v_draft != v_target:
        diffs = []
        for token in sorted(set(v_draft) | set(v_target), key=lambda t: (v_draft.get(t, -1), t)):
            a, b = v_draft.get(token), v_target.get(token)
            if a != b:
                diffs.append(f"{token!r}: draft id {a} vs target id {b}")
        shown = "; ".join(diffs[:5])
        more = f" (and {len(diffs) - 5} more)" if len(diffs) > 5 else ""
        problems.append(f"{len(diffs)} token/id pairs differ: {shown}{more}")
    for attr in SPECIAL_TOKEN_ATTRS:
        a, b = getattr(draft_tok, attr, None), getattr(target_tok, attr, None)
        if a != b:
            problems.append(
                f"{attr} differs: draft {_special_desc(draft_tok, attr)} vs "
                f"target {_special_desc(target_tok, attr)}"
            )
    if not problems:
        for text in _PROBE_TEXTS:
            a = draft_tok.encode(text, add_special_tokens=False)
            b = target_tok.encode(text, add_special_tokens=False)
            if a != b:
                problems.append(f"encoding of {text!r} differs: draft {a[:12]} vs target {b[:12]}")
                break
    if problems:
        raise TokenizerMismatchError(
            "draft and target tokenizers do not match: " + "; ".join(problems)
        )


_MODEL_FILE_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth", ".msgpack", ".h5")
_MODEL_FILE_NAMES = ("config.json", "generation_config.json", "model.safetensors.index.json")


def _tokenizer_files(folder: Path) -> dict[str, bytes] | None:
    """Every file of a saved model folder that is not a weight or model-config file (what a
    tokenizer may read), by name; None where ``folder`` is not a local folder."""
    if not folder.is_dir():
        return None
    return {
        path.name: path.read_bytes()
        for path in sorted(folder.iterdir())
        if path.is_file()
        and path.suffix not in _MODEL_FILE_SUFFIXES
        and path.name not in _MODEL_FILE_NAMES
    }


def same_tokenizer_files(draft_path: str | Path, target_path: str | Path) -> bool:
    """Whether two saved model folders hold byte-identical tokenizer files (then one tokenizer
    serves both, and comparing two loaded copies would only repeat a second of parsing)."""
    draft_files = _tokenizer_files(Path(draft_path))
    return bool(draft_files) and draft_files == _tokenizer_files(Path(target_path))


def logits_size(model) -> int:
    emb = model.get_output_embeddings()
    if emb is not None and getattr(emb, "weight", None) is not None:
        return int(emb.weight.shape[0])
    return int(model.config.get_text_config().vocab_size)


def load_model(path: str | Path, dtype: Any, role: str = "model", stored: bool = True):
    """One causal LM in ``dtype``, in eval mode; its linear layers on the CPU go through oneDNN
    (``edgespec.models.cpu_linear``: float32 ones as they are, bf16 ones with their weights
    reordered once where the CPU has native bf16). Reordered weights that rule select_dtype
    stored for this machine (``edgespec.models.reordered``) are mapped instead of reordered
    here, unless ``stored`` is False."""
    from transformers import AutoModelForCausalLM

    location, gguf_file = split_location(path)
    torch_dtype = resolve_torch_dtype(dtype)

    def fresh():
        model = from_pretrained_or_hub(
            AutoModelForCausalLM, location, gguf_file, role, dtype=torch_dtype
        )
        return model.eval()

    model = fresh()
    reordered_here = packing_supported(torch_dtype)  # as use_onednn_linear decides
    weights = None
    if stored and reordered_here and gguf_file is None and Path(location).is_dir():
        weights = stored_weights_for(Path(location))
    try:
        use_onednn_linear(model, weights)
    except StoredWeightsError as exc:
        log.warning("%s: not using its stored reordered weights (%s); reordering here", role, exc)
        model = fresh()
        use_onednn_linear(model)
    else:
        if weights is not None:
            log.info(
                "%s: %d reordered linear weights mapped from %s",
                role,
                len(weights.taken),
                weights.path,
            )
        elif stored and reordered_here:
            log.info(
                "%s: reordering its linear weights for oneDNN here (rule select_dtype stores "
                "them once per machine; none stored for this one)",
                role,
            )
    return model


def to_device(model, device: str):
    """``model`` moved to ``device``, its linear layers plain again first (a weight reordered for
    oneDNN cannot move; ``edgespec.models.cpu_linear``)."""
    if str(device) == "cpu":
        return model
    plain_linear(model)
    return model.to(device)


def load_pair(
    draft_path: str | Path,
    target_path: str | Path,
    dtype: Any = "bfloat16",
    threads: int | None = None,
    draft_dtype: Any = None,
):
    """Load a cached pair: tokenizers are checked first, then both models (``dtype``, or
    ``draft_dtype`` for the draft where given; eval; :func:`load_model`).

    Folders with byte-identical tokenizer files (a fetched pair sharing its tokenizer) load one
    tokenizer; otherwise both are loaded and compared (:func:`check_tokenizers_match`).

    Raises :class:`TokenizerMismatchError` / :class:`ModelPairError` when the tokenizers or the
    models' logits sizes differ. Returns ``(draft_model, target_model, target_tokenizer)``.
    """
    import torch

    if threads is not None:
        torch.set_num_threads(int(threads))
    target_tok = load_tokenizer(target_path, role="target")
    if not same_tokenizer_files(draft_path, target_path):
        check_tokenizers_match(load_tokenizer(draft_path, role="draft"), target_tok)
    draft = load_model(draft_path, dtype if draft_dtype is None else draft_dtype, "draft")
    target = load_model(target_path, dtype, "target")
    n_draft, n_target = logits_size(draft), logits_size(target)
    if n_draft != n_target:
        raise ModelPairError(
            f"draft and target logits sizes differ: draft {n_draft} vs target "
            f"{n_target} (output embeddings of {draft_path} and {target_path})"
        )
    if len(target_tok) > n_target:
        raise ModelPairError(
            f"tokenizer has {len(target_tok)} tokens but the models' logits only {n_target}"
        )
    return draft, target, target_tok


def pair_source(model_dir: str | Path, dtype: str) -> Path:
    """The folder to load the pair cached in ``model_dir`` from in ``dtype``: the cache itself
    where it holds that dtype, else its cast copy (``edgespec.models.cast``), written now if
    missing or stale. A cache without its provenance record is a :class:`ModelPairError`."""
    model_dir = Path(model_dir)
    if not (model_dir / PROVENANCE_FILE).is_file():
        raise ModelPairError(
            f"no complete model pair in {model_dir} ({PROVENANCE_FILE} is missing): the cache "
            "was removed or moved after fetch_models ran; fetch it again with "
            "`snakemake --forcerun fetch_models`"
        )
    stored = json.loads((model_dir / PROVENANCE_FILE).read_text()).get("dtype")
    if canonical_dtype_name(dtype) != stored:
        return ensure_cast(model_dir, canonical_dtype_name(dtype))
    return model_dir


def load_pair_from_dir(
    model_dir: str | Path, models: dict | None = None, threads: int | None = None
):
    """:func:`load_pair` on ``model_dir/draft`` and ``model_dir/target`` (a fetch_pair cache).

    ``models`` is the config ``models`` section; its ``dtype`` (default bfloat16),
    ``device`` (default cpu) and ``quantize`` (a model it quantises loads float32 weights, for
    the caller to quantise) are used. The cache holds the weights in the precision they were
    converted to (``provenance.json``'s ``dtype``), so one cache serves every requested dtype;
    another dtype is loaded from the cast copy beside the cache (``edgespec.models.cast``),
    written by the first load that asks for it.
    """
    model_dir = Path(model_dir)
    models = models or {}
    dtype = models.get("dtype") or "bfloat16"
    quantize = models.get("quantize") or "none"
    # A model int8-quantised after loading (models.quantize) loads float32 weights.
    draft_dtype = weights_dtype("draft", quantize, dtype)
    sources = {
        "draft": pair_source(model_dir, draft_dtype),
        "target": pair_source(model_dir, dtype),
    }
    draft, target, tokenizer = load_pair(
        sources["draft"] / "draft",
        sources["target"] / "target",
        dtype=dtype,
        threads=threads,
        draft_dtype=draft_dtype,
    )
    device = models.get("device") or "cpu"
    if models.get("linear_layout", "plain") == "transposed" and device == "cpu":
        if layout_fits_threads(models.get("linear_layout_threads"), threads):
            use_transposed_layout({"draft": draft, "target": target}, sources, quantize, threads)
    if device != "cpu":
        import torch

        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ModelPairError(f"config key 'models.device' is {device!r} but no GPU is visible")
        draft, target = to_device(draft, device), to_device(target, device)
    return draft, target, tokenizer


def layout_fits_threads(probed: int | None, threads: int | None) -> bool:
    """Whether the transposed layout, chosen by a probe at ``probed`` threads (None: not
    recorded), applies to a job running ``threads`` (None: torch's current count). The probe's
    verdict holds only at the thread count it timed: on the AVX2 EPYC numpy's BLAS won at one
    thread, while the two-thread profile jobs on transposed weights took about twice as long as
    on the stored ones, so a job at another count keeps the weights as stored."""
    import torch

    running = int(threads) if threads is not None else torch.get_num_threads()
    if probed is None or int(probed) == running:
        return True
    logging.getLogger("edgespec").info(
        "float32 linear weights kept as stored: the layout probe ran at %d threads, this job "
        "runs %d",
        int(probed),
        running,
    )
    return False


def use_transposed_layout(
    models: dict, sources: dict, quantize: str = "none", threads: int | None = None
) -> None:
    """Give each float32 model of ``models`` (role -> model, in place) the transposed linear
    weights of the pair it was loaded from (``sources``: role -> pair folder;
    ``edgespec.models.layout``), except the models ``quantize`` quantises, which need their
    weights as stored. numpy's BLAS gets ``threads`` threads, as torch does."""
    import torch

    from edgespec.models.cpu_linear import set_blas_threads
    from edgespec.models.layout import TRANSPOSED_FILE, ensure_transposed, use_transposed_weights

    set_blas_threads(threads if threads is not None else torch.get_num_threads())
    for role, model in models.items():
        if role in quantized_roles(quantize) or next(model.parameters()).dtype != torch.float32:
            continue
        layout_dir = ensure_transposed(sources[role])
        if layout_dir is not None:
            use_transposed_weights(model, layout_dir / role / TRANSPOSED_FILE)


_END_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<|end|>")


def stop_token_ids(tokenizer, model=None) -> list[int]:
    """Token ids that end a chat reply, sorted.

    The union of the tokenizer's eos, the model's ``generation_config`` / ``config`` eos (int
    or list) and the usual end-of-turn / end-of-text special tokens present in the added
    vocabulary (``<|im_end|>``, ``<|endoftext|>``, ``<|eot_id|>``, ...), so that e.g. a Qwen
    model converted from GGUF (whose generation config lists only ``<|im_end|>``) also stops at
    ``<|endoftext|>`` as the original Hugging Face generation config does.
    """
    ids: set[int] = set()

    def add(value) -> None:
        if value is None:
            return
        if isinstance(value, list | tuple | set):
            for v in value:
                add(v)
        else:
            ids.add(int(value))

    add(getattr(tokenizer, "eos_token_id", None))
    if model is not None:
        add(getattr(getattr(model, "generation_config", None), "eos_token_id", None))
        add(getattr(model.config, "eos_token_id", None))
    added = tokenizer.get_added_vocab() if hasattr(tokenizer, "get_added_vocab") else {}
    for token in _END_TOKENS:
        if token in added:
            add(added[token])
    return sorted(ids)
