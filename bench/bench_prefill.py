"""Prefilling a batch of chat prompts: one left-padded forward against ``prefill.prefill``.

One left-padded forward computes every padding slot as if it were a token, and every copy of
the system turn the prompts share; ``edgespec.decoding.prefill.prefill`` (reached here through
``edgespec.decoding.branching.prefill_rows``, as label mining uses it) computes the shared
prefix once and the rest in chunks of similar length. Both ways leave the same keys and values
per prompt up to float rounding, and the script prints the largest difference. The prompts are
the workflow's: prepared dataset files, one split, chat-templated with the config's system
prompts. The ways alternate, ``--repeats`` times, and every time is printed:

    python bench/bench_prefill.py --model-dir resources/models/qwen25coder \\
        results/data/arithmetic.jsonl results/data/instructions.jsonl

(as rule ``mine_labels`` prefills the default run's 16 calibration prompts: one thread, the
target's linear weights reordered for oneDNN; ``--no-reorder`` keeps them plain).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from edgespec.config import load_config
from edgespec.decoding.branching import BranchBatch, prefill_rows
from edgespec.models.cpu_linear import reorder_all_weights
from edgespec.models.load import load_pair_from_dir
from edgespec.models.precision import cpu_flags
from edgespec.runconfig import chat_prompts, prompt_split


def padded_rows(model, prompts):
    batch = BranchBatch(model, [None] * len(prompts))
    batch.feed(prompts, 1)
    return [batch.row_cache(b) for b in range(len(prompts))]


def largest_difference(a, b) -> float:
    return max(
        float((x - y).abs().max())
        for ra, rb in zip(a, b, strict=True)
        for x, y in zip(ra.keys + ra.values, rb.keys + rb.values, strict=True)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("datasets", nargs="+", type=Path, help="prepared dataset files")
    parser.add_argument("--model-dir", type=Path, required=True, help="cached pair")
    parser.add_argument("--config", type=Path, default=Path("config.yaml"))
    parser.add_argument("--split", default="calib", choices=["calib", "eval"])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-reorder", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = load_config(args.config)
    draft, target, tokenizer = load_pair_from_dir(
        args.model_dir, {"dtype": args.dtype}, args.threads
    )
    if not args.no_reorder:
        reorder_all_weights(target)
    records = prompt_split([str(p) for p in args.datasets], args.split)
    # chat_prompts reads the system prompts from the data section, as the workflow's PROMPTING.
    prompts = chat_prompts(tokenizer, records, config["data"])
    lengths = [len(p) for p in prompts]
    simd = sorted(f for f in cpu_flags() if f.startswith(("avx", "amx")))
    print(
        f"CPU flags: {', '.join(simd) or 'none of avx*/amx*'}; {args.threads} threads; "
        f"{args.dtype}; {len(prompts)} {args.split} prompts, {sum(lengths)} tokens, "
        f"{len(prompts) * max(lengths)} padded\n"
    )
    print("| model | repeat | left-padded (s) | engine.prefill (s) |")
    print("|---|---|---|---|")
    notes = []
    for role, model in (("target", target), ("draft", draft)):
        times: dict[str, list[float]] = {"padded": [], "engine": []}
        for repeat in range(args.repeats):
            caches = {}
            for way, fn in (("padded", padded_rows), ("engine", prefill_rows)):
                start = time.perf_counter()
                with torch.inference_mode():
                    caches[way] = fn(model, prompts)
                times[way].append(time.perf_counter() - start)
            print(
                f"| {role} | {repeat + 1} | {times['padded'][-1]:.1f} | "
                f"{times['engine'][-1]:.1f} |",
                flush=True,
            )
        print(
            f"| {role} | median | {statistics.median(times['padded']):.1f} | "
            f"{statistics.median(times['engine']):.1f} |"
        )
        notes.append(
            f"{role}: largest key/value difference between the two ways "
            f"{largest_difference(caches['padded'], caches['engine']):.2e}"
        )
    print("\n" + "\n".join(f"- {n}" for n in notes))


if __name__ == "__main__":
    main()
