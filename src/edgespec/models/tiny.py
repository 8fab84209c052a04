"""Tiny randomly initialised models and a tiny tokenizer, built from a config offline.

They exercise every code path (unit tests, the smoke workflow) in seconds; their text is
meaningless by design.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def build_tiny_model(
    vocab_size: int,
    seed: int,
    dtype: torch.dtype = torch.float32,
    num_layers: int = 2,
    hidden_size: int = 32,
    perturb: float = 0.0,
    perturb_seed: int = 0,
    eos_token_id: int | None = None,
) -> Qwen2ForCausalLM:
    """A Qwen2-architecture causal LM with random weights drawn from ``seed``.

    ``initializer_range`` is large so that next-token distributions are peaked enough for
    greedy decoding to be meaningful. ``perturb`` > 0 adds Gaussian noise of that relative
    size to every weight (a draft that agrees with the unperturbed model part of the time).
    """
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=0.3,
        tie_word_embeddings=True,
        eos_token_id=eos_token_id,
        bos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(dtype).eval()
    if perturb > 0:
        noise = torch.Generator().manual_seed(perturb_seed)
        with torch.no_grad():
            for param in model.parameters():
                scale = param.detach().std() if param.numel() > 1 else param.detach().abs()
                param.add_(
                    perturb * scale * torch.randn(param.shape, generator=noise, dtype=param.dtype)
                )
    return model


def build_tiny_tokenizer(corpus: list[str], vocab_size: int = 384) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on ``corpus``, with ChatML specials and template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHATML_TEMPLATE,
    )


def write_tiny_pair(
    out_dir: Path, corpus: list[str], seed: int, draft_perturb: float = 0.6
) -> tuple[Path, Path]:
    """Save a tiny target and a perturbed-copy draft sharing one tokenizer; returns both dirs."""
    tokenizer = build_tiny_tokenizer(corpus)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    vocab = len(tokenizer)
    paths = []
    for role, perturb in (("draft", draft_perturb), ("target", 0.0)):
        model = build_tiny_model(
            vocab, seed=seed, perturb=perturb, perturb_seed=seed + 1, eos_token_id=eos
        )
        path = Path(out_dir) / role
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        paths.append(path)
    return paths[0], paths[1]
