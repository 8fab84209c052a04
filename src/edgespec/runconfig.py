"""Objects that several workflow stages build the same way from the validated config."""

from __future__ import annotations

from collections.abc import Sequence

from edgespec.data.chat import chat_token_ids
from edgespec.data.records import PromptRecord, read_jsonl
from edgespec.decoding.engine import DecodingConfig
from edgespec.models.load import stop_token_ids


def decoding_config(
    decoding: dict, tokenizer, target, keep_hidden: bool = False, temperature: float | None = None
) -> DecodingConfig:
    """The engine's settings from config key ``decoding`` and the pair's special tokens."""
    return DecodingConfig(
        max_new_tokens=decoding["max_new_tokens"],
        temperature=decoding["temperature"] if temperature is None else temperature,
        eos_token_ids=stop_token_ids(tokenizer, target),
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0,
        batch_size=decoding["batch_size"],
        keep_hidden=keep_hidden,
    )


def prompt_split(paths: Sequence[str], split: str) -> list[PromptRecord]:
    """The records of one split ("calib" or "eval") from prepared dataset files, in order."""
    return [r for path in paths for r in read_jsonl(path) if r.split == split]


def chat_prompts(tokenizer, records: Sequence[PromptRecord], prompting: dict) -> list[list[int]]:
    """Chat-templated token ids; the system message is the record's task's, if configured
    (``task_system_prompts``), else ``system_prompt`` (None: the template's default)."""
    by_task = prompting.get("task_system_prompts") or {}
    default = prompting.get("system_prompt")
    return [chat_token_ids(tokenizer, r.prompt, by_task.get(r.task, default)) for r in records]


def write_completions(path, records: Sequence[PromptRecord], completions, tokenizer) -> None:
    """One JSON line per prompt: its id, decoded text and new token ids (written atomically)."""
    import json

    from edgespec.artifacts import atomic_path

    with atomic_path(path) as tmp, open(tmp, "w") as fh:
        for record, ids in zip(records, completions, strict=True):
            text = tokenizer.decode(ids, skip_special_tokens=True)
            fh.write(json.dumps({"prompt_id": record.id, "text": text, "tokens": ids}) + "\n")


def completion_texts(path, records: Sequence[PromptRecord]) -> list[str]:
    """The decoded texts of a completions file, in the order of ``records``."""
    import json

    with open(path) as fh:
        by_id = {row["prompt_id"]: row["text"] for row in map(json.loads, fh)}
    return [by_id[r.id] for r in records]
