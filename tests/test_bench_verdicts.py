"""The engine benchmark's verdicts (bench/bench_engine.py, not part of the package), read off a
saved output, against hand-computed cases."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_engine.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_engine", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HEADER = (
    "| method | batch | target-only steps (forwards x ms) | verifications (forwards x ms) | "
    "fewer target forwards save | wider verifications cost | drafting costs | everything else "
    "| net vs target-only |\n" + "|---" * 9 + "|\n"
)
BALANCE = (
    "what speculation saves and costs\n\n"
    + HEADER
    + "| engine, gamma = 2 | 1 | 62 x 323 | 27 x 534 | 11.3 | 5.7 | 8.1 | +0.0 | +2.5 |\n"
    + "| engine, gamma = 4 | 1 | 62 x 323 | 20 x 330 | 13.6 | 0.1 | 2.0 | +0.0 | -11.5 |\n"
    + "| engine, gamma = 4 | 16 | 31 x 897 | 13 x 1649 | 16.1 | 8.7 | 17.5 | -15.8 | -7.4 |\n"
)


def test_verdicts_price_what_the_goal_needs(bench):
    lines = bench.conclusions(BALANCE)
    # 62 x 0.323 s = 20.03 s of target-only steps; 1.3x allows 15.40 s. The engine spends
    # 27 x 0.534 + 8.1 = 22.52 s (0.89x): verifications of at most (15.40 - 8.1) / 27 = 271 ms,
    # or drafting of at most 15.40 - 14.42 = 1.0 s.
    assert lines[0].startswith("engine, gamma = 2, batch 1: 2.5 s behind target-only generate")
    assert "drafting is the larger cost" in lines[0]
    assert lines[1] == (
        "engine, gamma = 2, batch 1: its decoding forwards run 0.89x target-only's; 1.3x would "
        "need verifications of at most 271 ms (less than a one-token step) at this drafting "
        "(now 534 ms, a one-token step 323 ms), or drafting of at most 1.0 s at these "
        "verifications (now 8.1 s)."
    )
    # 20 x 0.330 + 2.0 = 8.6 s <= 15.40 s: the goal is met, no second line
    assert lines[2].startswith("engine, gamma = 4, batch 1: 11.5 s ahead of")
    # 31 x 0.897 = 27.81 s, 1.3x allows 21.39 s: (21.39 - 17.5) / 13 = 299 ms, and 13 x 1.649 =
    # 21.44 s of verifications alone
    assert lines[3].startswith("engine, gamma = 4, batch 16: 7.4 s ahead of")
    assert lines[4].endswith(
        "verifications of at most 299 ms (less than a one-token step) at this drafting (now "
        "1649 ms, a one-token step 897 ms), and no drafting would do at these verifications "
        "(21.4 s alone)."
    )
    assert len(lines) == 5


def test_drafting_alone_over_the_goal(bench):
    # 10 x 0.1 = 1.0 s of steps allow 0.77 s; drafting alone takes 0.9 s
    line = bench._what_the_goal_needs("10 x 100", "4 x 150", 0.9)
    assert line == (
        "its decoding forwards run 0.67x target-only's; its drafting alone (0.9 s) takes longer "
        "than 1.3x allows for all decoding forwards (0.8 s)."
    )
    assert bench._what_the_goal_needs("10 x 100", "0 x 0", 0.0) is None


MAIN = (
    "| method | batch | prompts | tokens | seconds | tokens/s | vs target-only, same batch | "
    "peak RSS (GiB) | equal to target-only greedy |\n" + "|---" * 9 + "|\n"
    "| target-only generate | 1 | 2 | 64 | 22.0 | 2.91 | 1.00x | 8.6 | 2/2 |\n"
    "| engine, gamma = 4 | 1 | 2 | 64 | 27.0 | 2.37 | 0.81x [0.80x to 0.84x] | 8.6 | 2/2 |\n"
    "| engine, int8 draft, gamma = 4 | 1 | 2 | 64 | 16.0 | 4.00 | 1.38x | 8.6 | 2/2 |\n"
    "| engine, gamma = 4 | 16 | 16 | 492 | 48.0 | 10.25 | 1.15x | 8.7 | 16/16 |\n"
    "| engine, int8 draft, gamma = 4 | 16 | 16 | 492 | 40.0 | 12.30 | 1.40x | 8.7 | 16/16 |\n"
)
SWEEP = (
    "crossover: tokens/s of target-only generate and of the engine (gamma = 4) by batch size\n\n"
    "| batch | target-only generate | engine | engine / target-only | engine, int8 draft | "
    "int8 draft / target-only |\n" + "|---" * 6 + "|\n"
    "| 2 | 3.43 | 3.43 | 1.01x [0.97x to 1.09x] | 4.10 | 1.20x |\n"
    "| 8 | 8.93 | 7.54 | 0.86x | 8.00 | 0.90x |\n"
)


def test_crossover_verdicts_for_each_draft(bench):
    lines = bench.conclusions(MAIN + "\n" + SWEEP)
    assert lines == [
        "crossover (engine at gamma = 4 against target-only generate, medians): ahead and "
        "behind alternately (no single crossover); 0.81x at batch 1, 1.01x at batch 2, 0.86x "
        "at batch 8, 1.15x at batch 16.",
        "crossover (engine, int8 draft at gamma = 4 against target-only generate, medians): "
        "ahead and behind alternately (no single crossover); 1.38x at batch 1, 1.20x at batch "
        "2, 0.90x at batch 8, 1.40x at batch 16.",
    ]
    # without the int8 draft's columns, one verdict
    plain = SWEEP.replace(" engine, int8 draft | int8 draft / target-only |", "")
    plain = "\n".join(
        line.rsplit("|", 3)[0] + "|" if line.startswith("| 2 ") or line.startswith("| 8 ") else line
        for line in plain.splitlines()
    )
    assert len(bench.conclusions(MAIN + "\n" + plain)) == 1


@pytest.mark.parametrize(
    "argv",
    [
        ["--layout", "transposed", "--dtype", "bfloat16"],
        ["--layout", "transposed", "--dtype", "float32", "--reorder-float32"],
    ],
)
def test_transposed_layout_is_refused_where_it_cannot_apply(bench, monkeypatch, capsys, argv):
    # Refused before any model loads: the folder named does not exist.
    monkeypatch.setattr("sys.argv", ["bench_engine.py", "--model-dir", "/nonexistent", *argv])
    with pytest.raises(SystemExit) as exit_info:
        bench.main()
    assert exit_info.value.code == 2
    assert "--layout transposed needs --dtype float32" in capsys.readouterr().err


def test_pooled_ratio_keeps_each_prompt_paired(bench):
    import numpy as np

    rng = np.random.default_rng(0)
    # Per prompt [tokens, seconds] summed over repeats. (10 + 10) / (1 + 2) tokens/s against
    # (10 + 10) / (2 + 2): 4/3. Resampling prompt 0 twice gives 10/1 against 10/2 = 2.0,
    # prompt 1 twice 10/2 against 10/2 = 1.0: the interval's ends.
    interval = bench.pooled_ratio([[10, 1.0], [10, 2.0]], [[10, 2.0], [10, 2.0]], rng)
    assert interval.point == pytest.approx(4 / 3)
    assert (interval.low, interval.high) == (pytest.approx(1.0), pytest.approx(2.0))
    # Every prompt twice as fast as its own target-only run, however slow the prompt: a paired
    # resample is always 2.0; resampling the two methods' prompts apart would spread it.
    interval = bench.pooled_ratio([[10, 1.0], [10, 4.0]], [[10, 2.0], [10, 8.0]], rng)
    assert (interval.point, interval.low, interval.high) == pytest.approx((2.0, 2.0, 2.0))
    with pytest.raises(ValueError, match="per prompt for both methods"):
        bench.pooled_ratio([[10, 1.0]], [[10, 2.0], [10, 2.0]], rng)


def test_every_method_resamples_the_same_prompts(bench, capsys):
    from types import SimpleNamespace

    # Two methods with the same per-prompt timings must get the same interval: their bootstrap
    # draws the same prompts (common random numbers), not draws of its own.
    base = [[10, 2.0], [10, 3.0], [10, 2.5], [10, 4.0], [10, 1.5]]
    method = [[10, 1.0], [10, 2.9], [10, 1.4], [10, 3.1], [10, 1.2]]
    per_prompt = {
        ("target-only generate", 1): base,
        ("engine, gamma = 2", 1): method,
        ("engine, gamma = 4", 1): method,
    }
    bench._print_paired(SimpleNamespace(seed=0, repeats=1), per_prompt)
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| engine")]
    assert len(rows) == 2
    assert rows[0].split("|")[3:] == rows[1].split("|")[3:]
    # and the interval has a width, so the equality above is not that of two points
    assert rows[0].split("|")[4].split("to")[0].strip() != rows[0].split("|")[3].strip()


PAIRED = (
    "| method | batch | pooled vs target-only | 95% interval over prompts |\n" + "|---" * 4 + "|\n"
    "| HF assisted, default drafting | 1 | 1.10x | 1.00x to 1.20x |\n"
    "| HF assisted, gamma = 4 | 1 | 1.15x | 1.05x to 1.25x |\n"
    "| engine, gamma = 2 | 1 | 1.40x | 1.31x to 1.52x |\n"
    "| engine, gamma = 4 | 1 | 1.35x | 1.20x to 1.45x |\n"
    "| HF assisted, int8 draft, gamma = 4 | 1 | 1.50x | 1.40x to 1.60x |\n"
    "| engine, int8 draft, gamma = 4 | 1 | 1.20x | 1.10x to 1.29x |\n"
    "| engine, int8 draft, gamma = 2 | 1 | 1.50x | 1.31x to 1.62x |\n"
)


def test_paired_verdicts_weigh_the_interval_and_each_draft(bench):
    assert bench.conclusions(PAIRED) == [
        "engine, gamma = 2, batch 1, pooled: 1.40x target-only generate (1.31x to 1.52x over "
        "prompts): meets the 1.3x goal; ahead of the best assisted method, HF assisted, "
        "gamma = 4 (1.15x).",
        "engine, gamma = 4, batch 1, pooled: 1.35x target-only generate (1.20x to 1.45x over "
        "prompts): the interval straddles the 1.3x goal (undecided); ahead of the best "
        "assisted method, HF assisted, gamma = 4 (1.15x).",
        # the int8 engine against the int8 assisted run only
        "engine, int8 draft, gamma = 4, batch 1, pooled: 1.20x target-only generate (1.10x to "
        "1.29x over prompts): falls short of the 1.3x goal; behind the best assisted method, "
        "HF assisted, int8 draft, gamma = 4 (1.50x).",
        # equal at the printed precision: level, neither ahead nor behind
        "engine, int8 draft, gamma = 2, batch 1, pooled: 1.50x target-only generate (1.31x to "
        "1.62x over prompts): meets the 1.3x goal; level with the best assisted method, HF "
        "assisted, int8 draft, gamma = 4 (1.50x).",
    ]


def test_a_prompt_run_adds_to_its_repeat_and_to_its_own_prompt(bench):
    total = dict.fromkeys(("tokens", "total", "draft", "rss"), 0.0)
    tallies = [[0, 0.0], [0, 0.0]]
    bench.add_run(total, tallies[1], {"tokens": 7, "total": 2.0, "draft": 0.5, "rss": 3.0})
    bench.add_run(total, tallies[0], {"tokens": 5, "total": 1.0, "draft": 0.25, "rss": 2.5})
    bench.add_run(total, tallies[1], {"tokens": 7, "total": 3.0, "draft": 0.5, "rss": 2.0})
    assert total == {"tokens": 19, "total": 6.0, "draft": 1.25, "rss": 3.0}
    assert tallies == [[5, 1.0], [14, 5.0]]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--prompts", "0"], "--prompts must be >= 1"),
        (["--batch", "1"], "--batch must be >= 2"),
        (["--repeats", "0"], "--repeats must be >= 1"),
    ],
)
def test_bad_sizes_are_refused_before_loading(bench, monkeypatch, capsys, argv, message):
    monkeypatch.setattr("sys.argv", ["bench_engine.py", "--model-dir", "/nonexistent", *argv])
    with pytest.raises(SystemExit) as exit_info:
        bench.main()
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_tiny_pair_runs_end_to_end(bench, float32_cache, monkeypatch, capsys):
    # More batch-1 prompts than the batch: every one is decoded, by every method.
    argv = ["--model-dir", str(float32_cache), "--dtype", "float32", "--gammas", "1", "2"]
    argv += ["--prompts", "3", "--batch", "2", "--repeats", "2", "--new", "4", "--threads", "1"]
    monkeypatch.setattr("sys.argv", ["bench_engine.py", *argv])
    tallied: dict[int, list[int]] = {}  # per tally: the tokens of each run added to it
    add_run = bench.add_run

    def spy(total, tally, record):
        tallied.setdefault(id(tally), []).append(int(record["tokens"]))
        add_run(total, tally, record)

    monkeypatch.setattr(bench, "add_run", spy)
    bench.main()
    out = capsys.readouterr().out
    # 4 batch-1 methods besides target-only's, 3 prompts each, each prompt tallied apart and
    # decoded once per repeat, to the same length every time
    assert len(tallied) == 5 * 3
    assert all(len(runs) == 2 and runs[0] == runs[1] for runs in tallied.values())
    main_rows = {(r[0], r[1]): r for r in bench._table_rows(out, "method | batch | prompts")}
    assert main_rows[("engine, gamma = 2", "1")][2] == "3"
    assert main_rows[("engine, gamma = 4", "2")][2] == "2"
    # greedy speculation is exact: every engine output is target-only greedy's
    assert all(r[-1] == f"{r[2]}/{r[2]}" for k, r in main_rows.items() if k[0].startswith("engine"))
    pooled = bench._table_rows(out, "method | batch | pooled vs target-only")
    assert [r[0] for r in pooled] == [
        "HF assisted, default drafting",
        "HF assisted, gamma = 4",
        "engine, gamma = 1",
        "engine, gamma = 2",
    ]
    verdicts = [line for line in bench.conclusions(out) if ", batch 1, pooled:" in line]
    assert len(verdicts) == 2
