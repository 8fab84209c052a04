# Configuration validation and path helpers shared by every rule module.
import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "src"))

from edgespec.config import (
    channel_conditions,
    check_inputs_exist,
    check_model_settings,
    cuhlm_variants,
    validate_config,
    wisv_channels,
    wisv_variants,
)

config.update(validate_config(config))
check_inputs_exist(config)
check_model_settings(config)

MODELS = config["models"]
MODEL_DIR = f"{MODELS['cache_dir']}/{MODELS['preset']}"
DATASETS = sorted(config["data"]["datasets"])
MODEL_THREADS = MODELS["threads"]
# What model stages need to load the cached pair besides the dtype, which they read from the
# run's precision record (rule select_dtype); other model keys (threads, preset) do not change
# their results and so are not params (a change to them reruns nothing).
MODEL_LOAD = {key: MODELS[key] for key in ("device", "quantize")}
PRECISION = "results/machine/precision.json"
PROMPTING = {
    "system_prompt": config["data"]["system_prompt"],
    "task_system_prompts": config["data"]["task_system_prompts"],
}
CHANNELS = channel_conditions(config)
CUHLM_VARIANTS = cuhlm_variants(config)
WISV_CHANNELS = wisv_channels(config)
WISV_VARIANTS = wisv_variants(config)
# Variants whose decisions read the round's CSI are decoded per channel; the others once
# ("any") and priced per channel afterwards.
CSI_VARIANTS = ("wisv_fh", "wisv_sh")
# Every draft length some stage prices must have a measured verification time.
PROFILE_GAMMAS = sorted(
    set(config["latency"]["gammas"])
    | set(config["wisv"]["gammas"])
    | {config["wisv"]["relabel"]["gamma"]}
)


wildcard_constraints:
    dataset="|".join(DATASETS),
    variant="[a-z_]+",
    channel="[a-z]+_snr-?[0-9.]+",
    wvariant="vanilla_sd|topk_accept|head_no_csi|wisv_fh|wisv_sh|wisv",
    wchannel="[a-z][a-z0-9]*",
    gamma="[0-9]+",


def model_dir_of(wildcards, input):
    """The pair's cache folder, next to its provenance file (an input of every model stage)."""
    return str(Path(input.provenance).parent)


def model_dir_of_output(wildcards, output):
    return str(Path(output.provenance).parent)


def model_provenance():
    return f"{MODEL_DIR}/provenance.json"


def final_outputs():
    quantized = MODELS["quantize"] != "none"
    return [
        *expand("results/traces/{dataset}/tokens.parquet", dataset=DATASETS),
        "results/latency/profile.json",
        "results/report/cuhlm_summary.csv",
        "results/report/wisv_summary.csv",
        *(["results/machine/quantization.json"] if quantized else []),
    ]


def trace_tables():
    return expand("results/traces/{dataset}/tokens.parquet", dataset=DATASETS)


def eval_prompt_files():
    return expand("results/data/{dataset}.jsonl", dataset=DATASETS)


def random_skip_reference(wildcards):
    """random_skip copies the measured skip rate of a decoded U-HLM variant."""
    if wildcards.variant == "random_skip":
        ref = config["cuhlm"]["random_skip_reference"]
        return f"results/cuhlm/decode/{ref}/tokens.parquet"
    return []


def dataset_spec(wildcards):
    return config["data"]["datasets"][wildcards.dataset]


def _wisv_decode_path(wildcards, ext):
    """wisv_fh and wisv_sh make the same decisions: one 'wisv' decode per channel serves both."""
    if wildcards.wvariant in CSI_VARIANTS:
        return f"results/wisv/decode/wisv/g{wildcards.gamma}/{wildcards.wchannel}.{ext}"
    return f"results/wisv/decode/{wildcards.wvariant}/g{wildcards.gamma}/any.{ext}"


def wisv_decoded_rounds(wildcards):
    return _wisv_decode_path(wildcards, "parquet")


def wisv_decoded_completions(wildcards):
    return _wisv_decode_path(wildcards, "jsonl")


def wisv_head_inputs(wildcards):
    if wildcards.wvariant == "head_no_csi":
        return ["results/wisv/head/no_csi_head.pt", "results/wisv/head/metrics.json"]
    if wildcards.wvariant == "wisv":
        return ["results/wisv/head/wisv_head.pt", "results/wisv/head/metrics.json"]
    return []
