"""Objects that several workflow stages build the same way from the validated config.

torch and transformers are imported inside the functions that need them, so that the
evaluation stages, which only read prompts and completions, stay torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence

from edgespec.data.chat import chat_token_ids
from edgespec.data.records import PromptRecord, read_jsonl


def decoding_config(
    decoding: dict, tokenizer, target, keep_hidden: bool = False, temperature: float | None = None
):
    """The engine's ``DecodingConfig`` from config key ``decoding`` and the pair's special
    tokens."""
    from edgespec.decoding.config import DecodingConfig
    from edgespec.models.load import stop_token_ids

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
    return completion_texts_and_lengths(path, records)[0]


def completion_texts_and_lengths(
    path, records: Sequence[PromptRecord]
) -> tuple[list[str], list[int]]:
    """The decoded texts of a completions file and their new-token counts, in the order of
    ``records``."""
    import json

    with open(path) as fh:
        by_id = {row["prompt_id"]: row for row in map(json.loads, fh)}
    rows = [by_id[r.id] for r in records]
    return [row["text"] for row in rows], [len(row["tokens"]) for row in rows]


def model_settings(models: dict, precision_path) -> dict:
    """The ``models`` settings with the dtype the run decodes in (rule ``select_dtype``)."""
    import logging

    from edgespec.artifacts import read_json

    precision = read_json(precision_path)
    log = logging.getLogger("edgespec")
    log.info("decoding in %s: %s", precision["dtype"], precision["reason"])
    # Records written before the layout was chosen have no entry: weights as stored.
    layout = precision.get("linear_layout") or {"layout": "plain", "reason": "not recorded"}
    if precision["dtype"] == "float32":
        log.info("float32 linear weights %s: %s", layout["layout"], layout["reason"])
    return {
        **models,
        "dtype": precision["dtype"],
        "linear_layout": layout["layout"],
        "linear_layout_threads": layout.get("threads"),
    }


def load_models(params, inputs, threads, linear_layout: str | None = None):
    """(draft, target, tokenizer) of a model stage: the cached pair in the run's dtype and
    linear-weight layout (or ``linear_layout`` where given), int8 dynamic-quantised where
    ``models.quantize`` asks for it."""
    from edgespec.models.load import load_pair_from_dir
    from edgespec.models.precision import quantize_for_role

    models = model_settings(params.models, inputs.precision)
    if linear_layout is not None:
        models["linear_layout"] = linear_layout
    draft, target, tokenizer = load_pair_from_dir(params.model_dir, models, threads)
    mode = models.get("quantize", "none")
    return (
        quantize_for_role(draft, "draft", mode),
        quantize_for_role(target, "target", mode),
        tokenizer,
    )


def decode_progress(label: str, num_prompts: int, max_new_tokens: int):
    """A progress bar over the tokens of ``num_prompts`` prompts, with tokens/s, on stderr."""
    from edgespec.decoding.progress import DecodeProgress

    return DecodeProgress(label, num_prompts * max_new_tokens, num_prompts)
