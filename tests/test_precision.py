"""models.dtype: auto picks bf16 where it is native, else the faster dtype by a timed probe."""

from __future__ import annotations

import pytest

from edgespec.models.precision import choose_dtype, cpu_flags, native_bf16, time_products

SHAPES = {"hidden_size": 64, "intermediate_size": 128, "batch_size": 16, "gamma": 4}


def _never(dtype: str) -> float:
    raise AssertionError("no probe should run here")


def test_explicit_dtype_wins_without_a_probe():
    choice = choose_dtype("float32", "cpu", flags={"avx512_bf16"}, prober=_never, **SHAPES)
    assert choice.dtype == "float32" and "configured" in choice.reason


@pytest.mark.parametrize(
    ("device", "flags"), [("cuda", set()), ("cpu", {"avx2", "avx512_bf16"}), ("cpu", {"amx_bf16"})]
)
def test_native_bf16_takes_bf16_without_a_probe(device, flags):
    choice = choose_dtype("auto", device, flags=flags, prober=_never, environ={}, **SHAPES)
    assert choice.dtype == "bfloat16" and choice.probe_s == {}


@pytest.mark.parametrize(
    ("fp32_s", "bf16_s", "winner"), [(1.0, 2.5, "float32"), (2.0, 1.0, "bfloat16")]
)
def test_without_native_bf16_the_probe_decides(fp32_s, bf16_s, winner):
    seconds = {"float32": fp32_s, "bfloat16": bf16_s}
    choice = choose_dtype(
        "auto", "cpu", flags={"avx2", "fma"}, prober=seconds.__getitem__, environ={}, **SHAPES
    )
    assert choice.dtype == winner
    assert choice.probe_s == seconds
    assert "16 and 80 rows" in choice.reason and "slower" in choice.reason
    assert "avx2" in choice.machine["simd"]


def test_onednn_isa_cap_counts_as_no_native_bf16():
    assert native_bf16("cpu", {"avx512_bf16"}, {"ONEDNN_MAX_CPU_ISA": "avx2"}) is None
    assert native_bf16("cpu", {"avx512_bf16"}, {"ONEDNN_MAX_CPU_ISA": "ALL"}) is not None


def test_cpu_flags_parse_proc_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512_bf16\n\nprocessor\t: 1\n")
    assert cpu_flags(info) == {"fpu", "sse", "avx2", "avx512_bf16"}
    assert cpu_flags(tmp_path / "absent") == set()


def test_probe_times_real_products():
    seconds = time_products("float32", (2, 4), 32, 48, layers=2, repeats=1)
    assert 0 < seconds < 5


def test_quantize_forces_float32_and_refuses_bf16():
    choice = choose_dtype("auto", "cpu", flags={"avx512_bf16"}, quantize="int8_dynamic", **SHAPES)
    assert choice.dtype == "float32" and "int8_dynamic" in choice.reason
    with pytest.raises(ValueError, match="models.dtype"):
        choose_dtype("bfloat16", "cpu", flags=set(), quantize="int8_dynamic", **SHAPES)


def test_a_quantised_draft_leaves_the_targets_dtype_free():
    from edgespec.models.precision import quantized_roles, weights_dtype

    native = choose_dtype(
        "auto", "cpu", flags={"avx512_bf16"}, quantize="int8_dynamic_draft", prober=_never, **SHAPES
    )
    assert native.dtype == "bfloat16"
    explicit = choose_dtype("bfloat16", "cpu", flags=set(), quantize="int8_dynamic_draft", **SHAPES)
    assert explicit.dtype == "bfloat16"
    assert quantized_roles("int8_dynamic_draft") == ("draft",)
    assert quantized_roles("int8_dynamic") == ("draft", "target")
    assert weights_dtype("draft", "int8_dynamic_draft", "bfloat16") == "float32"
    assert weights_dtype("target", "int8_dynamic_draft", "bfloat16") == "bfloat16"
    assert weights_dtype("draft", "none", "bfloat16") == "bfloat16"
    with pytest.raises(ValueError, match="models.quantize must be one of"):
        choose_dtype("auto", "cpu", flags=set(), quantize="int4", prober=_never, **SHAPES)


def test_quantize_for_role_quantises_only_the_models_the_mode_names():
    from edgespec.models.precision import quantize_for_role
    from edgespec.models.tiny import build_tiny_model

    def quantised(model) -> bool:
        return any("quantized" in type(m).__module__ for m in model.modules())

    for mode, draft_quantised, target_quantised in [
        ("none", False, False),
        ("int8_dynamic_draft", True, False),
        ("int8_dynamic", True, True),
    ]:
        draft = quantize_for_role(build_tiny_model(vocab_size=61, seed=1), "draft", mode)
        target = quantize_for_role(build_tiny_model(vocab_size=61, seed=0), "target", mode)
        assert (quantised(draft), quantised(target)) == (draft_quantised, target_quantised), mode


def test_int8_dynamic_quantisation_is_measured_against_the_reference():
    import torch

    from edgespec.models.precision import quantization_fidelity, quantize_model
    from edgespec.models.tiny import build_tiny_model

    reference = build_tiny_model(vocab_size=61, seed=0, hidden_size=64)
    quantized = quantize_model(
        build_tiny_model(vocab_size=61, seed=0, hidden_size=64), "int8_dynamic"
    )
    assert any("quantized" in type(m).__module__ for m in quantized.modules())
    prompts = [[3, 17, 29], [40, 2, 11, 58]]
    report = quantization_fidelity(reference, quantized, prompts, new_tokens=6)
    assert report["positions"] == 12
    assert 0.5 <= report["top1_agreement"] <= 1.0 and 0.0 < report["mean_tv"] < 0.2
    same = quantization_fidelity(reference, reference, prompts, new_tokens=6)
    assert same["top1_agreement"] == 1.0 and same["mean_tv"] < 1e-6
    assert quantize_model(reference, "none") is reference
    with pytest.raises(ValueError, match="float32"):
        quantize_model(build_tiny_model(vocab_size=61, seed=0).to(torch.bfloat16), "int8_dynamic")
    with pytest.raises(ValueError, match="scheme"):  # a mode names models, not a scheme
        quantize_model(reference, "int8_dynamic_draft")


def test_target_mlp_shape_reads_the_cached_config(tmp_path):
    import json

    from edgespec.models.machine_setup import target_mlp_shape
    from edgespec.models.presets import ModelPairError

    with pytest.raises(ModelPairError, match="no target config"):
        target_mlp_shape(tmp_path)
    (tmp_path / "target").mkdir()
    config = tmp_path / "target" / "config.json"
    config.write_text(json.dumps({"hidden_size": 64, "intermediate_size": 176, "vocab_size": 9}))
    assert target_mlp_shape(tmp_path) == {"hidden_size": 64, "intermediate_size": 176}
    # a multimodal checkpoint nests the language model's config
    config.write_text(json.dumps({"text_config": {"hidden_size": 8, "intermediate_size": 24}}))
    assert target_mlp_shape(tmp_path) == {"hidden_size": 8, "intermediate_size": 24}
    config.write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(ModelPairError, match="has no intermediate_size"):
        target_mlp_shape(tmp_path)
