"""Configuration validation: defaults, and errors that name the offending key."""

from __future__ import annotations

import pytest
import yaml

from edgespec.config import REPO_ROOT, ConfigError, check_inputs_exist, load_schema, validate_config


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
    cfg["data"]["datasets"]["mine"] = {"source": "csv", "n": 3}
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
