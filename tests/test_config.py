"""Configuration validation: defaults, and errors that name the offending key."""

from __future__ import annotations

import pytest
import yaml

from edgespec.config import (
    REPO_ROOT,
    ConfigError,
    check_cross_references,
    check_inputs_exist,
    check_model_settings,
    load_schema,
    validate_config,
)


def _default_config() -> dict:
    return yaml.safe_load((REPO_ROOT / "config.yaml").read_text())


def test_shipped_configs_are_valid():
    for path in [REPO_ROOT / "config.yaml", *sorted((REPO_ROOT / "config").glob("*.yaml"))]:
        validate_config(yaml.safe_load(path.read_text()))


def test_defaults_are_filled():
    cfg = validate_config({})
    assert cfg["models"]["preset"] == "qwen25coder"
    assert cfg["uncertainty"] == {"num_samples": 20, "theta_max": 2.0}
    assert cfg["data"]["datasets"]["arithmetic"]["source"] == "arithmetic"
    assert cfg["data"]["datasets"]["arithmetic"]["path"] is None


def test_every_schema_key_has_description_and_default():
    def walk(schema, path):
        for key, sub in schema.get("properties", {}).items():
            where = f"{path}.{key}" if path else key
            assert "description" in sub, f"{where} has no description"
            assert "default" in sub or where.startswith("models.custom."), f"{where} has no default"
            walk(sub, where)

    walk(load_schema(), "")


def test_unknown_key_is_named():
    cfg = _default_config()
    cfg["decoding"]["max_new_token"] = 3
    with pytest.raises(ConfigError, match=r"'decoding'.*max_new_token.*unexpected"):
        validate_config(cfg)


def test_wrong_type_is_named():
    cfg = _default_config()
    cfg["decoding"]["max_new_tokens"] = "many"
    with pytest.raises(ConfigError, match=r"'decoding\.max_new_tokens'.*not of type 'integer'"):
        validate_config(cfg)


def test_out_of_range_is_named():
    cfg = _default_config()
    cfg["data"]["calib_fraction"] = 1.5
    with pytest.raises(ConfigError, match=r"'data\.calib_fraction'"):
        validate_config(cfg)


def test_unknown_dataset_source_is_named():
    cfg = _default_config()
    cfg["data"]["datasets"] = {"mine": {"source": "csv", "n": 3}}
    with pytest.raises(ConfigError, match=r"'data\.datasets\.mine\.source'"):
        validate_config(cfg)


def test_missing_jsonl_file_is_named(tmp_path):
    cfg = validate_config(
        {"data": {"datasets": {"own": {"source": "jsonl", "n": 2, "path": "nope.jsonl"}}}}
    )
    with pytest.raises(
        ConfigError, match=r"data\.datasets\.own\.path.*nope\.jsonl.*does not exist"
    ):
        check_inputs_exist(cfg, base=tmp_path)
    (tmp_path / "nope.jsonl").write_text("")
    check_inputs_exist(cfg, base=tmp_path)


def test_custom_preset_needs_both_models():
    cfg = validate_config({"models": {"preset": "custom", "custom": {"draft": {"id": "a"}}}})
    with pytest.raises(ConfigError, match=r"models\.custom\.target"):
        check_inputs_exist(cfg)


def _merged(*files: str) -> dict:
    """config.yaml with --configfile files merged over it the way Snakemake merges them."""
    from snakemake.utils import update_config

    merged = yaml.safe_load((REPO_ROOT / "config.yaml").read_text())
    for name in files:
        update_config(merged, yaml.safe_load((REPO_ROOT / name).read_text()))
    return validate_config(merged)


def test_paper_config_runs_exactly_the_papers_datasets_and_sizes():
    cfg = _merged("config/paper.yaml")
    assert {k: v["n"] for k, v in cfg["data"]["datasets"].items()} == {
        "gsm8k": 1319,
        "alpaca": 100,
        "strategyqa": 300,
        "creak": 300,
        "qed": 300,
        "dolly": 300,
    }
    assert cfg["models"]["preset"] == "llama32_llama31_8b"
    assert cfg["decoding"]["max_new_tokens"] == 256 and cfg["wisv"]["max_new_tokens"] == 512
    assert cfg["wisv"]["gammas"] == [4, 8, 16]


def test_default_and_smoke_datasets():
    assert {k: v["n"] for k, v in _merged()["data"]["datasets"].items()} == {
        "instructions": 16,
        "arithmetic": 16,
    }
    smoke = _merged("config/smoke.yaml")["data"]["datasets"]
    assert {k: v["n"] for k, v in smoke.items()} == {"instructions": 6, "arithmetic": 6}


def _given_latency(verify: dict, wisv: dict | None = None) -> dict:
    return validate_config(
        {
            "latency": {"mode": "given", "given": {"target_verify_s": verify}},
            "wisv": wisv or {"gammas": [4, 8], "relabel": {"gamma": 4}},
        }
    )


def test_given_latency_must_price_every_gamma():
    check_cross_references(_given_latency({"1": 0.02, "4": 0.03, "8": 0.04}))
    check_cross_references(_given_latency({"1": 0.02, "16": 0.04}))  # 4 and 8 interpolated
    with pytest.raises(ConfigError) as info:
        check_cross_references(_given_latency({"1": 0.02, "4": 0.03}))
    message = str(info.value)
    assert "latency.given.target_verify_s" in message
    assert "gamma 8 (priced by wisv.gammas)" in message and "[1, 4]" in message
    with pytest.raises(ConfigError, match=r"gamma 16 \(priced by wisv.relabel.gamma\)"):
        check_cross_references(
            _given_latency({"1": 0.02, "8": 0.04}, {"gammas": [4], "relabel": {"gamma": 16}})
        )
    with pytest.raises(ConfigError, match="positive integers"):
        check_cross_references(_given_latency({"four": 0.03, "8": 0.04}))
    # measured: profile_latency measures every priced gamma itself
    check_cross_references(validate_config({"latency": {"mode": "measured"}}))


def test_hub_dataset_path_is_a_local_copy(tmp_path):
    cfg = validate_config({"data": {"datasets": {"g": {"source": "gsm8k", "n": 2, "path": "t"}}}})
    with pytest.raises(ConfigError, match=r"data\.datasets\.g\.path.*'t'.*does not exist"):
        check_inputs_exist(cfg, base=tmp_path)
    (tmp_path / "t").mkdir()  # a save_to_disk folder
    check_inputs_exist(cfg, base=tmp_path)
    embedded = {"data": {"datasets": {"a": {"source": "arithmetic", "n": 2, "path": "t"}}}}
    with pytest.raises(ConfigError, match=r"data\.datasets\.a\.path.*embedded"):
        check_inputs_exist(validate_config(embedded), base=tmp_path)


def test_quantisation_settings_are_checked_together():
    draft_only = {"dtype": "bfloat16", "quantize": "int8_dynamic_draft"}
    check_model_settings(validate_config({"models": draft_only}))  # the target keeps bf16
    both = validate_config({"models": {"dtype": "bfloat16", "quantize": "int8_dynamic"}})
    with pytest.raises(ConfigError, match=r"models\.quantize.*models\.dtype.*int8_dynamic_draft"):
        check_model_settings(both)
    gpu = validate_config({"models": {"device": "cuda", "quantize": "int8_dynamic_draft"}})
    with pytest.raises(ConfigError, match=r"models\.quantize.*CPU only"):
        check_model_settings(gpu)
    with pytest.raises(ConfigError, match=r"'models\.quantize'"):
        validate_config({"models": {"quantize": "int4"}})
