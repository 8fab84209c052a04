"""Throughput of the speculative engine against Hugging Face decoding on a real pair, fairly.

Every method decodes the same chat prompts greedily, in the same dtype, up to ``--new`` new
tokens or the pair's end-of-reply tokens, whichever comes first (EOS ends a row in every
method, so they do the same work), after one warm-up of its own. Methods:

- target-only ``generate`` at batch 1 and at ``--batch`` (left-padded);
- Hugging Face assisted generation (``assistant_model=``) at batch 1, with its default
  adaptive drafting and with a fixed gamma;
- this engine (greedy gamma-token rounds) at batch 1 (every gamma of ``--gammas``) and at
  ``--batch`` (``--gamma``);
- with ``--int8-draft``, the assisted and engine methods again with the draft's linear layers
  int8 dynamic-quantised (``models.quantize: int8_dynamic_draft``; the target is unchanged, so
  every method's output is still the target's greedy output).

With ``--dtype float32 --layout transposed`` every method's models multiply by the transposed
float32 weights through numpy's BLAS, as the workflow's model jobs do where rule
``select_dtype`` found that faster (``edgespec.models.layout``).

Timing on a shared machine drifts by more than the differences measured here, so every method
runs ``--repeats`` times, interleaved, and a ratio is taken within a repeat (each method against
target-only ``generate`` of the same repeat). Within a repeat the batch-1 methods take turns
prompt by prompt (each prompt is decoded by every batch-1 method in an order rotated from one
prompt and one repeat to the next), so the runs a ratio compares lie seconds apart; the batched
methods then run once each, in an order rotated from one repeat to the next. The tables give the
median and, in brackets, the range over repeats; a second table pools each batch-1 method's
tokens and seconds over every prompt and repeat, with a bootstrap interval over prompts.

Prints Markdown tables: tokens/s, ratios, peak resident memory, how many outputs equal
target-only greedy, where the engine's time goes (draft forwards, target forwards, the rest),
what speculation saves and costs against target-only ``generate`` at the same batch (every
forward of both models is timed by hooks, so the target's decoding steps of ``generate`` and
the engine's verifications are counted and priced alike: the target forwards saved, the extra
width of each verification, the drafting), and, with ``--sweep``, the engine against
target-only ``generate`` over batch sizes, which shows the crossover batch size where
speculation stops paying on this machine.

    python bench/bench_engine.py --model-dir resources/models/qwen25coder --dtype bfloat16
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from edgespec.data.chat import chat_token_ids
from edgespec.data.prepare import load_records
from edgespec.decoding.config import DecodingConfig
from edgespec.decoding.rounds import generate_rounds
from edgespec.intervals import Interval, bootstrap_interval
from edgespec.models.cpu_linear import packing_supported, reorder_all_weights
from edgespec.models.load import (
    load_model,
    load_pair,
    pair_source,
    resolve_torch_dtype,
    stop_token_ids,
    use_transposed_layout,
)
from edgespec.models.precision import cpu_flags, machine_summary, native_bf16, quantize_model
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
    """Every forward pass of the draft and the target while active, by any method (the engine,
    Hugging Face ``generate``, assisted generation): role, rows, new tokens per row, seconds."""

    def __init__(self, *models: tuple[str, torch.nn.Module]):
        self.calls: list[tuple[str, int, int, float]] = []
        self._models = models
        self._handles = []
        self._open: tuple[str, int, int, float] | None = None

    def __enter__(self):
        for role, model in self._models:

            def before(module, args, kwargs, role=role):
                ids = kwargs.get("input_ids", args[0] if args else None)
                rows, width = (0, 0) if ids is None else tuple(ids.shape)
                self._open = (role, rows, width, time.perf_counter())

            def after(module, args, kwargs, output):
                role, rows, width, start = self._open
                self.calls.append((role, rows, width, time.perf_counter() - start))

            self._handles.append(model.register_forward_pre_hook(before, with_kwargs=True))
            self._handles.append(model.register_forward_hook(after, with_kwargs=True))
        return self

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def seconds(self, role: str, widest: int | None = None, prefill: bool | None = None) -> float:
        """Seconds in ``role``'s forwards; ``prefill`` True/False keeps only the forwards that
        feed more / at most ``widest`` tokens per row (a prompt against a decoding step)."""
        return sum(s for r, _, w, s in self._select(role, widest, prefill))

    def count(self, role: str, widest: int | None = None, prefill: bool | None = None) -> int:
        return len(self._select(role, widest, prefill))

    def _select(self, role, widest, prefill):
        calls = [c for c in self.calls if c[0] == role]
        if prefill is None:
            return calls
        return [c for c in calls if (c[2] > widest) == prefill]


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
        "--int8-draft",
        action="store_true",
        help="also run assisted generation and the engine with an int8 dynamic-quantised draft "
        "(float32 weights quantised; the target stays in --dtype)",
    )
    ap.add_argument(
        "--reorder-float32",
        action="store_true",
        help="reorder float32 linear weights once for oneDNN, in every method's models (the "
        "workflow keeps them plain: edgespec.models.cpu_linear)",
    )
    ap.add_argument(
        "--layout",
        choices=["plain", "transposed"],
        default="plain",
        help="float32 linear weights as stored, or transposed and multiplied by numpy's BLAS "
        "(edgespec.models.layout; what rule select_dtype picks where it is faster), in every "
        "method's models; on the AVX2 EPYC its one-token steps were faster at --threads 1 (its "
        "few-token verifications were not) and about 2x slower at 2",
    )
    ap.add_argument(
        "--sweep", type=int, nargs="*", default=[], help="batch sizes for the crossover table"
    )
    ap.add_argument(
        "--conclude",
        type=Path,
        metavar="OUTPUT",
        help="only print the verdicts read off a saved output of this script",
    )
    args = ap.parse_args()
    if args.conclude is not None:
        print("\n".join(conclusions(args.conclude.read_text())))
        return
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    if args.prompts < 1:
        ap.error("--prompts must be >= 1")
    if args.batch < 2:
        ap.error("--batch must be >= 2 (the batch-1 methods always run)")
    if args.layout == "transposed" and (args.dtype != "float32" or args.reorder_float32):
        ap.error("--layout transposed needs --dtype float32 and no --reorder-float32")
    gammas = args.gammas or [args.gamma]
    torch.set_num_threads(args.threads)
    model_dir = Path(args.model_dir)
    draft, target, tok = load_pair(model_dir / "draft", model_dir / "target", dtype=args.dtype)
    int8_draft = None
    if args.int8_draft:
        float_draft = (
            copy.deepcopy(draft)
            if args.dtype == "float32"
            else load_model(model_dir / "draft", "float32", "draft")
        )
        int8_draft = quantize_model(float_draft, "int8_dynamic")
    if args.reorder_float32:
        for model in (draft, target):
            reorder_all_weights(model)
    if args.layout == "transposed":
        # After the int8 draft's copy: quantize_dynamic needs the weights as stored.
        float32_pair = pair_source(model_dir, "float32")
        use_transposed_layout(
            {"draft": draft, "target": target},
            {"draft": float32_pair, "target": float32_pair},
            threads=args.threads,
        )
    eos = set(stop_token_ids(tok, target))
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(eos)
    records = load_records(
        "instructions", max(args.batch, args.prompts, *args.sweep), numpy_rng(args.seed, "bench")
    )
    prompts = [chat_token_ids(tok, r.prompt) for r in records]
    few = prompts[: args.prompts]
    batch_prompts = prompts[: args.batch]

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

    def engine(prompt_list, batch, gamma=args.gamma, draft=draft):
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
        ("target-only generate", args.batch, batch_prompts, lambda p: hf(p, args.batch)),
        (
            f"engine, gamma = {args.gamma}",
            args.batch,
            batch_prompts,
            lambda p: engine(p, args.batch),
        ),
    ]
    if int8_draft is not None:
        methods += [
            (
                f"HF assisted, int8 draft, gamma = {args.gamma}",
                1,
                few,
                lambda p: hf(p, 1, assistant_model=int8_draft, **fixed),
            ),
            *(
                (
                    f"engine, int8 draft, gamma = {g}",
                    1,
                    few,
                    lambda p, g=g: engine(p, 1, g, int8_draft),
                )
                for g in gammas
            ),
            (
                f"engine, int8 draft, gamma = {args.gamma}",
                args.batch,
                batch_prompts,
                lambda p: engine(p, args.batch, draft=int8_draft),
            ),
        ]
    drafts = [("draft", draft)] + ([("draft", int8_draft)] if int8_draft is not None else [])
    widest = max(*gammas, args.gamma) + 1  # a forward feeding more per row is a prefill
    for _, _, prompt_list, run in methods:
        run(prompt_list[:1])  # warm-up: first calls allocate and pick kernels
    outputs: dict[tuple[str, int], list[list[int]]] = {}
    timings: dict[tuple[str, int], list[dict[str, float]]] = {(m[0], m[1]): [] for m in methods}
    singles = [m for m in methods if m[1] == 1]
    batched = [m for m in methods if m[1] != 1]
    # per batch-1 method and prompt, [tokens, seconds] summed over repeats
    per_prompt = {(label, batch): [[0, 0.0] for _ in few] for label, batch, _, _ in singles}

    def timed(label, batch, prompt_list, run):
        _reset_peak_rss()
        with ForwardClock(*drafts, ("target", target)) as clock:
            start = time.perf_counter()
            out = run(prompt_list)
            elapsed = time.perf_counter() - start
        record = {
            "draft": clock.seconds("draft"),
            "target": clock.seconds("target"),
            **{
                f"{role}_{part}_{kind}": getattr(clock, kind)(role, widest, part == "prefill")
                for role in ("draft", "target")
                for part in ("prefill", "steps")
                for kind in ("seconds", "count")
            },
            "total": elapsed,
            "tokens": sum(len(o) for o in out),
            "rss": _peak_rss_gib(),
        }
        return out, record

    for repeat in range(args.repeats):
        # Batch-1 methods take turns prompt by prompt, so that the runs a ratio compares lie
        # seconds apart, not minutes: a shared machine's speed drifts over minutes.
        sums: dict[tuple[str, int], dict[str, float]] = {}
        singles_out: dict[tuple[str, int], list[list[int]]] = {}
        for i, prompt in enumerate(few):
            shift = (repeat + i) % len(singles)
            for label, batch, _, run in singles[shift:] + singles[:shift]:
                out, record = timed(label, batch, [prompt], run)
                singles_out.setdefault((label, batch), []).extend(out)
                total = sums.setdefault((label, batch), dict.fromkeys(record, 0.0))
                add_run(total, per_prompt[(label, batch)][i], record)
        for key, total in sums.items():
            outputs.setdefault(key, singles_out[key])
            timings[key].append(total)
            _log_run(repeat, key, total)
        shift = repeat % max(len(batched), 1)
        for label, batch, prompt_list, run in batched[shift:] + batched[:shift]:
            out, record = timed(label, batch, prompt_list, run)
            outputs.setdefault((label, batch), out)
            timings[(label, batch)].append(record)
            _log_run(repeat, (label, batch), record)

    printed = io.StringIO()
    with contextlib.redirect_stdout(_Tee(sys.stdout, printed)):
        _report(
            args, methods, timings, outputs, per_prompt, gammas, prompts, hf, engine, int8_draft
        )
    print("\nverdicts:\n")
    print("\n".join(f"- {line}" for line in conclusions(printed.getvalue())))


class _Tee(io.TextIOBase):
    def __init__(self, *streams):
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()


def _report(
    args, methods, timings, outputs, per_prompt, gammas, prompts, hf, engine, int8_draft
) -> None:
    """Print the tables of a finished benchmark (and run the crossover sweep)."""
    model_dir = Path(args.model_dir)
    flags = cpu_flags()
    summary = machine_summary(flags)
    native = native_bf16("cpu", flags)
    simd = " ".join(summary["simd"])
    caps = {
        name: os.environ[name]
        for name in ("ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "FBGEMM_ENABLE_INSTRUCTIONS")
        if os.environ.get(name)
    }
    if args.layout == "transposed":
        layout = "transposed, multiplied by numpy's BLAS"
    elif packing_supported(resolve_torch_dtype(args.dtype)) or args.reorder_float32:
        layout = "reordered once for oneDNN"
    else:
        layout = "in their plain layout"
    capped = f" with {' '.join(f'{k}={v}' for k, v in caps.items())}" if caps else ""
    print(f"`python bench/bench_engine.py {' '.join(sys.argv[1:])}`{capped}")
    print(f"\nCPU: {summary['processor']}, {summary['cpu_count']} cores, SIMD {simd}")
    print(
        f"native bf16: {native or 'no'}; dtype {args.dtype}; threads {args.threads}; "
        f"linear weights {layout}; pair {model_dir}; at most {args.new} new tokens, EOS ends a "
        "row in every method\n"
    )
    reference = {
        1: outputs[("target-only generate", 1)],
        args.batch: outputs[("target-only generate", args.batch)],
    }
    print(
        f"{args.repeats} interleaved repeats per method: median [lowest to highest]; each ratio "
        "is taken within a repeat\n"
    )
    _print_header(
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
    _print_paired(args, per_prompt)
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
    _print_balance(methods, timings)
    if args.sweep:
        print(
            "\ncrossover: tokens/s of target-only generate and of the engine (gamma = "
            f"{args.gamma}) by batch size, median [lowest to highest] over {args.repeats} "
            "interleaved repeats\n"
        )
        extra = " engine, int8 draft | int8 draft / target-only |" if int8_draft else ""
        print(
            f"| batch | target-only generate | engine | engine / target-only |{extra}\n"
            + "|---" * (4 + 2 * bool(int8_draft))
            + "|"
        )
        for batch in args.sweep:
            chunk = prompts[:batch]
            runs = [lambda p, b=batch: hf(p, b), lambda p, b=batch: engine(p, b)]
            if int8_draft is not None:
                runs.append(lambda p, b=batch: engine(p, b, draft=int8_draft))
            for run in runs:
                run(chunk[:1])
            rates: list[list[float]] = [[] for _ in runs]
            for repeat in range(args.repeats):
                shift = repeat % len(runs)
                for which in [*range(len(runs))][shift:] + [*range(len(runs))][:shift]:
                    start = time.perf_counter()
                    out = runs[which](chunk)
                    rates[which].append(sum(len(o) for o in out) / (time.perf_counter() - start))
            cells = [_spread(rates[0], 2)]
            for engine_rates in rates[1:]:
                ratios = [e / t for t, e in zip(rates[0], engine_rates, strict=True)]
                cells += [_spread(engine_rates, 2), _spread(ratios, 2, "x")]
            print(f"| {batch} | " + " | ".join(cells) + " |", flush=True)


def add_run(total: dict[str, float], tally: list[float], record: dict[str, float]) -> None:
    """Add one prompt's run (``record``) of a batch-1 method to its repeat's ``total`` (times
    and counts summed, peak RSS the largest) and to that prompt's ``tally`` [tokens, seconds]."""
    for key, value in record.items():
        total[key] = max(total[key], value) if key == "rss" else total[key] + value
    tally[0] += record["tokens"]
    tally[1] += record["total"]


def _log_run(repeat: int, key: tuple[str, int], record: dict[str, float]) -> None:
    label, batch = key
    print(
        f"repeat {repeat + 1}: {label} (batch {batch}): {record['tokens']:.0f} tokens in "
        f"{record['total']:.1f} s",
        file=sys.stderr,
        flush=True,
    )


def pooled_ratio(
    method: list[tuple[float, float]],
    base: list[tuple[float, float]],
    rng: np.random.Generator,
) -> Interval:
    """Tokens/s of a method over tokens/s of target-only ``generate``, each pooled over every
    prompt and repeat (``method`` and ``base``: [tokens, seconds] per prompt, summed over
    repeats), with a percentile bootstrap interval over prompts (a resampled prompt brings
    every repeat of both methods with it, so the pairing is kept)."""
    ours, theirs = np.asarray(method, dtype=float), np.asarray(base, dtype=float)
    if ours.shape != theirs.shape or ours.ndim != 2 or ours.shape[1] != 2:
        raise ValueError("pooled_ratio needs [tokens, seconds] per prompt for both methods")

    def ratio(idx: np.ndarray) -> np.ndarray:
        picked = idx.astype(int)
        a, b = ours[picked].sum(axis=-2), theirs[picked].sum(axis=-2)
        return (a[..., 0] / a[..., 1]) / (b[..., 0] / b[..., 1])

    return bootstrap_interval(np.arange(len(ours)), rng, statistic=ratio, vectorized=True)


def _print_paired(args, per_prompt) -> None:
    base = per_prompt[("target-only generate", 1)]
    n = len(base)
    print(
        "\nbatch 1, pooled over prompts and repeats: tokens/s against target-only generate, "
        f"all {n} prompts x {args.repeats} repeats of each method summed (each prompt was run "
        "by every batch-1 method in turn, so the runs compared lie seconds apart), with a 95% "
        f"bootstrap interval over the {n} prompts:\n"
    )
    _print_header("method", "batch", "pooled vs target-only", "95% interval over prompts")
    for (label, batch), per in per_prompt.items():
        if label == "target-only generate":
            continue
        # One seed for every method: each interval resamples the same prompts (common random
        # numbers), so two methods' intervals differ by their timings alone.
        interval = pooled_ratio(per, base, numpy_rng(args.seed, "bench", "bootstrap"))
        print(
            f"| {label} | {batch} | {interval.point:.2f}x | {interval.low:.2f}x to "
            f"{interval.high:.2f}x |"
        )


def _table_rows(text: str, header: str) -> list[list[str]]:
    """The cells of every row of the first Markdown table whose header row starts with the
    cells ``header`` ("method | batch | prompts"), the header and the rule excluded."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(f"| {header} |"):
            rows = []
            for row in lines[i + 2 :]:
                if not row.startswith("|"):
                    break
                rows.append([cell.strip() for cell in row.strip("|").split("|")])
            return rows
    return []


def _median_of(cell: str) -> float:
    """The median of a cell such as "0.84x [0.75x to 0.87x]" or "+10.0"."""
    return float(cell.split()[0].rstrip("x"))


def conclusions(text: str) -> list[str]:
    """Sentences that read the verdicts off a finished benchmark's output (its Markdown
    ``text``): which cost dominates where the engine loses, and the crossover batch size."""
    out = []
    balance = _table_rows(text, "method | batch | target-only steps (forwards x ms)")
    for method, batch, steps, verifications, saved, width, drafting, _, net in balance:
        saved_s, width_s, drafting_s, net_s = map(float, (saved, width, drafting, net))
        larger = "drafting" if drafting_s >= width_s else "the wider verifications"
        verdict = "behind" if net_s > 0 else "ahead of"
        out.append(
            f"{method}, batch {batch}: {abs(net_s):.1f} s {verdict} target-only generate; "
            f"fewer target forwards save {saved_s:.1f} s, drafting costs {drafting_s:.1f} s and "
            f"the wider verifications {width_s:.1f} s: {larger} is the larger cost."
        )
        need = _what_the_goal_needs(steps, verifications, drafting_s)
        if need:
            out.append(f"{method}, batch {batch}: {need}")
    out += _paired_verdicts(_table_rows(text, "method | batch | pooled vs target-only"))
    caption = next((line for line in text.splitlines() if line.startswith("crossover:")), None)
    sweep = _table_rows(text, "batch | target-only generate")
    if caption and sweep and "(gamma = " in caption:
        gamma = caption.split("(gamma = ")[1].split(")")[0]
        # the sweep's ratio columns: the engine's, then (--int8-draft) the int8 draft's
        for engine, column in (("engine", 3), ("engine, int8 draft", 5)):
            if len(sweep[0]) <= column:
                continue
            out.append(_crossover(text, sweep, gamma, engine, column))
    return out


def _paired_verdicts(rows: list[list[str]]) -> list[str]:
    """Each engine's pooled batch-1 ratio against :data:`GOAL_SPEEDUP` (met only where the
    whole interval clears it) and against the best Hugging Face assisted method's with the
    same draft."""
    pooled = {}
    for method, _, point, interval in rows:
        low, high = (float(v.rstrip("x")) for v in interval.split(" to "))
        pooled[method] = (float(point.rstrip("x")), low, high)
    out = []
    for method, (point, low, high) in pooled.items():
        if not method.startswith("engine"):
            continue
        int8 = "int8 draft" in method  # each engine against the assisted runs of its own draft
        assisted = {
            m: v
            for m, v in pooled.items()
            if m.startswith("HF assisted") and ("int8 draft" in m) == int8
        }
        if low >= GOAL_SPEEDUP:
            goal = f"meets the {GOAL_SPEEDUP}x goal"
        elif high < GOAL_SPEEDUP:
            goal = f"falls short of the {GOAL_SPEEDUP}x goal"
        else:
            goal = f"the interval straddles the {GOAL_SPEEDUP}x goal (undecided)"
        line = (
            f"{method}, batch 1, pooled: {point:.2f}x target-only generate ({low:.2f}x to "
            f"{high:.2f}x over prompts): {goal}"
        )
        if assisted:
            best = max(assisted, key=lambda m: assisted[m][0])
            theirs = assisted[best][0]
            side = "ahead of" if point > theirs else "level with" if point == theirs else "behind"
            line += f"; {side} the best assisted method, {best} ({theirs:.2f}x)"
        out.append(line + ".")
    return out


def _crossover(text: str, sweep: list[list[str]], gamma: str, engine: str, column: int) -> str:
    """The verdict on where ``engine`` (a method name without its gamma) stops keeping up with
    target-only ``generate``: its batch-1 and batched rows, then the sweep's ``column``."""
    ratios = {}
    for row in _table_rows(text, "method | batch | prompts"):  # batch 1 and --batch
        if row[0] == f"{engine}, gamma = {gamma}":
            ratios[int(row[1])] = _median_of(row[6])
    for row in sweep:
        ratios[int(row[0])] = _median_of(row[column])
    ordered = sorted(ratios.items())
    behind = [b for b, r in ordered if r < 1.0]
    ahead = [b for b, r in ordered if r >= 1.0]
    listing = ", ".join(f"{r:.2f}x at batch {b}" for b, r in ordered)
    if behind and ahead and max(ahead) < min(behind):
        where = f"ahead up to batch {max(ahead)}, behind from batch {min(behind)} on"
    elif not behind:
        where = "ahead at every batch size measured"
    elif not ahead:
        where = "behind at every batch size measured"
    else:
        where = "ahead and behind alternately (no single crossover)"
    return (
        f"crossover ({engine} at gamma = {gamma} against target-only generate, medians): "
        f"{where}; {listing}."
    )


GOAL_SPEEDUP = 1.3
"""The decoding speed-up over target-only ``generate`` the verdicts price (the project's batch-1
target)."""


def _what_the_goal_needs(steps: str, verifications: str, drafting_s: float) -> str | None:
    """Where the engine's decoding forwards fall short of :data:`GOAL_SPEEDUP` over target-only
    decoding, what would reach it with the same number of verifications: the costliest
    verification at the same drafting, or the most the drafting may cost at the same
    verifications. ``steps`` and ``verifications`` are cells "forwards x ms" of the balance
    table; None where the goal is met."""
    n0, c0 = (float(v) for v in steps.split(" x "))
    nv, cv = (float(v) for v in verifications.split(" x "))
    target_only_s, verifying_s = n0 * c0 / 1000, nv * cv / 1000
    budget = target_only_s / GOAL_SPEEDUP  # seconds of decoding forwards the goal allows
    if nv == 0 or verifying_s + drafting_s <= budget:
        return None
    speedup = target_only_s / (verifying_s + drafting_s)
    largest_cv = 1000 * (budget - drafting_s) / nv
    if largest_cv <= 0:
        return (
            f"its decoding forwards run {speedup:.2f}x target-only's; its drafting alone "
            f"({drafting_s:.1f} s) takes longer than {GOAL_SPEEDUP}x allows for all decoding "
            f"forwards ({budget:.1f} s)."
        )
    below_a_step = " (less than a one-token step)" if largest_cv < c0 else ""
    drafting_left = budget - verifying_s
    alternative = (
        f"or drafting of at most {drafting_left:.1f} s at these verifications (now "
        f"{drafting_s:.1f} s)"
        if drafting_left > 0
        else f"and no drafting would do at these verifications ({verifying_s:.1f} s alone)"
    )
    return (
        f"its decoding forwards run {speedup:.2f}x target-only's; {GOAL_SPEEDUP}x would need "
        f"verifications of at most {largest_cv:.0f} ms{below_a_step} at this drafting "
        f"(now {cv:.0f} ms, a one-token step {c0:.0f} ms), {alternative}."
    )


def _print_header(*names: str) -> None:
    print("| " + " | ".join(names) + " |\n" + "|---" * len(names) + "|")


def _balance(run: dict[str, float], base: dict[str, float]) -> dict[str, float]:
    """What speculation saves and costs in one engine run against target-only ``generate`` at
    the same batch in the same repeat (seconds): fewer target decoding forwards save
    (n0 - nv) * c0, the verifications being wider than one-token steps costs nv * (cv - c0),
    drafting costs every draft forward; "rest" is what remains of the net difference (prefill
    differences, the engine's own bookkeeping)."""
    n0, nv = base["target_steps_count"], run["target_steps_count"]
    c0 = base["target_steps_seconds"] / max(n0, 1)
    cv = run["target_steps_seconds"] / max(nv, 1)
    saved = (n0 - nv) * c0
    width = nv * (cv - c0)
    drafting = run["draft_prefill_seconds"] + run["draft_steps_seconds"]
    net = run["total"] - base["total"]
    return {
        "n0": n0,
        "c0": 1000 * c0,
        "nv": nv,
        "cv": 1000 * cv,
        "saved": saved,
        "width": width,
        "drafting": drafting,
        "rest": net - (width + drafting - saved),
        "net": net,
    }


def _print_balance(methods, timings) -> None:
    print(
        "\nwhat speculation saves and costs against target-only generate at the same batch "
        "(decoding forwards after the prompt's prefill; seconds, median over repeats, so a "
        "row need not add up exactly):\n"
    )
    _print_header(
        "method",
        "batch",
        "target-only steps (forwards x ms)",
        "verifications (forwards x ms)",
        "fewer target forwards save",
        "wider verifications cost",
        "drafting costs",
        "everything else",
        "net vs target-only",
    )
    for label, batch, _, _ in methods:
        if not label.startswith("engine"):
            continue
        rows = [
            _balance(run, base)
            for run, base in zip(
                timings[(label, batch)], timings[("target-only generate", batch)], strict=True
            )
        ]
        med = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
        print(
            f"| {label} | {batch} | {med['n0']:.0f} x {med['c0']:.0f} | "
            f"{med['nv']:.0f} x {med['cv']:.0f} | {med['saved']:.1f} | {med['width']:.1f} | "
            f"{med['drafting']:.1f} | {med['rest']:+.1f} | {med['net']:+.1f} |"
        )


def _spread(values: list[float], digits: int, unit: str = "") -> str:
    """The median and, with more than one value, the range: "1.23x [1.10x to 1.30x]"."""
    median = f"{statistics.median(values):.{digits}f}{unit}"
    if len(values) < 2:
        return median
    return f"{median} [{min(values):.{digits}f}{unit} to {max(values):.{digits}f}{unit}]"


if __name__ == "__main__":
    main()
