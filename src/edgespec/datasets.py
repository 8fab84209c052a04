"""Prompt datasets in one JSONL schema: embedded sets, local files and hub adapters.

Every record has ``id`` (str, unique within a dataset), ``prompt`` (non-empty str),
``reference`` (str or null: a reference answer text), ``gold_answer`` (str or null: a final
answer that can be checked exactly), ``task`` (one of :data:`TASKS`) and ``source`` (the dataset
name). The prepare step adds ``split`` ("calib" or "eval"), see :func:`assign_splits`.

Sources (:func:`load_records`):

- ``"instructions"``: ``data/instructions.jsonl``, instruction prompts written for this project,
  each with a short reference answer.
- ``"arithmetic"``: grade-school word problems generated from a seeded RNG
  (:func:`generate_arithmetic`), each with a gold number and a worked solution.
- ``"jsonl"``: the user's own file in this schema (``path=``).
- :data:`HUB_DATASETS`: GSM8K, Alpaca, Dolly-15k, StrategyQA, CREAK and QED through
  ``datasets.load_dataset`` when a hub is reachable; without one a :class:`DatasetError` says
  how to give the same data as a local JSONL file instead.

Answer checking (:func:`answers_match`) is exact match after normalisation: numbers by value
(the last number of the output, GSM8K ``#### N`` aware), yes/no by the first yes/no word, other
short answers by normalised whole-word containment.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import numpy as np

TASKS = ("arithmetic", "instruction", "qa", "yesno")
SPLITS = ("calib", "eval")
EMBEDDED = ("instructions", "arithmetic")
REQUIRED_FIELDS = ("id", "prompt", "task", "source")
NULLABLE_FIELDS = ("reference", "gold_answer", "split")  # may be absent (read as null)
ALL_FIELDS = REQUIRED_FIELDS[:2] + ("reference", "gold_answer") + REQUIRED_FIELDS[2:] + ("split",)

DEFAULT_DATA_DIR = Path(__file__).resolve().parents[2] / "data"
INSTRUCTIONS_FILE = "instructions.jsonl"


class DatasetError(ValueError):
    """A dataset cannot be loaded or a record is invalid; the message says where and why."""


@dataclass(frozen=True)
class PromptRecord:
    id: str
    prompt: str
    reference: str | None
    gold_answer: str | None
    task: str
    source: str
    split: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in ALL_FIELDS}


# --------------------------------------------------------------------------------------------
# Validation and JSONL I/O
# --------------------------------------------------------------------------------------------

_NUMBER_GOLD = re.compile(r"^-?\d+(\.\d+)?$")


def validate_record(obj: Any, where: str) -> PromptRecord:
    """Check one decoded JSON object against the schema; ``where`` prefixes every error."""
    if not isinstance(obj, Mapping):
        raise DatasetError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - set(ALL_FIELDS))
    if unknown:
        raise DatasetError(
            f"{where}: unknown field(s) {', '.join(repr(u) for u in unknown)}; "
            f"allowed fields are {', '.join(ALL_FIELDS)}"
        )
    for field in REQUIRED_FIELDS:
        if field not in obj:
            raise DatasetError(f"{where}: missing required field '{field}'")
        value = obj[field]
        if not isinstance(value, str) or not value.strip():
            raise DatasetError(
                f"{where}: field '{field}' must be a non-empty string, got {value!r}"
            )
    for field in NULLABLE_FIELDS:
        value = obj.get(field)
        if value is not None and not isinstance(value, str):
            raise DatasetError(
                f"{where}: field '{field}' must be a string or null, got {type(value).__name__}"
            )
    task = obj["task"]
    if task not in TASKS:
        raise DatasetError(f"{where}: field 'task' must be one of {', '.join(TASKS)}, got {task!r}")
    split = obj.get("split")
    if split is not None and split not in SPLITS:
        raise DatasetError(
            f"{where}: field 'split' must be one of {', '.join(SPLITS)} or null, got {split!r}"
        )
    gold = obj.get("gold_answer")
    if gold is not None:
        if not gold.strip():
            raise DatasetError(f"{where}: field 'gold_answer' must be null or a non-empty string")
        if task == "arithmetic" and not _NUMBER_GOLD.match(gold.strip()):
            raise DatasetError(
                f"{where}: field 'gold_answer' of an arithmetic record must be a plain number "
                f"such as '42' or '-3.5', got {gold!r}"
            )
        if task == "yesno" and gold.strip().lower() not in ("yes", "no"):
            raise DatasetError(
                f"{where}: field 'gold_answer' of a yesno record must be 'yes' or 'no', "
                f"got {gold!r}"
            )
    return PromptRecord(
        id=obj["id"],
        prompt=obj["prompt"],
        reference=obj.get("reference"),
        gold_answer=gold,
        task=task,
        source=obj["source"],
        split=split,
    )


def read_jsonl(path: str | os.PathLike, dataset: str | None = None) -> list[PromptRecord]:
    """Read and validate a JSONL file in the schema; blank lines are skipped.

    Errors name the dataset (when given), the file, the 1-based line number and the field.
    """
    path = Path(path)
    label = f"dataset '{dataset}', " if dataset else ""
    if not path.is_file():
        raise DatasetError(f"{label}file not found: {path}")
    records: list[PromptRecord] = []
    seen: dict[str, int] = {}
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{label}{path}, line {lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise DatasetError(f"{where}: invalid JSON ({err.msg})") from err
            record = validate_record(obj, where)
            if record.id in seen:
                raise DatasetError(
                    f"{where}: field 'id' value {record.id!r} repeats the id on line "
                    f"{seen[record.id]}; ids must be unique within a dataset"
                )
            seen[record.id] = lineno
            records.append(record)
    return records


def write_jsonl(records: Iterable[PromptRecord], path: str | os.PathLike) -> None:
    """Write records as JSONL atomically (a temp file in the same folder, then os.replace)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            for record in records:
                fh.write(json.dumps(record.to_dict(), ensure_ascii=False) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


# --------------------------------------------------------------------------------------------
# Answers
# --------------------------------------------------------------------------------------------

# A number not glued to a preceding word or digit: "x-2" and "3-4" give 2 and 4, not -2, -4.
_NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|(?<![\w.])-?\.\d+")


def normalize_number(token: str) -> str | None:
    """'1,234' -> '1234', '3.50' -> '3.5', '5.0' -> '5', '-0' -> '0', '.5' -> '0.5'."""
    token = token.strip().replace(",", "").lstrip("$")
    try:
        value = Decimal(token)
    except InvalidOperation:
        return None
    if not value.is_finite():
        return None
    if value == value.to_integral_value():
        return str(int(value))
    text = format(value.normalize(), "f")
    return "0" if text in ("-0", "0") else text


def extract_final_number(text: str) -> str | None:
    """The last number in ``text``, normalised; after a GSM8K ``####`` marker when present."""
    if text is None:
        return None
    if "####" in text:
        tail = text.rsplit("####", 1)[1]
        found = _NUMBER.findall(tail)
        if found:
            return normalize_number(found[0])
    found = _NUMBER.findall(text)
    if not found:
        return None
    return normalize_number(found[-1])


_YESNO_WORD = re.compile(r"\b(yes|no|true|false)\b", re.IGNORECASE)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = re.compile(r"[^\w\s]")


def _normalize_text(text: str) -> str:
    text = _PUNCT.sub(" ", text.lower())
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def extract_yes_no(text: str) -> str | None:
    """The first yes/no (or true/false) word of ``text`` as 'yes' or 'no'."""
    match = _YESNO_WORD.search(text or "")
    if match is None:
        return None
    return "yes" if match.group(1).lower() in ("yes", "true") else "no"


def answers_match(pred_text: str, gold: str) -> bool:
    """Exact match of a model output against a gold answer, after normalisation.

    - numeric gold: the last number of the output (``#### N`` aware) equals it by value;
    - gold 'yes'/'no'/'true'/'false': the first yes/no/true/false word of the output agrees;
    - any other gold: the normalised gold (lower case, no punctuation or articles) occurs in the
      normalised output as whole words.
    """
    if gold is None or pred_text is None:
        return False
    gold = gold.strip()
    gold_number = normalize_number(gold) if _NUMBER_GOLD.match(gold.replace(",", "")) else None
    if gold_number is not None:
        pred_number = extract_final_number(pred_text)
        return pred_number is not None and Decimal(pred_number) == Decimal(gold_number)
    if gold.lower() in ("yes", "no", "true", "false"):
        return extract_yes_no(pred_text) == extract_yes_no(gold)
    gold_norm = _normalize_text(gold)
    if not gold_norm:
        return False
    return f" {gold_norm} " in f" {_normalize_text(pred_text)} "


# --------------------------------------------------------------------------------------------
# Generated arithmetic word problems
# --------------------------------------------------------------------------------------------

OPS = ("+", "-", "*", "/")
_OP_SYMBOL = {"+": "+", "-": "-", "*": "×", "/": "÷"}


def apply_op(value: int, op: str, operand: int) -> int:
    if op == "+":
        return value + operand
    if op == "-":
        return value - operand
    if op == "*":
        return value * operand
    if op == "/":
        if operand == 0 or value % operand:
            raise ValueError(f"{value} / {operand} is not an exact integer division")
        return value // operand
    raise ValueError(f"unknown operation {op!r}")


@dataclass(frozen=True)
class ArithmeticProblem:
    """A word problem and the operation chain it encodes: start, then each (op, operand)."""

    id: str
    prompt: str
    start: int
    steps: tuple[tuple[str, int], ...]
    answer: int
    solution: str

    def to_record(self) -> PromptRecord:
        return PromptRecord(
            id=self.id,
            prompt=self.prompt,
            reference=self.solution,
            gold_answer=str(self.answer),
            task="arithmetic",
            source="arithmetic",
        )


# (name, subject pronoun, possessive, object pronoun)
_PEOPLE = (
    ("Maria", "she", "her", "her"),
    ("James", "he", "his", "him"),
    ("Aisha", "she", "her", "her"),
    ("Tom", "he", "his", "him"),
    ("Lena", "she", "her", "her"),
    ("Carlos", "he", "his", "him"),
    ("Yuki", "she", "her", "her"),
    ("Omar", "he", "his", "him"),
    ("Priya", "she", "her", "her"),
    ("Noah", "he", "his", "him"),
    ("Sofia", "she", "her", "her"),
    ("Liam", "he", "his", "him"),
    ("Mei", "she", "her", "her"),
    ("Kwame", "he", "his", "him"),
    ("Hannah", "she", "her", "her"),
    ("Diego", "he", "his", "him"),
    ("Fatima", "she", "her", "her"),
    ("Ivan", "he", "his", "him"),
    ("Chloe", "she", "her", "her"),
    ("Ravi", "he", "his", "him"),
    ("Alex", "they", "their", "them"),
    ("Sam", "they", "their", "them"),
)
_FRIENDS = ("a neighbour", "a classmate", "a cousin", "a friend", "the school", "a charity")
# (plural object, container, verbs for gaining, verbs for losing)
_THINGS = (
    ("apples", "baskets", ("picks", "buys"), ("eats", "gives away")),
    ("stickers", "sheets", ("buys", "is given"), ("trades away", "gives away")),
    ("marbles", "bags", ("wins", "finds"), ("loses", "gives away")),
    ("cookies", "trays", ("bakes", "buys"), ("sells", "eats")),
    ("pencils", "boxes", ("buys", "is given"), ("gives away", "loses")),
    ("books", "shelves", ("buys", "borrows"), ("donates", "sells")),
    ("eggs", "cartons", ("collects", "buys"), ("uses", "sells")),
    ("seashells", "buckets", ("collects", "finds"), ("gives away", "loses")),
    ("cupcakes", "boxes", ("bakes", "buys"), ("sells", "gives away")),
    ("stamps", "albums", ("buys", "is given"), ("trades away", "sells")),
    ("trading cards", "packs", ("buys", "wins"), ("trades away", "loses")),
    ("flowers", "vases", ("picks", "buys"), ("gives away", "sells")),
    ("beads", "jars", ("buys", "is given"), ("uses", "loses")),
    ("tomatoes", "crates", ("picks", "buys"), ("sells", "uses")),
)
_GROUPS = ("bags", "boxes", "piles", "groups", "baskets", "envelopes")


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _verb(pronoun: str, verb: str) -> str:
    """Agree a third-person-singular verb phrase ('picks', 'is given') with 'they'."""
    if pronoun != "they":
        return verb
    head, _, rest = verb.partition(" ")
    if head == "is":
        head = "are"
    elif head.endswith("ies"):
        head = head[:-3] + "y"
    elif head.endswith(("ches", "shes", "sses", "xes")):
        head = head[:-2]
    elif head.endswith("s"):
        head = head[:-1]
    return f"{head} {rest}".strip()


def _has(pronoun: str) -> str:
    return "have" if pronoun == "they" else "has"


def _pick(rng: np.random.Generator, options: Sequence[Any]) -> Any:
    return options[int(rng.integers(len(options)))]


def _choose_steps(rng: np.random.Generator) -> tuple[int, list[tuple[str, int]]]:
    """A start value and 2-4 (op, operand) steps with exact, positive integer intermediates."""
    n_steps = int(rng.integers(2, 5))
    while True:
        value = int(rng.integers(4, 61))
        start = value
        steps: list[tuple[str, int]] = []
        for _ in range(n_steps):
            divisors = [d for d in range(2, 10) if value % d == 0 and value // d >= 2]
            candidates = ["+"]
            if value > 3:
                candidates.append("-")
            if value <= 200:
                candidates.append("*")
            if divisors:
                candidates.append("/")
            # Prefer operations not used yet, so most problems mix several kinds.
            used = {op for op, _ in steps}
            fresh = [op for op in candidates if op not in used]
            op = _pick(rng, fresh if fresh and rng.random() < 0.8 else candidates)
            if op == "+":
                operand = int(rng.integers(2, 41))
            elif op == "-":
                operand = int(rng.integers(1, min(value - 1, 40) + 1))
            elif op == "*":
                operand = int(rng.integers(2, 6))
            else:
                operand = _pick(rng, divisors)
            value = apply_op(value, op, operand)
            steps.append((op, operand))
        if 1 <= value <= 5000:
            return start, steps


def _render(rng: np.random.Generator, start: int, steps: list[tuple[str, int]]) -> tuple[str, str]:
    """The story text and the final question for an operation chain (same chain, any wording)."""
    name, subj, poss, _obj = _pick(rng, _PEOPLE)
    things, container, gain_verbs, lose_verbs = _pick(rng, _THINGS)

    def v(verb: str) -> str:  # a verb agreeing with the pronoun subject
        return _verb(subj, verb)

    sentences: list[str] = []
    first = 0
    if steps[0][0] == "*" and rng.random() < 0.7:
        # Fold a leading multiplication into the opening: "N containers with M in each".
        sentences.append(f"{name} has {start} {container} with {steps[0][1]} {things} in each.")
        first = 1
    else:
        sentences.append(
            _pick(
                rng,
                (
                    f"{name} has {start} {things}.",
                    f"At the start of the week, {name} has {start} {things}.",
                    f"{name} starts with {start} {things}.",
                ),
            )
        )
    question = f"How many {things} does {name} have now?"
    for index in range(first, len(steps)):
        op, x = steps[index]
        last = index == len(steps) - 1
        if op == "+":
            verb = v(_pick(rng, gain_verbs))
            sentences.append(
                _pick(
                    rng,
                    (
                        f"Then {subj} {verb} {x} more {things}.",
                        f"The next day, {subj} {verb} another {x}.",
                        f"{_cap(subj)} {verb} {x} more.",
                    ),
                )
            )
        elif op == "-":
            raw = _pick(rng, lose_verbs)
            verb = v(raw)
            if raw.startswith(("gives", "donates")) and rng.random() < 0.5:
                text = f"{_cap(subj)} {verb} {x} {things} to {_pick(rng, _FRIENDS)}."
            else:
                text = _pick(
                    rng,
                    (
                        f"{_cap(subj)} {verb} {x} of them.",
                        f"After that, {subj} {verb} {x} {things}.",
                        f"Later {subj} {verb} {x} of them.",
                    ),
                )
            sentences.append(text)
        elif op == "*":
            if last and rng.random() < 0.5:
                sentences.append(
                    f"{_cap(subj)} {v('sells')} every one of {poss} {things} for ${x} each."
                )
                question = f"How many dollars does {name} earn?"
            elif x in (2, 3):
                word = "doubles" if x == 2 else "triples"
                sentences.append(
                    f"Then {subj} {v(word)} the number of {things} {subj} {_has(subj)}."
                )
            else:
                sentences.append(
                    f"By the end of the month, {subj} {_has(subj)} {x} times as many {things}."
                )
        else:
            groups = _pick(rng, _GROUPS)
            if last and rng.random() < 0.6:
                sentences.append(
                    f"{_cap(subj)} {v('packs')} all of {poss} {things} equally into {x} {groups}."
                )
                question = f"How many {things} go into each of the {groups}?"
            else:
                sentences.append(
                    f"{_cap(subj)} {v('splits')} {poss} {things} equally into {x} {groups} and "
                    f"{v('keeps')} only one of the {groups}, giving the others away."
                )
    return " ".join(sentences), question


def _solution(start: int, steps: Sequence[tuple[str, int]], answer: int) -> str:
    value = start
    parts = [f"Start with {start}."]
    for op, x in steps:
        new = apply_op(value, op, x)
        parts.append(f"{value} {_OP_SYMBOL[op]} {x} = {new}.")
        value = new
    parts.append(f"The answer is {answer}.")
    return " ".join(parts)


def generate_arithmetic_problems(n: int, rng: np.random.Generator) -> list[ArithmeticProblem]:
    """``n`` distinct word problems, deterministic given the state of ``rng``."""
    if n < 0:
        raise DatasetError(f"dataset 'arithmetic': n must be >= 0, got {n}")
    problems: list[ArithmeticProblem] = []
    seen: set[str] = set()
    attempts = 0
    while len(problems) < n:
        attempts += 1
        if attempts > 100 * n + 100:  # pragma: no cover - the template space is far larger
            raise DatasetError(f"dataset 'arithmetic': could not generate {n} distinct problems")
        start, steps = _choose_steps(rng)
        story, question = _render(rng, start, steps)
        prompt = f"{story} {question}"
        if prompt in seen:
            continue
        seen.add(prompt)
        answer = start
        for op, x in steps:
            answer = apply_op(answer, op, x)
        problems.append(
            ArithmeticProblem(
                id=f"arith-{len(problems):04d}",
                prompt=prompt,
                start=start,
                steps=tuple(steps),
                answer=answer,
                solution=_solution(start, steps, answer),
            )
        )
    return problems


def generate_arithmetic(n: int, rng: np.random.Generator) -> list[PromptRecord]:
    """Grade-school word problems (2-4 steps of +, -, ×, ÷ with exact integer results).

    Each record has the gold number as ``gold_answer`` and a worked solution, one equation
    per step, ending with "The answer is N.", as ``reference``. The operation chains are
    available from :func:`generate_arithmetic_problems` (same rng state, same problems).
    """
    return [p.to_record() for p in generate_arithmetic_problems(n, rng)]


# --------------------------------------------------------------------------------------------
# Hub adapters
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HubAdapter:
    """Where a hub dataset lives and how one row becomes a PromptRecord (None skips the row)."""

    hub_id: str
    config: str | None
    split: str
    to_record: Callable[[Mapping[str, Any], int], PromptRecord | None]


_CALC_ANNOTATION = re.compile(r"<<[^>]*>>")


def _gsm8k_row(row: Mapping[str, Any], index: int) -> PromptRecord | None:
    answer = str(row.get("answer") or "")
    gold = extract_final_number(answer)
    if not row.get("question") or gold is None:
        return None
    body = _CALC_ANNOTATION.sub("", answer.rsplit("####", 1)[0]).strip()
    reference = f"{body}\nThe answer is {gold}." if body else f"The answer is {gold}."
    return PromptRecord(
        f"gsm8k-{index:05d}", row["question"].strip(), reference, gold, "arithmetic", "gsm8k"
    )


def _instruction_row(source: str, context_key: str, answer_key: str):
    def adapt(row: Mapping[str, Any], index: int) -> PromptRecord | None:
        instruction = str(row.get("instruction") or "").strip()
        if not instruction:
            return None
        context = str(row.get(context_key) or "").strip()
        prompt = f"{instruction}\n\n{context}" if context else instruction
        reference = str(row.get(answer_key) or "").strip() or None
        return PromptRecord(f"{source}-{index:05d}", prompt, reference, None, "instruction", source)

    return adapt


def _yes_no(value: Any) -> str | None:
    if isinstance(value, bool):
        return "yes" if value else "no"
    text = str(value).strip().lower()
    if text in ("true", "yes", "1"):
        return "yes"
    if text in ("false", "no", "0"):
        return "no"
    return None


def _strategyqa_row(row: Mapping[str, Any], index: int) -> PromptRecord | None:
    question = str(row.get("question") or "").strip()
    gold = _yes_no(row.get("answer"))
    if not question or gold is None:
        return None
    facts = row.get("facts")
    if isinstance(facts, (list, tuple)):
        facts = " ".join(str(f).strip() for f in facts if str(f).strip())
    reference = f"{_cap(gold)}. {facts}".strip() if facts else _cap(gold) + "."
    rid = str(row.get("qid") or f"{index:05d}")
    return PromptRecord(
        f"strategyqa-{rid}", f"{question} Answer yes or no.", reference, gold, "yesno", "strategyqa"
    )


def _creak_row(row: Mapping[str, Any], index: int) -> PromptRecord | None:
    sentence = str(row.get("sentence") or "").strip()
    gold = _yes_no(row.get("label"))
    if not sentence or gold is None:
        return None
    explanation = str(row.get("explanation") or "").strip()
    reference = f"{_cap(gold)}. {explanation}".strip()
    rid = str(row.get("ex_id") or f"{index:05d}")
    prompt = f'Is the following claim true? "{sentence}" Answer yes or no.'
    return PromptRecord(f"creak-{rid}", prompt, reference, gold, "yesno", "creak")


def _qed_row(row: Mapping[str, Any], index: int) -> PromptRecord | None:
    question = str(row.get("question") or "").strip()
    if not question:
        return None
    question = _cap(question)
    if not question.endswith("?"):
        question += "?"
    gold = None
    for answer in row.get("original_nq_answers") or []:
        text = str(answer.get("string") if isinstance(answer, Mapping) else answer).strip()
        if text:
            gold = text
            break
    annotation = row.get("annotation") or {}
    selected = annotation.get("selected_sentence") if isinstance(annotation, Mapping) else None
    reference = None
    if isinstance(selected, Mapping):
        reference = str(selected.get("string") or "").strip() or None
    if gold is None and reference is None:
        return None
    rid = str(row.get("example_id") or f"{index:05d}")
    return PromptRecord(f"qed-{rid}", question, reference or gold, gold, "qa", "qed")


HUB_DATASETS: dict[str, HubAdapter] = {
    "gsm8k": HubAdapter("openai/gsm8k", "main", "test", _gsm8k_row),
    "alpaca": HubAdapter(
        "tatsu-lab/alpaca", None, "train", _instruction_row("alpaca", "input", "output")
    ),
    "dolly": HubAdapter(
        "databricks/databricks-dolly-15k",
        None,
        "train",
        _instruction_row("dolly", "context", "response"),
    ),
    "strategyqa": HubAdapter("ChilleD/StrategyQA", None, "test", _strategyqa_row),
    "creak": HubAdapter("amydeng2000/CREAK", None, "validation", _creak_row),
    "qed": HubAdapter("google-research-datasets/qed", None, "validation", _qed_row),
}

_SCHEMA_HINT = (
    "one JSON object per line with fields id, prompt, reference (or null), gold_answer "
    f"(or null), task ({', '.join(TASKS)}) and source"
)


def _load_hub(name: str) -> list[PromptRecord]:
    adapter = HUB_DATASETS[name]
    try:
        import datasets as hf_datasets

        rows = hf_datasets.load_dataset(adapter.hub_id, adapter.config, split=adapter.split)
    except Exception as err:  # offline: ConnectionError, OSError, hub client errors, ...
        raise DatasetError(
            f"dataset '{name}': could not load {adapter.hub_id}"
            f"{f' ({adapter.config})' if adapter.config else ''} split '{adapter.split}' "
            f"through datasets.load_dataset ({type(err).__name__}: {err}). The Hugging Face "
            "hub is probably unreachable from here. Give the same data as a local JSONL file "
            f"instead, with name 'jsonl' and path=<file> ({_SCHEMA_HINT})."
        ) from err
    records: list[PromptRecord] = []
    seen: set[str] = set()
    for index, row in enumerate(rows):
        record = adapter.to_record(row, index)
        if record is None:
            continue
        if record.id in seen:
            record = dataclasses.replace(record, id=f"{record.id}-{index}")
        seen.add(record.id)
        records.append(record)
    if not records:
        raise DatasetError(f"dataset '{name}': {adapter.hub_id} gave no usable rows")
    return records


# --------------------------------------------------------------------------------------------
# Loading, sampling and splits
# --------------------------------------------------------------------------------------------


def _sample(records: list[PromptRecord], n: int, rng: np.random.Generator) -> list[PromptRecord]:
    """All records when n >= len; otherwise n of them without replacement, in source order."""
    if n >= len(records):
        return list(records)
    chosen = np.sort(rng.choice(len(records), size=n, replace=False))
    return [records[int(i)] for i in chosen]


def load_records(
    name: str,
    n: int,
    rng: np.random.Generator,
    path: str | os.PathLike | None = None,
    data_dir: Path = DEFAULT_DATA_DIR,
) -> list[PromptRecord]:
    """Load up to ``n`` prompt records of dataset ``name``.

    ``"instructions"`` reads ``data_dir/instructions.jsonl``; ``"arithmetic"`` generates ``n``
    problems with ``rng``; ``"jsonl"`` reads ``path``; a :data:`HUB_DATASETS` name goes through
    ``datasets.load_dataset``. When ``n`` exceeds what exists, all records are returned;
    otherwise ``n`` are drawn with ``rng`` without replacement and kept in source order.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise DatasetError(f"dataset '{name}': n must be a non-negative integer, got {n!r}")
    n = int(n)
    if name == "arithmetic":
        return generate_arithmetic(n, rng)
    if name == "instructions":
        records = read_jsonl(Path(data_dir) / INSTRUCTIONS_FILE, dataset=name)
    elif name == "jsonl":
        if path is None:
            raise DatasetError(f"dataset 'jsonl' needs a path to a JSONL file ({_SCHEMA_HINT})")
        records = read_jsonl(path, dataset=name)
    elif name in HUB_DATASETS:
        records = _load_hub(name)
    else:
        known = ", ".join((*EMBEDDED, "jsonl", *HUB_DATASETS))
        raise DatasetError(f"unknown dataset '{name}'; known datasets: {known}")
    return _sample(records, n, rng)


def assign_splits(
    records: Sequence[PromptRecord], calib_fraction: float, rng: np.random.Generator
) -> list[PromptRecord]:
    """Mark round(calib_fraction * len) records "calib" and the rest "eval", chosen by ``rng``.

    The order of ``records`` is kept. With 0 < calib_fraction < 1 and at least two records,
    both splits get at least one record.
    """
    if not 0.0 <= calib_fraction <= 1.0:
        raise DatasetError(f"calib_fraction must be in [0, 1], got {calib_fraction}")
    total = len(records)
    n_calib = int(round(calib_fraction * total))
    if 0.0 < calib_fraction < 1.0 and total >= 2:
        n_calib = min(max(n_calib, 1), total - 1)
    calib = set(rng.permutation(total)[:n_calib].tolist())
    return [
        dataclasses.replace(r, split="calib" if i in calib else "eval")
        for i, r in enumerate(records)
    ]


# --------------------------------------------------------------------------------------------
# Prompt tokenisation
# --------------------------------------------------------------------------------------------


def _as_id_list(encoded: Any) -> list[int]:
    if isinstance(encoded, Mapping) or hasattr(encoded, "keys"):
        encoded = encoded["input_ids"]
    if hasattr(encoded, "tolist"):
        encoded = encoded.tolist()
    encoded = list(encoded)
    if encoded and isinstance(encoded[0], (list, tuple)):
        if len(encoded) != 1:
            raise ValueError(f"expected one sequence of token ids, got a batch of {len(encoded)}")
        encoded = list(encoded[0])
    return [int(t) for t in encoded]


def chat_token_ids(tokenizer: Any, prompt: str, system: str | None = None) -> list[int]:
    """Token ids of ``prompt`` as one user turn plus the assistant generation prompt.

    Uses the tokenizer's chat template (``system`` as a system turn when given); a tokenizer
    without a chat template gets the plain text (system text, a blank line, then the prompt)
    encoded with its special tokens.
    """
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": prompt}]
        if system:
            messages.insert(0, {"role": "system", "content": system})
        encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return _as_id_list(encoded)
    text = f"{system}\n\n{prompt}" if system else prompt
    return _as_id_list(tokenizer(text, add_special_tokens=True))
