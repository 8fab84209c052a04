# Configuration validation and path helpers shared by every rule module.
import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "src"))

from edgespec.config import (
    channel_conditions,
    check_inputs_exist,
    check_model_settings,
    check_wisv_settings,
    cuhlm_variants,
    validate_config,
    wisv_channels,
    wisv_variants,
)
from edgespec.variants import WISV_CSI_VARIANTS

config.update(validate_config(config))
check_inputs_exist(config)
check_model_settings(config)
check_wisv_settings(config)

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
# Variants whose decisions read the round's CSI are decoded per channel and fading seed (one
# "wisv" decode serves both protocols); the others once, channel-free ("any"), and priced per
# channel and fading seed afterwards.
CSI_VARIANTS = WISV_CSI_VARIANTS
CSI_DECODE_SEEDS = config["wisv"]["csi_decode_seeds"]
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
    wvariant="vanilla_sd|topk_accept|head_no_csi|head_relabel_no_csi|wisv_fh|wisv_sh|wisv",
    wchannel="[a-z][a-z0-9]*",
    gamma="[0-9]+",
    fseed="[0-9]+",
    wdecode="[a-z_]+/g[0-9]+/(any|[a-z][a-z0-9]*/s[0-9]+)",


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


WISV_HEADS = {
    "head_no_csi": "results/wisv/head/no_csi_head.pt",
    "head_relabel_no_csi": "results/wisv/head/relabel_no_csi_head.pt",
    "wisv": "results/wisv/head/wisv_head.pt",
}


def wisv_decodes(variant, gamma, channel):
    """The decode stems (under results/wisv/decode/) a variant's figures at one channel and
    gamma come from: per fading seed for the CSI-reading variants, one channel-free decode for
    the others."""
    if variant in CSI_VARIANTS:
        return [f"wisv/g{gamma}/{channel}/s{s}" for s in CSI_DECODE_SEEDS]
    return [f"{variant}/g{gamma}/any"]


def wisv_decoded_rounds(wildcards):
    return [
        f"results/wisv/decode/{stem}.parquet"
        for stem in wisv_decodes(
            wildcards.wvariant, wildcards.gamma, wildcards.wchannel
        )
    ]


def wisv_head_inputs(wildcards):
    if wildcards.wvariant in WISV_HEADS:
        return [WISV_HEADS[wildcards.wvariant], "results/wisv/head/metrics.json"]
    return []


def wisv_head_metrics(wildcards):
    """Head variants are charged the head's measured time per round (train_head measures it)."""
    if wildcards.wvariant == "vanilla_sd" or wildcards.wvariant == "topk_accept":
        return []
    return ["results/wisv/head/metrics.json"]


def wisv_vanilla_completions(wildcards):
    gamma = wildcards.wdecode.split("/")[1]
    return f"results/wisv/decode/vanilla_sd/{gamma}/any.jsonl"


def wisv_score_files():
    stems = {
        stem
        for variant in WISV_VARIANTS
        for gamma in config["wisv"]["gammas"]
        for channel in sorted(WISV_CHANNELS)
        for stem in wisv_decodes(variant, gamma, channel)
    }
    return [f"results/wisv/scores/{stem}.parquet" for stem in sorted(stems)]
