"""Validation of the workflow configuration against workflow/schemas/config.schema.yaml.

Errors name the offending key by its dotted path, before any stage runs; missing keys get the
schema's defaults so every stage sees a complete configuration.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path

import jsonschema
import yaml

from edgespec.hardware import WisvTestbed
from edgespec.models.precision import quantized_roles
from edgespec.variants import CUHLM_VARIANTS, WISV_VARIANTS
from edgespec.wireless.arq import ArqSettings
from edgespec.wisv.csi import per_fit
from edgespec.wisv.regimes import check_regimes

REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = REPO_ROOT / "workflow" / "schemas" / "config.schema.yaml"


class ConfigError(ValueError):
    """A configuration key is unknown, of the wrong type or out of range."""


def load_schema(path: Path = SCHEMA_PATH) -> dict:
    with open(path) as fh:
        return yaml.safe_load(fh)


def _fill_defaults(instance: dict, schema: dict) -> None:
    for key, sub in schema.get("properties", {}).items():
        if key not in instance and "default" in sub:
            instance[key] = copy.deepcopy(sub["default"])
        if isinstance(instance.get(key), dict) and sub.get("type") == "object":
            _fill_defaults(instance[key], sub)
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict) and extra.get("type") == "object":
        for key, value in instance.items():
            if key not in schema.get("properties", {}) and isinstance(value, dict):
                _fill_defaults(value, extra)


def _dotted(path) -> str:
    return ".".join(str(p) for p in path) or "<top level>"


def validate_config(config: dict, schema: dict | None = None) -> dict:
    """A copy of ``config`` with defaults filled in; :class:`ConfigError` if invalid."""
    schema = schema or load_schema()
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        lines = []
        for err in errors:
            where = _dotted(err.absolute_path)
            if err.validator == "additionalProperties":
                known = sorted(err.schema.get("properties", {}))
                lines.append(f"config key '{where}': {err.message}; known keys: {', '.join(known)}")
            else:
                lines.append(f"config key '{where}': {err.message}")
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(lines))
    filled = copy.deepcopy(config)
    _fill_defaults(filled, schema)
    return filled


def check_inputs_exist(config: dict, base: Path = Path(".")) -> None:
    """Files named by the configuration must exist before any stage starts."""
    from edgespec.data.prepare import LOCAL_COPY_SOURCES

    for name, spec in config["data"]["datasets"].items():
        where = f"config key 'data.datasets.{name}.path'"
        path = spec.get("path")
        if spec["source"] == "jsonl" and not path:
            raise ConfigError(f"{where}: source jsonl needs a path")
        if not path:
            continue
        if spec["source"] not in LOCAL_COPY_SOURCES:
            raise ConfigError(
                f"{where}: source {spec['source']} is embedded and takes no path (a path is "
                f"for sources {', '.join(LOCAL_COPY_SOURCES)})"
            )
        if spec["source"] == "jsonl" and not (base / path).is_file():
            raise ConfigError(f"{where}: file '{path}' does not exist")
        if not (base / path).exists():
            raise ConfigError(f"{where}: '{path}' (a local copy of the dataset) does not exist")
    if config["models"]["preset"] == "custom":
        custom = config["models"].get("custom", {})
        for role in ("draft", "target"):
            if role not in custom:
                raise ConfigError(f"config key 'models.custom.{role}': preset custom needs it")


def check_local_copies(config: dict, base: Path = Path(".")) -> None:
    """Every local dataset file (``data.datasets.<name>.path``) reads as its source: a record
    that lacks a required field, a line cut short, fail here, naming the file, the line (or
    record) and the field, before any model job runs, instead of in rule prepare_data after
    the model stages have started. Reads each file once (seconds for the papers' sizes)."""
    from edgespec.data.hub import HUB_DATASETS, load_hub
    from edgespec.data.records import DatasetError, read_jsonl

    for name, spec in config["data"]["datasets"].items():
        path = spec.get("path")
        if not path:
            continue
        try:
            if spec["source"] == "jsonl":
                read_jsonl(base / path, dataset=name)
            elif spec["source"] in HUB_DATASETS:
                load_hub(spec["source"], path=base / path)
        except DatasetError as err:
            raise ConfigError(f"config key 'data.datasets.{name}.path': {err}") from err


def check_model_settings(config: dict) -> None:
    """Model settings that only make sense together (before any model is fetched)."""
    models = config["models"]
    if models["quantize"] != "none":
        # The quantised models load float32 weights; a quantised draft leaves the target's
        # dtype free, so only a quantised target ties models.dtype.
        quantises_target = "target" in quantized_roles(models["quantize"])
        if quantises_target and models["dtype"] not in ("auto", "float32"):
            raise ConfigError(
                f"config key 'models.quantize': {models['quantize']} quantises float32 weights, "
                f"but 'models.dtype' is {models['dtype']}; set it to auto or float32 (or "
                "quantise the draft alone with int8_dynamic_draft)"
            )
        if models["device"] != "cpu":
            raise ConfigError(
                f"config key 'models.quantize': {models['quantize']} runs on the CPU only, but "
                f"'models.device' is {models['device']}"
            )


def priced_gammas(config: dict) -> dict[int, list[str]]:
    """Every draft length some stage prices -> the config keys that ask for it."""
    askers: dict[int, list[str]] = {}
    for gamma in config["wisv"]["gammas"]:
        askers.setdefault(int(gamma), []).append("wisv.gammas")
    askers.setdefault(int(config["wisv"]["relabel"]["gamma"]), []).append("wisv.relabel.gamma")
    return dict(sorted(askers.items()))


def check_cross_references(config: dict) -> None:
    """Keys that name other keys' values must find them, before the first job.

    With ``latency.mode: given`` the verification time of every priced gamma must come from
    ``latency.given.target_verify_s`` (an entry, or interpolation between two entries, exactly
    as the delay model prices it); otherwise ``relabel_csi`` or ``evaluate_wisv`` would fail
    after the model stages have run. ``cuhlm.kstar_channel`` and the WISV channels are checked
    where they are built (:func:`channel_conditions`, :func:`wisv_channels`).
    """
    from edgespec.wireless.delay import LatencyProfile

    latency = config["latency"]
    if latency["mode"] != "given":
        return  # profile_latency measures every priced gamma (see the workflow's PROFILE_GAMMAS)
    table = latency["given"]["target_verify_s"]
    where = "config key 'latency.given.target_verify_s'"
    bad = [k for k in table if not str(k).isdigit() or int(k) < 1]
    if bad:
        raise ConfigError(f"{where}: keys are draft lengths (positive integers), got {bad}")
    if not table:
        raise ConfigError(f"{where}: latency.mode given needs at least one gamma")
    timings = ("draft_token_s", "target_token_s", "uncertainty_s", "target_verify_s")
    profile = LatencyProfile.from_dict({k: latency["given"][k] for k in timings})
    missing = []
    for gamma, askers in priced_gammas(config).items():
        try:
            profile.target_verify(gamma)
        except ValueError:
            missing.append(f"gamma {gamma} (priced by {', '.join(askers)})")
    if missing:
        raise ConfigError(
            f"{where}: latency.mode is given but there is no verification time for "
            f"{'; '.join(missing)}; the table has gammas "
            f"{sorted(int(k) for k in table)} (between two of them the time is interpolated)"
        )


def load_config(path: Path) -> dict:
    with open(path) as fh:
        raw = yaml.safe_load(fh) or {}
    return validate_config(raw)


def channel_conditions(config: dict) -> dict[str, dict]:
    """The CU-HLM channel sweep as {name: ChannelCondition fields}, named {fading}_snr{dB}."""
    ch = config["channels"]
    out = {}
    for fading in ch["fadings"]:
        for snr in ch["snr_db"]:
            name = f"{fading}_snr{snr:g}"
            out[name] = {
                "name": name,
                "fading": fading,
                "snr_db": float(snr),
                "bandwidth_hz": float(ch["bandwidth_hz"]),
                "k_factor": float(ch["rician_k"]) if fading == "rician" else 0.0,
                "rtt_s": float(ch["rtt_s"]),
                "correlation": float(ch["correlation"]),
            }
    reference = config["cuhlm"]["kstar_channel"]
    if reference not in out:
        raise ConfigError(
            f"config key 'cuhlm.kstar_channel': '{reference}' is not one of the channel "
            f"conditions {sorted(out)}"
        )
    return out


def cuhlm_variants(config: dict) -> list[str]:
    """Configured CU-HLM variants plus the references every comparison needs."""
    wanted = set(config["cuhlm"]["variants"]) | {"llm_only", "hlm"}
    if "random_skip" in wanted:
        wanted.add(config["cuhlm"]["random_skip_reference"])
    return [v for v in CUHLM_VARIANTS if v in wanted]


def wisv_channels(config: dict) -> dict[str, dict]:
    """The WISV channel conditions as {name: ChannelCondition fields}, checked now; a channel
    without its own ``correlation`` gets ``wisv.correlation`` (the relabeling's CSI samples use
    it too)."""
    from edgespec.wireless.channel import ChannelCondition, ChannelError

    out = {}
    for name, fields in config["wisv"]["channels"].items():
        spec = {"name": name, "correlation": config["wisv"]["correlation"], **fields}
        try:
            ChannelCondition.from_dict(spec)
        except ChannelError as err:
            raise ConfigError(f"config key 'wisv.channels.{name}': {err}") from err
        out[name] = spec
    return out


def wisv_variants(config: dict) -> list[str]:
    wanted = set(config["wisv"]["variants"]) | {"vanilla_sd"}
    return [v for v in WISV_VARIANTS if v in wanted]


def check_wisv_settings(config: dict) -> None:
    """Relations between WISV keys that the schema cannot state, checked before any job."""
    wisv = config["wisv"]
    if wisv["label_max_new_tokens"] < wisv["max_new_tokens"]:
        raise ConfigError(
            f"config key 'wisv.label_max_new_tokens': {wisv['label_max_new_tokens']} is below "
            f"wisv.max_new_tokens ({wisv['max_new_tokens']}); labels need at least the decoding "
            "budget"
        )
    seeds = config["evaluation"]["fading_seeds"]
    too_large = [s for s in wisv["csi_decode_seeds"] if s >= seeds]
    if too_large:
        raise ConfigError(
            f"config key 'wisv.csi_decode_seeds': {too_large} not below "
            f"evaluation.fading_seeds ({seeds})"
        )
    for key in ("snr_db_range", "rtt_s_range", "bandwidth_hz_range"):
        span = wisv["relabel"][key]
        if span is not None and span[0] > span[1]:
            raise ConfigError(f"config key 'wisv.relabel.{key}': low {span[0]} > high {span[1]}")
    extra = sorted(set(wisv["testbed_gammas"] or ()) - set(wisv["gammas"]))
    if extra:
        raise ConfigError(
            f"config key 'wisv.testbed_gammas': {extra} not among wisv.gammas ({wisv['gammas']})"
        )
    try:
        wisv_regimes(config)
        WisvTestbed.from_dict(wisv["testbed"])
        ArqSettings.from_dict(wisv["arq"])
        per_fit(wisv_channels(config))
    except ValueError as err:
        raise ConfigError(str(err)) from err


def wisv_regimes(config: dict) -> list[str]:
    """The WISV pricing regimes of a run (config key wisv.regimes, ``measured`` always first;
    ``edgespec.wisv.regimes``)."""
    return check_regimes(config["wisv"]["regimes"])


def multidevice_batch_plan(config: dict) -> dict[str, list[int]]:
    """What the multi-device stage's edge needs timed: ``tokens`` per row (1, a CU-HLM
    verification, and multidevice.wisv_gamma + 1, a WISV one: two counts, which a CU-HLM
    catch-up over s + 1 tokens is read between or extrapolated along) and the batch ``sizes``
    (1, and each device count capped by the largest batch of every simulated edge policy)."""
    md = config["multidevice"]
    tokens = {1, int(md["wisv_gamma"]) + 1}
    caps = [md["batching"]["max_batch"], *md["policy_sweep"]["max_batch"]]
    sizes = {1} | {n if cap is None else min(n, cap) for n in md["device_counts"] for cap in caps}
    return {"tokens": sorted(tokens), "sizes": sorted(sizes)}


def check_multidevice_settings(config: dict) -> None:
    """Relations between the multi-device keys and the rest, checked before any job."""
    md = config["multidevice"]
    if not md["enabled"]:
        return
    available = set(cuhlm_variants(config)) | set(wisv_variants(config))
    missing = [m for m in md["methods"] if m not in available]
    if missing:
        raise ConfigError(
            f"config key 'multidevice.methods': {missing} are not decoded; add them to "
            "cuhlm.variants or wisv.variants"
        )
    channels = config["wisv"]["channels"]
    populations = md["populations"]
    for name, members in populations.items():
        if name in channels:
            raise ConfigError(
                f"config key 'multidevice.populations.{name}': the name is a wisv channel's; "
                "name the population differently"
            )
        unknown = [c for c in members if c not in channels]
        if unknown:
            raise ConfigError(
                f"config key 'multidevice.populations.{name}': {unknown} are not among "
                f"wisv.channels ({sorted(channels)})"
            )
    unknown = [c for c in md["channels"] if c not in channels and c not in populations]
    if unknown:
        raise ConfigError(
            f"config key 'multidevice.channels': {unknown} are neither wisv.channels "
            f"({sorted(channels)}) nor multidevice.populations ({sorted(populations)})"
        )
    if any(m in WISV_VARIANTS for m in md["methods"]) and (
        md["wisv_gamma"] not in config["wisv"]["gammas"]
    ):
        raise ConfigError(
            f"config key 'multidevice.wisv_gamma': {md['wisv_gamma']} is not among wisv.gammas "
            f"{config['wisv']['gammas']}"
        )
    if config["latency"]["mode"] == "given":
        from edgespec.multidevice.edge import BatchTimes

        plan = multidevice_batch_plan(config)
        try:
            times = BatchTimes(md["target_batch_s"], "given")
            for tokens in plan["tokens"]:
                times.seconds(tokens, max(plan["sizes"]))
        except ValueError as err:
            raise ConfigError(f"config key 'multidevice.target_batch_s': {err}") from err


def check_testbed_settings(config: dict) -> None:
    """Relations between the testbed's keys and the rest, checked before any job."""
    tb = config["testbed"]
    if not tb["enabled"]:
        return
    where = "config key 'testbed"
    channels = config["wisv"]["channels"]
    unknown = [c for c in tb["channels"] if c not in channels]
    if unknown:
        raise ConfigError(
            f"{where}.channels': {unknown} are not among wisv.channels ({sorted(channels)})"
        )
    strangers = sorted(set(tb["packet_error_rate"]) - set(tb["channels"]))
    if strangers:
        raise ConfigError(
            f"{where}.packet_error_rate': {strangers} are not among testbed.channels "
            f"{tb['channels']}"
        )
    uses_rounds = any(m in WISV_VARIANTS for m in tb["methods"])
    if uses_rounds and tb["gamma"] not in config["wisv"]["gammas"]:
        raise ConfigError(
            f"{where}.gamma': {tb['gamma']} is not among wisv.gammas {config['wisv']['gammas']} "
            "(the simulator prices only the verification times of those)"
        )
    if tb["fading_seed"] >= config["evaluation"]["fading_seeds"]:
        raise ConfigError(
            f"{where}.fading_seed': {tb['fading_seed']} is not below evaluation.fading_seeds "
            f"({config['evaluation']['fading_seeds']})"
        )
    if config["models"]["device"] != "cpu":
        raise ConfigError(
            f"{where}.enabled': the testbed runs device and edge on one CPU core each, but "
            f"models.device is {config['models']['device']}; set testbed.enabled to false"
        )


def schema_reference_markdown(schema: dict | None = None, keys: Sequence[str] | None = None) -> str:
    """The configuration reference table, generated from the schema: every key (the full
    reference in ``config/README.md``), or only ``keys``, in that order (the README's short
    table of the keys people change)."""
    schema = schema or load_schema()
    header = ["| key | type | default | description |", "|---|---|---|---|"]
    rows: dict[str, str] = {}

    def walk(node: dict, prefix: str) -> None:
        for key, sub in node.get("properties", {}).items():
            path = f"{prefix}.{key}" if prefix else key
            kind = sub.get("type", "")
            kind = "/".join(kind) if isinstance(kind, list) else kind
            if "enum" in sub:
                kind = " \\| ".join(map(str, sub["enum"]))
            default = sub.get("default", "")
            if isinstance(default, dict) and sub.get("properties"):
                default = ""
            text = " ".join(str(sub.get("description", "")).split())
            default_text = f"`{default}`" if default != "" else ""
            rows[path] = f"| `{path}` | {kind} | {default_text} | {text} |"
            if sub.get("properties"):
                walk(sub, path)

    walk(schema, "")
    if keys is None:
        return "\n".join([*header, *rows.values()])
    unknown = [k for k in keys if k not in rows]
    if unknown:
        raise KeyError(f"not in the config schema: {unknown}")
    return "\n".join([*header, *(rows[k] for k in keys)])
