"""Whole forwards of each model of a cached pair with its linear weights in their plain layout
and reordered once for oneDNN, at decoding shapes, in one dtype.

Each shape is ``rows x new tokens`` after a prefilled cache of ``--cache`` tokens (1 x 1 is a
batch-1 decoding step, 1 x 5 a batch-1 verification of 4 drafted tokens, 16 x 1 and 16 x 5 the
same at the workflow's batch of 16). Prints the median of ``--repeats`` per shape and layout,
the seconds the reordering took and the resident memory after it. This is how the choice of
which dtypes ``edgespec.models.cpu_linear`` keeps reordered is measured on a machine:

    python bench/bench_layout.py --model-dir resources/models/qwen25coder --dtype float32
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from transformers import DynamicCache

from edgespec.models.cpu_linear import reorder_all_weights
from edgespec.models.load import load_model
from edgespec.models.precision import cpu_flags

SHAPES = ((1, 1), (1, 3), (1, 5), (16, 1), (16, 5))


def _rss_gib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def reorder_weights(model) -> float:
    """Reorder every routed layer's weight for oneDNN, whatever the dtype; seconds taken."""
    start = time.perf_counter()
    reorder_all_weights(model)
    return time.perf_counter() - start


def forward_ms(model, rows: int, new: int, cache_len: int, repeats: int) -> float:
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(100, 20000, (rows, cache_len), generator=gen)
    step = torch.randint(100, 20000, (rows, new), generator=gen)
    times = []
    with torch.inference_mode():
        for _ in range(repeats + 1):  # the first is a warm-up
            cache = DynamicCache()
            model(prompt, past_key_values=cache, use_cache=True)
            start = time.perf_counter()
            model(step, past_key_values=cache, use_cache=True)
            times.append(time.perf_counter() - start)
    return statistics.median(times[1:]) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model-dir", type=Path, required=True, help="cached pair (draft/, target/)"
    )
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--roles", nargs="+", default=["draft", "target"])
    parser.add_argument("--cache", type=int, default=64, help="prefilled tokens per row")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    simd = sorted(f for f in cpu_flags() if f.startswith(("avx", "amx")))
    print(
        f"CPU flags: {', '.join(simd) or 'none of avx*/amx*'}; {args.threads} threads; "
        f"{args.dtype}; {args.cache}-token cache; median of {args.repeats}\n"
    )
    print("| model | shape | plain (ms) | reordered (ms) | reordered / plain |")
    print("|---|---|---|---|---|")
    notes = []
    for role in args.roles:
        model = load_model(args.model_dir / role, args.dtype, role=role)
        plain = {s: forward_ms(model, *s, args.cache, args.repeats) for s in SHAPES}
        seconds = reorder_weights(model)
        notes.append(
            f"{role}: reordering took {seconds:.1f} s; {_rss_gib():.1f} GiB resident after"
        )
        for shape in SHAPES:
            packed = forward_ms(model, *shape, args.cache, args.repeats)
            print(
                f"| {role} | {shape[0]} x {shape[1]} | {plain[shape]:.0f} | {packed:.0f} | "
                f"{packed / plain[shape]:.2f} |",
                flush=True,
            )
        del model
    print("\n" + "\n".join(f"- {n}" for n in notes))


if __name__ == "__main__":
    main()
