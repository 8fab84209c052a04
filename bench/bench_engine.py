"""Throughput of the speculative engine against Hugging Face decoding on a real pair.

Prints a Markdown table: tokens/s of target-only ``generate``, of assisted generation
(``assistant_model=``), and of this engine (greedy gamma-token rounds) at batch 1 and at a
larger batch, with the peak resident memory of each phase. All greedy, same prompts, a fixed
number of new tokens (EOS ignored so every method does the same work).

    python bench/bench_engine.py --model-dir resources/models/qwen25coder --prompts 4 --new 64
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from edgespec.data.chat import chat_token_ids
from edgespec.data.prepare import load_records
from edgespec.decoding.engine import DecodingConfig, generate_rounds
from edgespec.models.load import load_pair
from edgespec.seeding import numpy_rng, torch_generator


def _reset_peak_rss() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def _peak_rss_gib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def _timed(label, fn, n_tokens_fn, rows):
    _reset_peak_rss()
    start = time.perf_counter()
    out = fn()
    elapsed = time.perf_counter() - start
    tokens = n_tokens_fn(out)
    rows.append((label, tokens, elapsed, tokens / elapsed, _peak_rss_gib()))
    print(f"{label}: {tokens} tokens in {elapsed:.1f} s", file=sys.stderr, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", default="resources/models/qwen25coder")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prompts", type=int, default=4, help="prompts for the batch-1 methods")
    ap.add_argument("--batch", type=int, default=16, help="batch size of the batched engine run")
    ap.add_argument("--new", type=int, default=64, help="new tokens per prompt")
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model_dir = Path(args.model_dir)
    draft, target, tok = load_pair(model_dir / "draft", model_dir / "target", dtype=args.dtype)
    records = load_records("instructions", args.batch, numpy_rng(args.seed, "bench"))
    prompts = [chat_token_ids(tok, r.prompt) for r in records]
    few = prompts[: args.prompts]
    rows: list[tuple] = []

    def hf(prompt_list, **kw):
        outs = []
        for p in prompt_list:
            ids = torch.tensor([p])
            gen = target.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=args.new,
                min_new_tokens=args.new,
                do_sample=False,
                **kw,
            )
            outs.append(gen[0, len(p) :].tolist())
        return outs

    count = lambda outs: sum(len(o) for o in outs)  # noqa: E731
    target_only = _timed("target-only generate (batch 1)", lambda: hf(few), count, rows)
    assisted = _timed(
        "HF assisted generation (batch 1)", lambda: hf(few, assistant_model=draft), count, rows
    )
    cfg = DecodingConfig(max_new_tokens=args.new, temperature=0.0, batch_size=1)

    def engine(prompt_list, batch):
        cfg.batch_size = batch
        outs, _ = generate_rounds(
            prompt_list, cfg, torch_generator(args.seed, "bench"), draft, target, args.gamma
        )
        return outs

    eng1 = _timed(
        f"edgespec engine, gamma={args.gamma} (batch 1)", lambda: engine(few, 1), count, rows
    )
    engb = _timed(
        f"edgespec engine, gamma={args.gamma} (batch {args.batch})",
        lambda: engine(prompts, args.batch),
        count,
        rows,
    )
    same = lambda a, b: sum(x == y for x, y in zip(a, b, strict=True))  # noqa: E731
    print(f"\nmodel pair: {model_dir}  dtype {args.dtype}  threads {args.threads}")
    print("| method | tokens | seconds | tokens/s | peak RSS (GiB) |\n|---|---|---|---|---|")
    for label, tokens, secs, tps, rss in rows:
        print(f"| {label} | {tokens} | {secs:.1f} | {tps:.2f} | {rss:.1f} |")
    print(
        f"\nidentical to target-only greedy: assisted {same(assisted, target_only)}/{len(few)}, "
        f"engine batch 1 {same(eng1, target_only)}/{len(few)}, "
        f"engine batch {args.batch} {same(engb[: len(few)], target_only)}/{len(few)} "
        "(bf16 batched and chunked matmuls may flip near-tied argmaxes)"
    )
    base = rows[1][3]
    print(
        f"engine batch 1 / assisted: {rows[2][3] / base:.2f}x; "
        f"engine batch {args.batch} / assisted: {rows[3][3] / base:.2f}x"
    )


if __name__ == "__main__":
    main()
