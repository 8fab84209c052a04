# Configuration validation and path helpers shared by every rule module.
import os
import re
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError

sys.path.insert(0, str(Path(workflow.basedir) / "src"))

from edgespec.config import (
    channel_conditions,
    check_cross_references,
    check_inputs_exist,
    check_local_copies,
    check_model_settings,
    check_multidevice_settings,
    check_testbed_settings,
    check_wisv_settings,
    cuhlm_variants,
    multidevice_batch_plan,
    validate_config,
    wisv_channels,
    wisv_regimes,
    wisv_variants,
)
from edgespec.data.prepare import files_read, split_sizes
from edgespec.data.records import DEFAULT_DATA_DIR, INSTRUCTIONS_FILE
from edgespec.models.presets import PRESETS, fetch_memory_mb
from edgespec.shards import pack_datasets
from edgespec.variants import CUHLM_POLICY_READS, WISV_CSI_VARIANTS

config.update(validate_config(config))
check_inputs_exist(config)
check_local_copies(config)
check_model_settings(config)
check_wisv_settings(config)
check_cross_references(config)
check_multidevice_settings(config)
check_testbed_settings(config)

MODELS = config["models"]
MODEL_DIR = f"{MODELS['cache_dir']}/{MODELS['preset']}"
DATASETS = sorted(config["data"]["datasets"])


def calib_fraction_of(name):
    """A dataset's own calib_fraction, else data.calib_fraction."""
    spec = config["data"]["datasets"][name]
    return spec.get("calib_fraction") or config["data"]["calib_fraction"]


def train_fraction_of(name):
    """A dataset's own train_fraction, else data.train_fraction (None: no train split)."""
    spec = config["data"]["datasets"][name]
    return spec.get("train_fraction") or config["data"]["train_fraction"]


def dataset_shards(split):
    """Shards of the datasets for a stage that reads their ``split`` (edgespec.shards): a
    dataset with a batch of such prompts is decoded by jobs of its own, smaller consecutive
    ones share jobs until they fill a batch."""
    sizes = {
        name: split_sizes(
            config["data"]["datasets"][name]["n"],
            calib_fraction_of(name),
            train_fraction_of(name),
        )[split]
        for name in DATASETS
    }
    sizes = {name: size for name, size in sizes.items() if size > 0}
    return pack_datasets(sizes, config["decoding"]["batch_size"])


EVAL_SHARDS = dataset_shards("eval")  # decode_cuhlm
# WISV's head is trained on the prompts mine_labels reads: the "train" split where a train
# fraction is configured (disjoint from calibration and evaluation), else the calibration one.
MINING_SPLIT = "train" if any(train_fraction_of(name) for name in DATASETS) else "calib"
CALIB_SHARDS = dataset_shards(MINING_SPLIT)  # mine_labels
MODEL_THREADS = MODELS["threads"]


# Among the ready jobs Snakemake starts the set with the largest summed priority that fits the
# free cores. A rule that times models needs every core, so it can start only when all cores are
# free at once, which a run of one-core jobs rarely leaves: with this priority the timing rules
# take the moments when they are (after fetch_models and after select_dtype) instead of waiting
# until no one-core job is ready. prepare_data has it too: the profiles read its prompts, and a
# profile whose input is still missing when select_dtype ends misses that moment.
PRIORITY_TIMING = 10_000
# The two chains that gate decodes: calibration (collect_traces, fit_calibration,
# risk_thresholds, optimize_k) gates the CU-HLM variants that read thresholds or k*, and labels
# (mine_labels to train_head) gate the WISV head variants. Started before the independent
# decodes, the decodes they gate are ready while the others still fill the cores, instead of
# running last with one core idle. Snakemake sums the priorities of the jobs it starts together,
# so a timing rule's must exceed one chain job's per core: a thousand cores' worth here.
PRIORITY_CHAIN = 10


def timing_threads(wildcards):
    """Threads of a rule whose results are timings (the dtype probe, the latency and batching
    profiles, the head's time per round): in a local run every local core, so that no other
    job runs beside it and slows what it measures; the job times the models on all of them.
    In a cluster run models.threads (or the profile's set-threads), as for every model rule,
    and the same inside the cluster job, whose Snakemake sees every core of the node, not the
    ones the job was given (asking for more is an error there: "More processors requested
    than permitted")."""
    if not workflow.local_exec or workflow.remote_exec:
        return MODEL_THREADS
    try:
        return max(workflow.cores, MODEL_THREADS)
    except WorkflowError:
        return MODEL_THREADS


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
# Pricing regimes (edgespec.wisv.regimes): the measured profile first (the shared decodes' and
# the multi-device study's), then the emulated testbed.
WISV_REGIMES = wisv_regimes(config)
# Every draft length some stage prices must have a measured verification time.
PROFILE_GAMMAS = sorted(
    set(config["latency"]["gammas"])
    | set(config["wisv"]["gammas"])
    | {config["wisv"]["relabel"]["gamma"]}
)
LATENCY_MEASURED = config["latency"]["mode"] == "measured"
# latency.given without the head's time per round, which only profile_head reads.
GIVEN_PROFILE = {
    k: v for k, v in config["latency"]["given"].items() if k != "head_round_s"
}
# What profile_head reads of `latency` to charge the head's time per round.
HEAD_TIMING = (
    {"mode": "measured", "repeats": config["latency"]["repeats"]}
    if LATENCY_MEASURED
    else {
        "mode": "given",
        "given": {"head_round_s": config["latency"]["given"]["head_round_s"]},
    }
)
# Mining and WISV decoding are greedy with WISV's own token budget; of `decoding` they read
# only the batch size.
WISV_GREEDY_DECODING = {
    "max_new_tokens": config["wisv"]["max_new_tokens"],
    "temperature": 0.0,
    "batch_size": config["decoding"]["batch_size"],
}


wildcard_constraints:
    dataset="|".join(DATASETS),
    shard="|".join(re.escape(name) for name in sorted({*EVAL_SHARDS, *CALIB_SHARDS})),
    variant="[a-z_]+",
    channel="[a-z]+_snr-?[0-9.]+",
    wvariant="vanilla_sd|topk_accept|head_no_csi|head_relabel_no_csi|wisv_fh|wisv_sh|wisv",
    wchannel="[a-z][a-z0-9]*",
    gamma="[0-9]+",
    fseed="[0-9]+",
    regime="|".join(WISV_REGIMES),
    # a whole WISV decode (join_wisv_decode): a channel-blind variant's, or the CSI head's
    wdecode="(vanilla_sd|topk_accept|head_no_csi|head_relabel_no_csi)/g[0-9]+/any"
    "|wisv/g[0-9]+/[a-z][a-z0-9]*/s[0-9]+",


def pick(section, *keys):
    """The named keys of a config section: a rule's params hold only what its script reads,
    so that changing any other key of the section reruns nothing."""
    return {key: section[key] for key in keys}


def grows_with_attempt(amount):
    """A resource (MB, minutes) that is ``amount`` on the first attempt and a multiple of it on
    each retry: a job killed for memory or time would only fail again with the same."""
    return lambda wildcards, attempt: amount * attempt


def model_dir_of(wildcards, input):
    """The pair's cache folder (``models.cache_dir``/``models.preset``).

    Taking ``input`` makes Snakemake treat this param as derived and leave it out of the params
    it compares: the folder's location does not change results, so moving the cache reruns
    nothing (the pair itself is tracked through ``results/models/provenance.json``).
    """
    return MODEL_DIR


def cache_locations(wildcards, output):
    """Where fetch_models keeps the pair and its wheels; untracked for the same reason."""
    return {"model_dir": MODEL_DIR, "wheel_dir": MODELS["wheel_dir"]}


def model_provenance():
    """This working directory's record of the pair it uses (a copy of the cache's provenance
    plus its location): the input that ties every model stage to fetch_models. The cache
    itself may be shared by many working directories and is not a Snakemake output."""
    return "results/models/provenance.json"


def fetch_settings():
    """What identifies the pair (not its dtype or threads: the cache is stored once and cast
    on load), so that only a different pair makes fetch_models run again."""
    derived_draft = (
        MODELS["preset"] in PRESETS and PRESETS[MODELS["preset"]].draft is None
    )
    return {
        "preset": MODELS["preset"],
        "draft_layers": MODELS["draft_layers"] if derived_draft else None,
        "custom": MODELS["custom"] if MODELS["preset"] == "custom" else None,
    }


# The embedded data folder, relative to the working directory: Snakemake records inputs as
# written, so an absolute path would tie every result to where the checkout lies, and a moved
# (or second) checkout would rerun fetch_models, prepare_data and all that follows them.
EMBEDDED_DATA_DIR = Path(os.path.relpath(DEFAULT_DATA_DIR))


def tiny_corpus_files():
    """The tiny_random tokenizer is trained on the embedded instructions."""
    if MODELS["preset"] == "tiny_random":
        return [str(EMBEDDED_DATA_DIR / INSTRUCTIONS_FILE)]
    return []


FETCH_MEM_MB = fetch_memory_mb(MODELS["preset"], MODELS["custom"] or None)
# What a job that loads the pair (select_dtype and the model stages after it) asks a cluster
# for: memory sized from the pair, what fetching it needs (its larger model 1.5 times over in
# the stored precision, plus 2 GB for Python and torch) and 4 GB for the draft, the KV caches
# and the hidden states a job keeps (15.2 GB for the default pair, whose largest job peaked at
# 13.1 GB; 6 GB for tiny_random); a GPU only where the models run on one (models.device cuda).
# A job that loads no model (the evaluations, latency.mode given) asks for neither.
MODEL_MEM_MB = FETCH_MEM_MB + 4000
MODEL_GPU = {"gpu": 1} if MODELS["device"] == "cuda" else {}


# Grouped rules (the evaluations) take one group_slots each. A cluster profile sets how many
# members of one group job run side by side (`resources: group_slots=1`), and since the scope
# is local, a group job asks for the cores and memory of that many members, not the sum over
# all of them (runtime still adds up); it does not limit how many group jobs run at once.
resource_scopes:
    group_slots="local",


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
        *(
            ["results/report/testbed_summary.csv"]
            if config["testbed"]["enabled"]
            else []
        ),
    ]


def run_precision(wildcards):
    """The records a report prints about the precision its numbers were decoded in: the dtype
    choice, and the quantised model's fidelity when models.quantize is on."""
    records = {"precision": PRECISION}
    if MODELS["quantize"] != "none":
        records["quantization"] = "results/machine/quantization.json"
    return records


def trace_tables():
    return expand("results/traces/{dataset}/tokens.parquet", dataset=DATASETS)


def eval_prompt_files():
    return expand("results/data/{dataset}.jsonl", dataset=DATASETS)


def dataset_spec(wildcards):
    """What a dataset's prompts are drawn from, and its train fraction where it has one (its
    calibration share is the calib_fraction param)."""
    spec = config["data"]["datasets"][wildcards.dataset]
    spec = {
        key: value
        for key, value in spec.items()
        if key not in ("calib_fraction", "train_fraction")
    }
    train = train_fraction_of(wildcards.dataset)
    return {**spec, "train_fraction": train} if train else spec


def dataset_files(wildcards):
    """The files a dataset's prompts come from (data/instructions.jsonl, a jsonl file, a local
    copy of a hub dataset), so that editing them prepares the dataset again."""
    spec = config["data"]["datasets"][wildcards.dataset]
    return files_read(spec["source"], spec.get("path"), EMBEDDED_DATA_DIR)


def fit_calibration_settings():
    """risk_budget matters to the fit's threshold only under threshold_rule risk_budget."""
    keys = ["threshold_rule"]
    if config["cuhlm"]["threshold_rule"] == "risk_budget":
        keys.append("risk_budget")
    return pick(config["cuhlm"], *keys)


def paper_hardware_settings():
    """The emulated paper hardware's keys, read only where it is enabled."""
    hardware = config["latency"]["paper_hardware"]
    return hardware if hardware["enabled"] else {"enabled": False}


def cuhlm_policy_reads(variant):
    return CUHLM_POLICY_READS[variant]


def cuhlm_decode_inputs(wildcards):
    """Calibration artifacts that this variant's policy reads, and nothing else: llm_only does
    not wait for (or rerun after) calibration, and a new k* redecodes only the variants that
    use it."""
    reads = cuhlm_policy_reads(wildcards.variant)
    inputs = {}
    if reads & {"fit", "u_th"}:
        inputs["fit"] = "results/cuhlm/calibration/fit.json"
    if reads & {"k_star", "joint"}:
        inputs["kstar"] = "results/cuhlm/calibration/kstar.json"
    if "random_skip_rate" in reads:
        # the skip rate measured over every dataset, as when one job decoded them all
        ref = config["cuhlm"]["random_skip_reference"]
        inputs["reference"] = f"results/cuhlm/decode/{ref}/tokens.parquet"
    return inputs


def cuhlm_policy_settings(wildcards):
    """The config keys this variant's policy reads (see edgespec.variants.CUHLM_POLICY_READS)."""
    reads = cuhlm_policy_reads(wildcards.variant)
    settings = {
        k: config["cuhlm"][k]
        for k in ("theta_tv", "fixed_k", "online_k_max")
        if k in reads
    }
    if "uncertainty" in reads:
        settings["uncertainty_samples"] = config["uncertainty"]["num_samples"]
        settings["theta_max"] = config["uncertainty"]["theta_max"]
    return settings


def cuhlm_decode_shards(wildcards):
    """One variant's per-shard decode outputs, in dataset order (joined by join_cuhlm_decode)."""
    return {
        "tokens": expand(
            "results/cuhlm/decode/{variant}/{shard}/tokens.parquet",
            variant=wildcards.variant,
            shard=EVAL_SHARDS,
        ),
        "completions": expand(
            "results/cuhlm/decode/{variant}/{shard}/completions.jsonl",
            variant=wildcards.variant,
            shard=EVAL_SHARDS,
        ),
    }


def shard_prompts(shards):
    """The prepared prompt files of a shard's datasets, in order (an input function)."""
    return lambda wildcards: expand(
        "results/data/{dataset}.jsonl", dataset=shards[wildcards.shard]
    )


WISV_HEADS = {"head_no_csi": f"results/wisv/{WISV_REGIMES[0]}/head/no_csi_head.pt"}
"""The regime-free head decode's head: the no-CSI head learns the mined labels alone, so every
regime's train_head gives the same one; it is decoded once, from the first regime's."""


def wisv_regime_gammas(regime):
    """The gammas a regime evaluates: wisv.gammas, or for the testbed wisv.testbed_gammas."""
    if regime == "testbed" and config["wisv"]["testbed_gammas"] is not None:
        return list(config["wisv"]["testbed_gammas"])
    return list(config["wisv"]["gammas"])


def wisv_decodes(variant, gamma, channel, regime):
    """The decode stems (under results/wisv/decode/ or results/wisv/<regime>/decode/, written
    <regime>/... for the latter) a variant's figures at one regime, channel and gamma come from:
    per fading seed for the CSI-reading variants, one channel-free decode per regime for
    head_relabel_no_csi, one shared channel-free decode for the others."""
    if variant in CSI_VARIANTS:
        return [f"{regime}/wisv/g{gamma}/{channel}/s{s}" for s in CSI_DECODE_SEEDS]
    if variant == "head_relabel_no_csi":
        return [f"{regime}/{variant}/g{gamma}/any"]
    return [f"{variant}/g{gamma}/any"]


def wisv_decode_path(stem, suffix):
    """A decode stem's file: results/wisv/<regime>/decode/... or results/wisv/decode/..."""
    head, _, rest = stem.partition("/")
    if head in WISV_REGIMES:
        return f"results/wisv/{head}/decode/{rest}.{suffix}"
    return f"results/wisv/decode/{stem}.{suffix}"


def wisv_decoded_rounds(wildcards):
    return [
        wisv_decode_path(stem, "parquet")
        for stem in wisv_decodes(
            wildcards.wvariant, wildcards.gamma, wildcards.wchannel, wildcards.regime
        )
    ]


def wisv_head_inputs(wildcards):
    if wildcards.wvariant in WISV_HEADS:
        metrics = f"results/wisv/{WISV_REGIMES[0]}/head/metrics.json"
        return [WISV_HEADS[wildcards.wvariant], metrics]
    return []


HEAD_TIMES = "results/latency/head.json"


def wisv_pricing_inputs(wildcards):
    """What a regime's pricing reads: the measured profile, head times and the pair's sizes;
    the emulated testbed reads nothing."""
    if wildcards.regime != "measured":
        return {}
    return {
        "profile": "results/latency/profile.json",
        "head": HEAD_TIMES,
        "provenance": model_provenance(),
    }


def wisv_scored_decodes():
    """Every WISV decode the report reads (stems, ``wisv_decodes``), each once."""
    return sorted(
        {
            stem
            for regime in WISV_REGIMES
            for variant in WISV_VARIANTS
            for gamma in wisv_regime_gammas(regime)
            for channel in sorted(WISV_CHANNELS)
            for stem in wisv_decodes(variant, gamma, channel, regime)
        }
    )


def wisv_cost_files():
    """Every evaluation the report reads: each regime, variant, channel and gamma."""
    return [
        f"results/wisv/{regime}/metrics/{variant}/{channel}/g{gamma}.parquet"
        for regime in WISV_REGIMES
        for variant in WISV_VARIANTS
        for channel in sorted(WISV_CHANNELS)
        for gamma in wisv_regime_gammas(regime)
    ]


def wisv_sweep_rounds():
    """Per regime, the CSI decode the FH-against-SH sweep prices (the first gamma, channel
    and seed), where a CSI-reading variant is configured."""
    if not set(CSI_VARIANTS) & set(WISV_VARIANTS):
        return []
    return [
        wisv_decode_path(
            wisv_decodes(
                "wisv_fh",
                wisv_regime_gammas(regime)[0],
                sorted(WISV_CHANNELS)[0],
                regime,
            )[0],
            "parquet",
        )
        for regime in WISV_REGIMES
    ]


def wisv_vanilla_completions():
    """Vanilla SD's completions at every gamma: each decode is scored against its gamma's."""
    return [
        f"results/wisv/decode/vanilla_sd/g{gamma}/any.jsonl"
        for gamma in config["wisv"]["gammas"]
    ]


def wisv_completion_files():
    return [wisv_decode_path(stem, "jsonl") for stem in wisv_scored_decodes()]


def wisv_score_files():
    return [f"results/wisv/scores/{stem}.parquet" for stem in wisv_scored_decodes()]


def wisv_decode_settings(wildcards):
    """The WISV keys one channel-blind decode job reads: top_k for topk_accept, and the tie
    margin of the greedy check that vanilla SD runs at the smallest gamma."""
    settings = {"max_new_tokens": config["wisv"]["max_new_tokens"]}
    if wildcards.wvariant == "topk_accept":
        settings["top_k"] = config["wisv"]["top_k"]
    if wildcards.wvariant == "vanilla_sd" and int(wildcards.gamma) == min(
        config["wisv"]["gammas"]
    ):
        settings["greedy_check_tie_margin"] = config["wisv"]["greedy_tie_margin"]
    return settings


def wisv_channel_of(wildcards):
    """The one WISV channel condition a job reads (its ``wchannel``)."""
    return {wildcards.wchannel: WISV_CHANNELS[wildcards.wchannel]}


def wisv_evaluate_settings(wildcards):
    """The WISV keys one evaluation reads: the retransmission scheme, and for the CSI-reading
    variants the fading seeds they were decoded under."""
    keys = ["arq"]
    if wildcards.wvariant in CSI_VARIANTS:
        keys.append("csi_decode_seeds")
    return pick(config["wisv"], *keys)


def wisv_evaluate_fading(wildcards):
    """A channel-free decode is re-priced under evaluation.fading_seeds; a CSI-reading variant
    under the seeds it was decoded with (wisv.csi_decode_seeds) instead."""
    if wildcards.wvariant in CSI_VARIANTS:
        return {}
    return pick(config["evaluation"], "fading_seeds")


# Many devices, one edge (rules in multidevice.smk).
MULTIDEVICE = config["multidevice"]
MD_METHODS = list(MULTIDEVICE["methods"]) if MULTIDEVICE["enabled"] else []
MD_CHANNELS = list(MULTIDEVICE["channels"])
# Each simulated channel's devices, cycled: a population's wisv channels, or the one channel.
MD_POPULATIONS = {
    name: list(MULTIDEVICE["populations"].get(name, [name])) for name in MD_CHANNELS
}
MD_GAMMA = MULTIDEVICE["wisv_gamma"]
# What profile_batching reads: the mode, and either what to time or the given table.
MD_BATCHING = {"mode": config["latency"]["mode"], **multidevice_batch_plan(config)}
if MD_BATCHING["mode"] == "given":
    MD_BATCHING["given"] = MULTIDEVICE["target_batch_s"]
else:
    MD_BATCHING["repeats"] = MULTIDEVICE["batch_repeats"]
    MD_BATCHING["contexts"] = MULTIDEVICE["batch_contexts"]
# What simulate_multidevice reads of the multidevice section (not the report's keys).
MD_SWEEP = {
    key: MULTIDEVICE[key]
    for key in (
        "device_counts",
        "uplink",
        "tdma_slot_s",
        "batching",
        "prompts_per_device",
        "policy_sweep",
    )
}


def multidevice_table_keys(wildcards):
    """(channel, fading seed) of each decoded table a method is simulated from: one table
    (CU-HLM tokens, a channel-free WISV decode), or for the CSI-reading variants one per
    channel of the population and decoded seed."""
    method = wildcards.mdmethod
    if method not in CSI_VARIANTS:
        return [[MD_POPULATIONS[wildcards.mdchannel][0], 0]]
    channels = dict.fromkeys(MD_POPULATIONS[wildcards.mdchannel])
    return [[c, int(s)] for c in channels for s in CSI_DECODE_SEEDS]


def multidevice_tables(wildcards):
    """The decoded tables of multidevice_table_keys: CU-HLM tokens, or WISV rounds at
    multidevice.wisv_gamma."""
    method = wildcards.mdmethod
    if method in CUHLM_VARIANTS:
        return [f"results/cuhlm/decode/{method}/tokens.parquet"]
    if method not in CSI_VARIANTS:
        return [
            wisv_decode_path(
                wisv_decodes(method, MD_GAMMA, "any", "measured")[0], "parquet"
            )
        ]
    channels = dict.fromkeys(MD_POPULATIONS[wildcards.mdchannel])
    # In the order of multidevice_table_keys: per channel, per decoded seed.
    return [
        wisv_decode_path(stem, "parquet")
        for c in channels
        for stem in wisv_decodes(method, MD_GAMMA, c, "measured")
    ]


def multidevice_channels(wildcards):
    """The wisv channel conditions of a simulated channel's population."""
    return {c: WISV_CHANNELS[c] for c in MD_POPULATIONS[wildcards.mdchannel]}


def multidevice_extras(wildcards):
    """What else a method's pricing reads: k* and |V| (CU-HLM); the model sizes and the
    decision head's time (WISV)."""
    method = wildcards.mdmethod
    if method in CUHLM_VARIANTS:
        return {"kstar": "results/cuhlm/calibration/kstar.json"}
    extras = {"provenance": model_provenance()}
    # The head variants are charged their decision head's measured time.
    if method not in ("vanilla_sd", "topk_accept"):
        extras["head"] = HEAD_TIMES
    return extras


def multidevice_pricing(wildcards):
    """Only the keys a method's pricing reads (its family's), and the prefill policy."""
    method = wildcards.mdmethod
    prefill = MULTIDEVICE["prefill"]
    if method in CUHLM_VARIANTS:
        return {"prob_bits": config["cuhlm"]["prob_bits"], "prefill": prefill}
    return {
        "gamma": MD_GAMMA,
        "hidden_bits": config["wisv"]["hidden_bits"],
        "arq": config["wisv"]["arq"],
        "prefill": prefill,
    }
