"""Seeded grade-school arithmetic word problems with gold numeric answers (embedded dataset)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgespec.data.records import DatasetError, PromptRecord

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
