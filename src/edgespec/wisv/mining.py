"""The settings and the judge of WISV label mining (methods §4.2; the walk: ``wisv.labels``).

A mined mismatch is judged by its two branches, the original response and the alternative
that substitutes the draft token: by their stated answers where the prompt is an answer task
(it has a gold answer) and both branches state a complete one (criterion "answer": safe iff
they agree, risk 0 or 1), else by the similarity of their texts (criterion "similarity": safe
iff it reaches the threshold, risk the graded 1 - similarity). :class:`MiningConfig` holds the
settings, :class:`MiningTask` one mining's fixed inputs (prompts, gold answers, detokenizer,
similarity judge) and :func:`judge_branches` gives the verdicts of one walk step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from edgespec.data.answers import marked_answer

CRITERIA = ("answer", "similarity")
"""How a label was decided: the two branches' stated answers, or their similarity."""

DEFAULT_ANSWER_MARKER = "The answer is"

Similarity = Callable[[list[str], list[str]], list[float]]
"""Texts, reference texts -> one similarity in [0, 1] per pair (``scoring.semantic_similarity``)."""


@dataclass(frozen=True)
class MiningConfig:
    """The settings of one label mining (``wisv.labels.mine_labels``); token counts in tokens.

    ``max_new_tokens``: the decoding budget, the positions mismatches are mined among;
    ``label_max_new_tokens``: each branch's own budget (None: ``max_new_tokens``), at least the
    decoding budget; ``similarity_threshold``: a branch at least this similar to the original
    response is safe (criterion "similarity"); ``max_mismatches_per_prompt``: at most this many
    judged per prompt (None: all); ``answer_marker``: the phrase that states an answer;
    ``eos_token_ids`` and ``pad_token_id``: the tokenizer's; ``batch_size``: prompts walked
    together; ``hidden_dtype``: the numpy dtype of the returned hidden states;
    ``continuations``: K, the continuations a mismatch's risk averages (the greedy one and
    K - 1 drawn at ``continuation_temperature`` from a generator seeded by ``seed``; K = 1:
    the greedy one alone).
    """

    max_new_tokens: int
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int = 0
    batch_size: int = 1
    label_max_new_tokens: int | None = None
    similarity_threshold: float = 0.85
    max_mismatches_per_prompt: int | None = None
    answer_marker: str = DEFAULT_ANSWER_MARKER
    hidden_dtype: Any = np.float32
    continuations: int = 1
    continuation_temperature: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.continuations < 1 or not self.continuation_temperature > 0:
            raise ValueError(
                "wisv.label_continuations must be >= 1 and wisv.label_temperature > 0, got "
                f"{self.continuations}, {self.continuation_temperature}"
            )
        object.__setattr__(self, "eos_token_ids", tuple(int(t) for t in self.eos_token_ids))
        if self.max_new_tokens < 1 or self.batch_size < 1:
            raise ValueError("max_new_tokens and batch_size must be >= 1")
        if self.label_budget < self.max_new_tokens:
            raise ValueError(
                f"label_max_new_tokens ({self.label_budget}) must be >= max_new_tokens "
                f"({self.max_new_tokens})"
            )
        cap = self.max_mismatches_per_prompt
        if cap is not None and cap < 1:
            raise ValueError("max_mismatches_per_prompt must be >= 1 or None")

    @classmethod
    def from_settings(
        cls,
        wisv: Mapping[str, Any],
        *,
        eos_token_ids: Sequence[int],
        pad_token_id: int,
        batch_size: int,
        hidden_dtype: Any = np.float32,
        seed: int = 0,
    ) -> MiningConfig:
        """From the workflow's config keys wisv.max_new_tokens, wisv.label_max_new_tokens,
        wisv.similarity_threshold, wisv.max_mismatches_per_prompt, wisv.answer_marker,
        wisv.label_continuations and wisv.label_temperature (the last two optional)."""
        return cls(
            max_new_tokens=wisv["max_new_tokens"],
            eos_token_ids=tuple(eos_token_ids),
            pad_token_id=pad_token_id,
            batch_size=batch_size,
            label_max_new_tokens=wisv["label_max_new_tokens"],
            similarity_threshold=wisv["similarity_threshold"],
            max_mismatches_per_prompt=wisv["max_mismatches_per_prompt"],
            answer_marker=wisv["answer_marker"],
            hidden_dtype=hidden_dtype,
            continuations=int(wisv.get("label_continuations", 1)),
            continuation_temperature=float(wisv.get("label_temperature", 1.0)),
            seed=seed,
        )

    @property
    def label_budget(self) -> int:
        """Each branch's budget [tokens]: ``label_max_new_tokens``, else ``max_new_tokens``."""
        if self.label_max_new_tokens is None:
            return self.max_new_tokens
        return int(self.label_max_new_tokens)

    @property
    def cap(self) -> float:
        """The most mismatches judged per prompt (inf: all)."""
        cap = self.max_mismatches_per_prompt
        return math.inf if cap is None else cap


@dataclass
class Branch:
    """A finished response: its tokens, text and stated answer (None: none reached)."""

    tokens: list[int]
    text: str
    answer: Any


class Verdict(NamedTuple):
    """One judged substitution: safe?, risk in [0, 1], similarity (NaN: answers decided) and
    the criterion (``CRITERIA``)."""

    safe: bool
    risk: float
    similarity: float
    criterion: str


def _stated_answer(
    tokens: list[int], text: str, eos: set[int], marker: str, gold: str | None
) -> Any:
    """The branch's answer if it stated one completely (or stated one and ended at EOS)."""
    value, complete = marked_answer(text, marker, gold)
    if value is None:
        return None
    return value if complete or (tokens and tokens[-1] in eos) else None


def _answer_stop(
    prefixes: Sequence[list[int]],
    owners: Sequence[int],
    answer_task: Sequence[bool],
    golds: Sequence[str | None],
    decode_text: Callable[[list[int]], str],
    marker: str,
) -> Callable[[int, list[int]], bool]:
    """The stopping rule of a batch of branches: row b (prompt ``owners[b]``, response so far
    ``prefixes[b]`` + generated tokens) stops once an answer task's text states a complete
    answer."""

    def stop(row: int, tokens: list[int]) -> bool:
        i = owners[row]
        if not answer_task[i]:
            return False
        return marked_answer(decode_text(prefixes[row] + tokens), marker, golds[i])[1]

    return stop


class MiningTask:
    """One mining's fixed inputs: the prompts and their ids and gold answers (a prompt is an
    answer task iff it has one), the settings, the detokenizer and the similarity judge
    (``scoring.semantic_similarity``, loaded at its first use, where none is given)."""

    def __init__(
        self,
        prompts: Sequence[Sequence[int]],
        prompt_ids: Sequence[Any],
        golds: Sequence[str | None],
        config: MiningConfig,
        decode_text: Callable[[list[int]], str],
        similarity: Similarity | None,
    ) -> None:
        if len(prompt_ids) != len(prompts) or len(golds) != len(prompts):
            raise ValueError("prompts, prompt_ids and golds need the same length")
        for i, prompt in enumerate(prompts):
            if len(prompt) < 1:
                raise ValueError(f"prompt {i} is empty")
        self.prompts, self.prompt_ids, self.golds = prompts, prompt_ids, golds
        self.answer_task = [g is not None for g in golds]
        self.config, self.decode_text, self._similarity = config, decode_text, similarity
        self.eos = set(config.eos_token_ids)

    def stop_rule(self, prefixes: Sequence[list[int]], owners: Sequence[int]):
        """The stopping rule of branches ``prefixes`` of prompts ``owners`` (``_answer_stop``)."""
        return _answer_stop(
            prefixes,
            owners,
            self.answer_task,
            self.golds,
            self.decode_text,
            self.config.answer_marker,
        )

    def branch(self, i: int, tokens: list[int]) -> Branch:
        """Prompt i's finished response ``tokens``, with its text and (answer tasks) answer."""
        text = self.decode_text(list(tokens))
        answer = (
            _stated_answer(tokens, text, self.eos, self.config.answer_marker, self.golds[i])
            if self.answer_task[i]
            else None
        )
        return Branch(tokens, text, answer)

    def similarity(self, texts: list[str], refs: list[str]) -> list[float]:
        """The judge's similarity of each text to its reference, checked for one per pair."""
        if self._similarity is None:
            from edgespec.scoring import semantic_similarity

            self._similarity = semantic_similarity
        scores = list(self._similarity(texts, refs))
        if len(scores) != len(texts):
            raise ValueError("similarity returned a wrong number of scores")
        return [float(s) for s in scores]


def judge_branches(
    task: MiningTask, originals: Sequence[Branch], alternatives: Sequence[Branch]
) -> list[Verdict]:
    """Each alternative against the original response of its prompt (``originals[k]``): by
    the stated answers where both state one (criterion "answer"), else by their similarity
    (criterion "similarity"; one call of the judge for all of them, in order)."""
    verdicts: list[Verdict | None] = [None] * len(alternatives)
    fallback = []
    for k, (ref, alt) in enumerate(zip(originals, alternatives, strict=True)):
        if ref.answer is not None and alt.answer is not None:
            safe = alt.answer == ref.answer
            verdicts[k] = Verdict(safe, 0.0 if safe else 1.0, math.nan, "answer")
        else:
            fallback.append(k)
    if fallback:
        sims = task.similarity(
            [alternatives[k].text for k in fallback], [originals[k].text for k in fallback]
        )
        threshold = task.config.similarity_threshold
        for k, s in zip(fallback, sims, strict=True):
            risk = float(min(max(1.0 - s, 0.0), 1.0))
            verdicts[k] = Verdict(s >= threshold, risk, s, "similarity")
    return verdicts  # type: ignore[return-value]


def averaged_risks(
    verdicts: Sequence[Verdict], draws: Sequence[Sequence[Verdict]]
) -> list[Verdict]:
    """The greedy ``verdicts`` with each risk replaced by the mean over the greedy verdict and
    its sampled continuations' (``draws[k][j]``: draw k of mismatch j): the graded risk r_j of
    K continuations (methods §4.2). Label, similarity and criterion stay the greedy one's."""
    out = []
    for j, v in enumerate(verdicts):
        risks = [v.risk, *(draw[j].risk for draw in draws)]
        out.append(v._replace(risk=float(np.mean(risks))))
    return out
