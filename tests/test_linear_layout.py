"""float32 linear weights stored transposed (edgespec.models.cpu_linear, edgespec.models.layout,
edgespec.models.precision.choose_linear_layout): the same products to float32 rounding, a copy
on disk written once and memory-mapped, chosen only where the timed probe says so."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import edgespec.models.cachedir as cachedir_module
import edgespec.models.layout as layout_module
from edgespec.models.cpu_linear import (
    is_transposed,
    linear,
    plain_parameters,
    reorder_all_weights,
    transposed_weight,
)
from edgespec.models.layout import (
    LAYOUT_RECORD,
    TRANSPOSED_FILE,
    LayoutError,
    ensure_transposed,
    transposed_dir_of,
    use_transposed_weights,
    write_transposed,
)
from edgespec.models.load import load_model, load_pair_from_dir
from edgespec.models.precision import (
    LAYOUT_PROBE_ROUNDS,
    TRANSPOSED_MIN_GAIN,
    choose_linear_layout,
)
from edgespec.runconfig import model_settings


@pytest.mark.parametrize("shape", [(1, 24), (3, 24), (16, 24), (2, 5, 24), (0, 24)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_transposed_weights_give_f_linear_to_float32_rounding(shape, with_bias):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen)
    weight = torch.randn(40, 24, generator=gen)
    bias = torch.randn(40, generator=gen) if with_bias else None
    stored = transposed_weight(weight)
    assert is_transposed(stored) and torch.equal(stored, weight)
    exact = torch.nn.functional.linear(
        x.double(), weight.double(), None if bias is None else bias.double()
    )
    with torch.inference_mode():
        out = linear(x, stored, bias)
    assert out.shape == (*shape[:-1], 40) and out.dtype is torch.float32
    assert torch.allclose(out.double(), exact, rtol=1e-5, atol=1e-5)


def test_transposed_weights_go_through_numpy_and_only_for_inference(monkeypatch):
    calls = []
    real = np.matmul

    def spy(a, b, *args, **kwargs):
        calls.append(b.shape)
        return real(a, b, *args, **kwargs)

    monkeypatch.setattr(np, "matmul", spy)
    weight = torch.randn(6, 4)
    with torch.inference_mode():
        linear(torch.randn(3, 4), transposed_weight(weight))
        linear(torch.randn(3, 4), weight)  # stored as is: oneDNN
    assert calls == [(4, 6)]
    # with gradients the product stays differentiable (F.linear), and numpy is not called
    x = torch.randn(3, 4, requires_grad=True)
    linear(x, transposed_weight(weight)).sum().backward()
    assert calls == [(4, 6)]
    assert torch.allclose(x.grad, weight.sum(0).expand(3, 4))


def test_a_non_contiguous_input_is_multiplied_correctly():
    weight = torch.randn(6, 4)
    x = torch.randn(4, 3).t()  # [3, 4], not contiguous
    with torch.inference_mode():
        assert torch.allclose(linear(x, transposed_weight(weight)), x @ weight.t(), atol=1e-6)


def test_a_one_row_or_square_plain_weight_is_not_mistaken_for_a_transposed_one():
    assert not is_transposed(torch.randn(1, 8))
    assert not is_transposed(torch.randn(8, 8))
    assert is_transposed(torch.randn(8, 8).t())


def test_the_copy_is_written_once_and_the_models_map_it(float32_cache, monkeypatch):
    out = ensure_transposed(float32_cache)
    assert out == transposed_dir_of(float32_cache)
    assert (out / LAYOUT_RECORD).is_file()
    assert not list(float32_cache.parent.glob("*.tmp-*"))

    def boom(*args, **kwargs):
        raise AssertionError("a current copy must not be written again")

    monkeypatch.setattr(layout_module, "_write_pair", boom)
    plain_draft, plain_target, tok = load_pair_from_dir(float32_cache, {"dtype": "float32"})
    draft, target, _ = load_pair_from_dir(
        float32_cache, {"dtype": "float32", "linear_layout": "transposed"}
    )
    linears = [m for m in target.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(is_transposed(m.weight) for m in linears)
    # the same values as stored, and the same logits to float32 rounding
    stored = plain_parameters(plain_target)
    for name, param in plain_parameters(target).items():
        assert torch.equal(param, stored[name]), name
    ids = tok("def add(a, b):", return_tensors="pt")["input_ids"].repeat(3, 1)
    with torch.inference_mode():
        for ours, reference in ((draft, plain_draft), (target, plain_target)):
            got, want = ours(ids).logits, reference(ids).logits
            assert torch.allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_replaced_pair_makes_its_copy_stale(float32_cache):
    out = ensure_transposed(float32_cache)
    before = json.loads((out / LAYOUT_RECORD).read_text())["source_provenance_sha256"]
    provenance = float32_cache / "provenance.json"
    record = json.loads(provenance.read_text())
    record["created_unix"] = 0.0  # what a refetch changes
    provenance.write_text(json.dumps(record))
    ensure_transposed(float32_cache)
    assert json.loads((out / LAYOUT_RECORD).read_text())["source_provenance_sha256"] != before


def test_an_unwritable_cache_folder_keeps_the_stored_layout(float32_cache, monkeypatch):
    def read_only(*args, **kwargs):
        raise PermissionError("read-only file system")

    monkeypatch.setattr(cachedir_module, "new_build_dir", read_only)
    assert ensure_transposed(float32_cache) is None
    _, target, _ = load_pair_from_dir(
        float32_cache, {"dtype": "float32", "linear_layout": "transposed"}
    )
    assert not any(is_transposed(p) for p in target.parameters())


def test_a_job_at_another_thread_count_than_the_probe_keeps_the_stored_layout(float32_cache):
    settings = {"dtype": "float32", "linear_layout": "transposed", "linear_layout_threads": 1}
    _, other, _ = load_pair_from_dir(float32_cache, settings, threads=2)
    assert not any(is_transposed(p) for p in other.parameters())
    _, probed, _ = load_pair_from_dir(float32_cache, settings, threads=1)
    assert any(is_transposed(p) for p in probed.parameters())


def test_a_quantised_draft_keeps_its_weights_as_stored(float32_cache):
    draft, target, _ = load_pair_from_dir(
        float32_cache,
        {"dtype": "float32", "linear_layout": "transposed", "quantize": "int8_dynamic_draft"},
    )
    assert not any(is_transposed(p) for p in draft.parameters())
    assert any(is_transposed(p) for p in target.parameters())


def test_a_model_with_stacked_projections_writes_the_same_file(float32_cache, tmp_path):
    from safetensors.torch import load_file

    plain = load_model(float32_cache / "draft", "float32", "draft")
    stacked = load_model(float32_cache / "draft", "float32", "draft")
    reorder_all_weights(stacked)  # reordered float32: query/key/value and gate/up stacked
    assert write_transposed(stacked, tmp_path / "s.safetensors") == write_transposed(
        plain, tmp_path / "p.safetensors"
    )
    written, expected = (load_file(str(tmp_path / f)) for f in ("s.safetensors", "p.safetensors"))
    assert written.keys() == expected.keys() and "model.layers.0.self_attn.k_proj.weight" in written
    for key, tensor in expected.items():
        assert torch.equal(written[key], tensor), key
    with pytest.raises(LayoutError, match="reordered for oneDNN"):
        use_transposed_weights(stacked, tmp_path / "s.safetensors")


def test_a_file_that_does_not_fit_the_model_is_named(float32_cache, tmp_path):
    from safetensors.torch import save_file

    out = ensure_transposed(float32_cache)
    unrelated = tmp_path / "unrelated.safetensors"
    save_file({"unrelated": torch.zeros(1)}, str(unrelated))
    target = load_model(float32_cache / "target", "float32", "target")
    with pytest.raises(LayoutError, match="no transposed weight for layer"):
        use_transposed_weights(target, unrelated)
    draft = load_model(float32_cache / "draft", "float32", "draft")
    hidden = draft.lm_head.in_features
    draft.lm_head = torch.nn.Linear(hidden, 5, bias=False)  # another shape than the file's
    with pytest.raises(LayoutError, match="expected it transposed"):
        use_transposed_weights(draft, out / "draft" / TRANSPOSED_FILE)


def test_the_layout_is_chosen_by_the_probe_with_a_margin():
    def probe(plain: float, transposed: float):
        return lambda layout: {"plain": plain, "transposed": transposed}[layout]

    args = dict(hidden_size=8, intermediate_size=16, batch_size=16, gamma=4)
    faster = choose_linear_layout("float32", "cpu", **args, prober=probe(1.0, 0.7))
    assert faster.layout == "transposed" and faster.probe_s == {"plain": 1.0, "transposed": 0.7}
    assert "0.70x" in faster.reason and "16, 80 rows" in faster.reason
    within_noise = choose_linear_layout(
        "float32", "cpu", **args, prober=probe(1.0, 1.0 - TRANSPOSED_MIN_GAIN / 2)
    )
    assert within_noise.layout == "plain"
    assert choose_linear_layout("float32", "cpu", **args, prober=probe(1.0, 1.3)).layout == "plain"

    def never(layout):
        raise AssertionError("no probe where the layout cannot apply")

    assert choose_linear_layout("bfloat16", "cpu", **args, prober=never).layout == "plain"
    assert choose_linear_layout("float32", "cuda", **args, prober=never).layout == "plain"
    both = choose_linear_layout("float32", "cpu", **args, quantize="int8_dynamic", prober=never)
    assert both.layout == "plain"


def test_the_probe_interleaves_its_rounds_and_one_round_does_not_decide():
    calls = []
    # Transposed takes 0.75 of plain's time in every round but one, where the machine slowed
    # down while it ran (1.30x): the median of the rounds' ratios still picks it.
    slow_round = 0

    def prober(layout):
        calls.append(layout)
        round_index = (len(calls) - 1) // 2
        if layout == "plain":
            return 1.0
        return 1.3 if round_index == slow_round else 0.75

    args = dict(hidden_size=8, intermediate_size=16, batch_size=16, gamma=4)
    choice = choose_linear_layout("float32", "cpu", **args, prober=prober)
    assert len(calls) == 2 * LAYOUT_PROBE_ROUNDS
    rounds = [tuple(calls[i : i + 2]) for i in range(0, len(calls), 2)]
    assert rounds[0] == ("plain", "transposed") and rounds[1] == ("transposed", "plain")
    assert all(set(r) == {"plain", "transposed"} for r in rounds)
    assert choice.layout == "transposed" and "0.75x to 1.30x" in choice.reason
    assert choice.probe_s == {"plain": 1.0, "transposed": 0.75}


def test_the_real_probe_times_both_layouts():
    choice = choose_linear_layout(
        "float32", "cpu", hidden_size=16, intermediate_size=32, batch_size=2, gamma=1
    )
    assert choice.layout in ("plain", "transposed")
    assert set(choice.probe_s) == {"plain", "transposed"}
    assert all(s > 0 for s in choice.probe_s.values())


def test_model_settings_read_the_layout_and_default_to_plain(tmp_path):
    path = tmp_path / "precision.json"
    path.write_text(json.dumps({"dtype": "float32", "reason": "configured"}))
    assert model_settings({"threads": 1}, path)["linear_layout"] == "plain"
    path.write_text(
        json.dumps(
            {
                "dtype": "float32",
                "reason": "configured",
                "linear_layout": {
                    "layout": "transposed",
                    "reason": "probe",
                    "probe_s": {},
                    "threads": 1,
                },
            }
        )
    )
    settings = model_settings({"threads": 1}, path)
    assert settings["linear_layout"] == "transposed" and settings["dtype"] == "float32"
    assert settings["linear_layout_threads"] == 1


def _transposed_copy(model):
    from edgespec.models.cpu_linear import use_onednn_linear

    use_onednn_linear(model)
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            weight = transposed_weight(module.weight)
            module.weight = torch.nn.Parameter(weight, requires_grad=False)
    return model


@pytest.mark.parametrize("gamma", [1, 4])
@pytest.mark.parametrize("batch_size", [1, 3])
def test_greedy_speculative_decoding_on_transposed_weights_equals_target_greedy(gamma, batch_size):
    from edgespec.decoding.config import DecodingConfig
    from edgespec.decoding.rounds import generate_rounds
    from edgespec.models.tiny import build_tiny_model

    target = _transposed_copy(build_tiny_model(vocab_size=61, seed=0))
    draft = _transposed_copy(build_tiny_model(vocab_size=61, seed=0, perturb=0.05, perturb_seed=7))
    assert all(is_transposed(m.weight) for m in target.modules() if isinstance(m, torch.nn.Linear))
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 61, (n,), generator=gen).tolist() for n in (3, 7, 5, 9)]
    expected = []
    with torch.inference_mode():
        for p in prompts:
            ids = target.generate(
                torch.tensor([p]), max_new_tokens=12, min_new_tokens=12, do_sample=False
            )
            expected.append(ids[0, len(p) :].tolist())
    cfg = DecodingConfig(max_new_tokens=12, temperature=0.0, batch_size=batch_size)
    got, _ = generate_rounds(prompts, cfg, torch.Generator().manual_seed(1), draft, target, gamma)
    assert got == expected
