"""A progress bar over decoded tokens, with tokens/s, for the logs of the model stages."""

from __future__ import annotations

import logging
import sys
import time

from tqdm.auto import tqdm


class DecodeProgress:
    """Counts committed tokens and finished prompts; the bar's rate is tokens/s.

    ``total_tokens`` is an upper bound (prompts x token budget: rows that stop at EOS end
    early). ``close`` logs one line with the final tokens/s, which the README's per-stage
    figures are read from.
    """

    def __init__(self, label: str, total_tokens: int, num_prompts: int, stream=None):
        self.label = label
        self.num_prompts = num_prompts
        self.tokens = 0
        self.prompts_done = 0
        self.start = time.perf_counter()
        self.bar = tqdm(
            total=total_tokens,
            desc=label,
            unit="tok",
            file=stream if stream is not None else sys.stderr,
            mininterval=5.0,
            ascii=True,
            dynamic_ncols=False,
        )

    def advance(self, tokens: int, prompts_done: int = 0) -> None:
        self.tokens += int(tokens)
        self.prompts_done += int(prompts_done)
        self.bar.update(int(tokens))
        self.bar.set_postfix_str(f"{self.prompts_done}/{self.num_prompts} prompts", refresh=False)

    @property
    def tokens_per_second(self) -> float:
        elapsed = time.perf_counter() - self.start
        return self.tokens / elapsed if elapsed > 0 else float("nan")

    def close(self) -> float:
        """Close the bar, log the final rate, and return it (tokens/s)."""
        self.bar.close()
        elapsed = time.perf_counter() - self.start
        rate = self.tokens_per_second
        logging.getLogger("edgespec").info(
            "%s: %d tokens of %d prompts in %.1f s, %.2f tokens/s",
            self.label,
            self.tokens,
            self.num_prompts,
            elapsed,
            rate,
        )
        return rate
