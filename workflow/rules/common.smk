# Configuration validation and path helpers shared by every rule module.
import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "src"))

from edgespec.config import (
    channel_conditions,
    check_inputs_exist,
    check_model_settings,
    check_multidevice_settings,
    check_wisv_settings,
    cuhlm_variants,
    multidevice_batch_plan,
    validate_config,
    wisv_channels,
    wisv_variants,
)
from edgespec.variants import WISV_CSI_VARIANTS

config.update(validate_config(config))
check_inputs_exist(config)
check_model_settings(config)
check_wisv_settings(config)
check_multidevice_settings(config)

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
        *(
            ["results/report/multidevice_summary.csv"]
            if config["multidevice"]["enabled"]
            else []
        ),
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


# Many devices, one edge (rules in multidevice.smk).
MULTIDEVICE = config["multidevice"]
MD_METHODS = list(MULTIDEVICE["methods"]) if MULTIDEVICE["enabled"] else []
MD_CHANNELS = list(MULTIDEVICE["channels"])
MD_GAMMA = MULTIDEVICE["wisv_gamma"]
# What profile_batching reads: the mode, and either what to time or the given table.
MD_BATCHING = {"mode": config["latency"]["mode"], **multidevice_batch_plan(config)}
if MD_BATCHING["mode"] == "given":
    MD_BATCHING["given"] = MULTIDEVICE["target_batch_s"]
else:
    MD_BATCHING["repeats"] = MULTIDEVICE["batch_repeats"]
# What simulate_multidevice reads of the multidevice section (not the report's keys).
MD_SWEEP = {
    key: MULTIDEVICE[key]
    for key in (
        "device_counts",
        "uplink",
        "tdma_slot_s",
        "batching",
        "prompts_per_device",
    )
}


def multidevice_tables(wildcards):
    """The decoded table(s) a method is simulated from: CU-HLM tokens, or WISV rounds at
    multidevice.wisv_gamma (per fading seed for the CSI-reading variants)."""
    method = wildcards.mdmethod
    if method in CUHLM_VARIANTS:
        return [f"results/cuhlm/decode/{method}/tokens.parquet"]
    return [
        f"results/wisv/decode/{stem}.parquet"
        for stem in wisv_decodes(method, MD_GAMMA, wildcards.mdchannel)
    ]


def multidevice_extras(wildcards):
    """What else a method's pricing reads: k* and |V| (CU-HLM); the model sizes and the
    decision head's time (WISV)."""
    method = wildcards.mdmethod
    if method in CUHLM_VARIANTS:
        return {"kstar": "results/cuhlm/calibration/kstar.json"}
    extras = {"provenance": model_provenance()}
    # The head variants are charged their decision head's measured time.
    if method not in ("vanilla_sd", "topk_accept"):
        extras["head"] = "results/wisv/head/metrics.json"
    return extras


def multidevice_pricing(wildcards):
    """Only the keys a method's pricing reads (its family's)."""
    method = wildcards.mdmethod
    if method in CUHLM_VARIANTS:
        return {"prob_bits": config["cuhlm"]["prob_bits"]}
    return {"gamma": MD_GAMMA, "hidden_bits": config["wisv"]["hidden_bits"]}


def multidevice_seeds(wildcards):
    """The fading seeds a method is simulated under: every seed for a channel-blind one, the
    decoded seeds for a CSI-reading one."""
    if wildcards.mdmethod in CSI_VARIANTS:
        return list(CSI_DECODE_SEEDS)
    return list(range(config["evaluation"]["fading_seeds"]))
