"""Throughput of the speculative engine against Hugging Face decoding on a real pair, fairly.

Every method decodes the same chat prompts greedily, in the same dtype, up to ``--new`` new
tokens or the pair's end-of-reply tokens, whichever comes first (EOS ends a row in every
method, so they do the same work), after one warm-up of its own. Methods:

- target-only ``generate`` at batch 1 and at ``--batch`` (left-padded);
- Hugging Face assisted generation (``assistant_model=``) at batch 1, with its default
  adaptive drafting and with a fixed gamma;
- this engine (greedy gamma-token rounds) at batch 1 (every gamma of ``--gammas``) and at
  ``--batch`` (``--gamma``).

Timing on a shared machine drifts by more than the differences measured here, so every method
runs ``--repeats`` times, interleaved: each repeat runs every method once, in an order rotated
from one repeat to the next, and a ratio is taken within a repeat (each method against
target-only ``generate`` of the same repeat). The tables give the median and, in brackets, the
range over repeats.

Prints Markdown tables: tokens/s, ratios, peak resident memory, how many outputs equal
target-only greedy, where the engine's time goes (draft forwards, target forwards, the rest),
and, with ``--sweep``, the engine against target-only ``generate`` over batch sizes, which
shows the crossover batch size where speculation stops paying on this machine.

    python bench/bench_engine.py --model-dir resources/models/qwen25coder --dtype bfloat16
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from edgespec.data.chat import chat_token_ids
from edgespec.data.prepare import load_records
from edgespec.decoding.engine import DecodingConfig, RaggedCachedModel, generate_rounds
from edgespec.models.load import load_pair, stop_token_ids
from edgespec.models.precision import cpu_flags, machine_summary, native_bf16
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


def _cut(tokens: list[int], eos: set[int], budget: int) -> list[int]:
    """New tokens up to and including the first EOS, at most ``budget``."""
    out = []
    for t in tokens[:budget]:
        out.append(int(t))
        if t in eos:
            break
    return out


class ForwardClock:
    """Wall time spent in each model's forward passes inside the engine."""

    def __init__(self, draft, target):
        self.seconds = {"draft": 0.0, "target": 0.0}
        self._names = {id(draft): "draft", id(target): "target"}
        self._feed = RaggedCachedModel.feed

    def __enter__(self):
        clock, feed = self, self._feed

        def timed(model_self, tokens, valid, logits_to_keep):
            start = time.perf_counter()
            out = feed(model_self, tokens, valid, logits_to_keep)
            clock.seconds[clock._names[id(model_self.model)]] += time.perf_counter() - start
            return out

        RaggedCachedModel.feed = timed
        return self

    def __exit__(self, *exc):
        RaggedCachedModel.feed = self._feed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", default="resources/models/qwen25coder")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--prompts", type=int, default=4, help="prompts for the batch-1 methods")
    ap.add_argument("--batch", type=int, default=16, help="batch size of the batched runs")
    ap.add_argument("--new", type=int, default=64, help="at most this many new tokens")
    ap.add_argument("--gamma", type=int, default=4, help="draft length of the batched engine")
    ap.add_argument(
        "--gammas",
        type=int,
        nargs="+",
        default=None,
        help="draft lengths of the batch-1 engine (default: --gamma)",
    )
    ap.add_argument("--repeats", type=int, default=3, help="interleaved timed runs per method")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--sweep", type=int, nargs="*", default=[], help="batch sizes for the crossover table"
    )
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    gammas = args.gammas or [args.gamma]
    torch.set_num_threads(args.threads)
    model_dir = Path(args.model_dir)
    draft, target, tok = load_pair(model_dir / "draft", model_dir / "target", dtype=args.dtype)
    eos = set(stop_token_ids(tok, target))
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(eos)
    records = load_records(
        "instructions", max(args.batch, *args.sweep, 1), numpy_rng(args.seed, "bench")
    )
    prompts = [chat_token_ids(tok, r.prompt) for r in records]
    few = prompts[: args.prompts]

    def hf(prompt_list, batch, **kw):
        outs = []
        for start in range(0, len(prompt_list), batch):
            chunk = prompt_list[start : start + batch]
            width = max(len(p) for p in chunk)
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
            with torch.inference_mode():
                gen = target.generate(
                    ids,
                    attention_mask=mask,
                    max_new_tokens=args.new,
                    do_sample=False,
                    eos_token_id=sorted(eos),
                    pad_token_id=pad,
                    **kw,
                )
            outs += [_cut(row[width:].tolist(), eos, args.new) for row in gen]
        return outs

    def engine(prompt_list, batch, gamma=args.gamma):
        cfg = DecodingConfig(
            max_new_tokens=args.new,
            temperature=0.0,
            batch_size=batch,
            eos_token_ids=sorted(eos),
            pad_token_id=pad,
        )
        outs, _ = generate_rounds(
            prompt_list, cfg, torch_generator(args.seed, "bench"), draft, target, gamma
        )
        return outs

    fixed = {
        "num_assistant_tokens": args.gamma,
        "num_assistant_tokens_schedule": "constant",
        "assistant_confidence_threshold": 0.0,
    }
    methods = [
        ("target-only generate", 1, few, lambda p: hf(p, 1)),
        ("HF assisted, default drafting", 1, few, lambda p: hf(p, 1, assistant_model=draft)),
        (
            f"HF assisted, gamma = {args.gamma}",
            1,
            few,
            lambda p: hf(p, 1, assistant_model=draft, **fixed),
        ),
        *((f"engine, gamma = {g}", 1, few, lambda p, g=g: engine(p, 1, g)) for g in gammas),
        ("target-only generate", args.batch, prompts, lambda p: hf(p, args.batch)),
        (f"engine, gamma = {args.gamma}", args.batch, prompts, lambda p: engine(p, args.batch)),
    ]
    for _, _, prompt_list, run in methods:
        run(prompt_list[:1])  # warm-up: first calls allocate and pick kernels
    outputs: dict[tuple[str, int], list[list[int]]] = {}
    timings: dict[tuple[str, int], list[dict[str, float]]] = {(m[0], m[1]): [] for m in methods}
    for repeat in range(args.repeats):
        shift = repeat % len(methods)
        for label, batch, prompt_list, run in methods[shift:] + methods[:shift]:
            _reset_peak_rss()
            with ForwardClock(draft, target) as clock:
                start = time.perf_counter()
                out = run(prompt_list)
                elapsed = time.perf_counter() - start
            outputs.setdefault((label, batch), out)
            timings[(label, batch)].append(
                {
                    **clock.seconds,
                    "total": elapsed,
                    "tokens": sum(len(o) for o in out),
                    "rss": _peak_rss_gib(),
                }
            )
            print(
                f"repeat {repeat + 1}: {label} (batch {batch}): "
                f"{timings[(label, batch)][-1]['tokens']} tokens in {elapsed:.1f} s",
                file=sys.stderr,
                flush=True,
            )

    flags = cpu_flags()
    summary = machine_summary(flags)
    native = native_bf16("cpu", flags)
    simd = " ".join(summary["simd"])
    caps = {
        name: os.environ[name]
        for name in ("ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
        if os.environ.get(name)
    }
    capped = f" with {' '.join(f'{k}={v}' for k, v in caps.items())}" if caps else ""
    print(f"`python bench/bench_engine.py {' '.join(sys.argv[1:])}`{capped}")
    print(f"\nCPU: {summary['processor']}, {summary['cpu_count']} cores, SIMD {simd}")
    print(
        f"native bf16: {native or 'no'}; dtype {args.dtype}; threads {args.threads}; "
        f"pair {model_dir}; at most {args.new} new tokens, EOS ends a row in every method\n"
    )
    reference = {
        1: outputs[("target-only generate", 1)],
        args.batch: outputs[("target-only generate", args.batch)],
    }
    print(
        f"{args.repeats} interleaved repeats per method: median [lowest to highest]; each ratio "
        "is taken within a repeat\n"
    )
    header = (
        "method",
        "batch",
        "prompts",
        "tokens",
        "seconds",
        "tokens/s",
        "vs target-only, same batch",
        "peak RSS (GiB)",
        "equal to target-only greedy",
    )
    print("| " + " | ".join(header) + " |\n" + "|---" * len(header) + "|")
    for label, batch, prompt_list, _ in methods:
        runs = timings[(label, batch)]
        base = timings[("target-only generate", batch)]
        rates = [r["tokens"] / r["total"] for r in runs]
        ratios = [rate / (b["tokens"] / b["total"]) for rate, b in zip(rates, base, strict=True)]
        n = len(prompt_list)
        ref = reference[batch][:n]
        same = sum(a == b for a, b in zip(outputs[(label, batch)], ref, strict=True))
        cells = (label, batch, n, int(runs[0]["tokens"]), _spread([r["total"] for r in runs], 1))
        cells += (_spread(rates, 2), _spread(ratios, 2, "x"), f"{max(r['rss'] for r in runs):.1f}")
        cells += (f"{same}/{n}",)
        print("| " + " | ".join(map(str, cells)) + " |")
    print("\nwhere the engine's time goes (seconds, median over repeats):\n")
    print("| method | batch | draft forwards | target forwards | everything else | total |")
    print("|---|---|---|---|---|---|")
    for label, batch, _, _ in methods:
        if not label.startswith("engine"):
            continue
        runs = timings[(label, batch)]
        draft_s, target_s, total = (
            statistics.median(r[key] for r in runs) for key in ("draft", "target", "total")
        )
        rest = statistics.median(r["total"] - r["draft"] - r["target"] for r in runs)
        print(f"| {label} | {batch} | {draft_s:.1f} | {target_s:.1f} | {rest:.1f} | {total:.1f} |")
    if args.sweep:
        print(
            "\ncrossover: tokens/s of target-only generate and of the engine (gamma = "
            f"{args.gamma}) by batch size, median [lowest to highest] over {args.repeats} "
            "interleaved repeats\n"
        )
        print("| batch | target-only generate | engine | engine / target-only |\n|---|---|---|---|")
        for batch in args.sweep:
            chunk = prompts[:batch]
            pair = (lambda p, b=batch: hf(p, b), lambda p, b=batch: engine(p, b))
            for run in pair:
                run(chunk[:1])
            rates: list[list[float]] = [[], []]
            for repeat in range(args.repeats):
                for which in (0, 1) if repeat % 2 == 0 else (1, 0):
                    start = time.perf_counter()
                    out = pair[which](chunk)
                    rates[which].append(sum(len(o) for o in out) / (time.perf_counter() - start))
            ratios = [e / t for t, e in zip(rates[0], rates[1], strict=True)]
            print(
                f"| {batch} | {_spread(rates[0], 2)} | {_spread(rates[1], 2)} | "
                f"{_spread(ratios, 2, 'x')} |",
                flush=True,
            )


def _spread(values: list[float], digits: int, unit: str = "") -> str:
    """The median and, with more than one value, the range: "1.23x [1.10x to 1.30x]"."""
    median = f"{statistics.median(values):.{digits}f}{unit}"
    if len(values) < 2:
        return median
    return f"{median} [{min(values):.{digits}f}{unit} to {max(values):.{digits}f}{unit}]"


if __name__ == "__main__":
    main()
