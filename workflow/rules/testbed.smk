# Testbed against simulator (methods §11): the draft in a device process and the target in an
# edge process over loopback TCP through a user-space link; measured bytes and latency held
# against the delay model's for the same prompts, fading draws and link.
TESTBED = config["testbed"]
TB_CHANNELS = list(TESTBED["channels"]) if TESTBED["enabled"] else []
TB_METHODS = list(TESTBED["methods"])
# What the answers read of the section (not which channels run: one job per channel).
TB_SETTINGS = {k: v for k, v in TESTBED.items() if k not in ("enabled", "channels")}
TB_TABLES = ("answers", "frames", "tokens", "rounds")
# What the CU-HLM family's device policies read (edgespec.variants.CUHLM_POLICY_READS).
TB_POLICY = {
    "uncertainty_samples": config["uncertainty"]["num_samples"],
    "theta_max": config["uncertainty"]["theta_max"],
    **pick(config["cuhlm"], "theta_tv", "online_k_max"),
}
# The head of the measured regime: the testbed runs on this machine's compute.
TB_HEADS = {
    m: "results/wisv/measured/head/wisv_head.pt"
    for m in TB_METHODS
    if m.startswith("wisv")
}
# What the methods read besides the pair and the prompts: the calibration fit (CU-HLM online's
# device) and the CSI head (WISV's edge).
TB_EXTRA = {
    **(
        {"fit": "results/cuhlm/calibration/fit.json"}
        if "cuhlm_online" in TB_METHODS
        else {}
    ),
    **({"head": "results/wisv/measured/head/wisv_head.pt"} if TB_HEADS else {}),
}


wildcard_constraints:
    tbchannel="|".join(TB_CHANNELS) if TB_CHANNELS else "none",


rule testbed_run:
    """Every testbed method's answers on one channel: device, edge and link processes, one core
    each for device and edge, over loopback TCP."""
    input:
        **TB_EXTRA,
        prompts=eval_prompt_files(),
        provenance=model_provenance(),
        precision=PRECISION,
        prefill=expand("results/prefill/{shard}.safetensors", shard=EVAL_SHARDS),
    output:
        **{name: f"results/testbed/{{tbchannel}}/{name}.parquet" for name in TB_TABLES},
    log:
        "logs/testbed_run/{tbchannel}.log",
    benchmark:
        "benchmarks/testbed_run/{tbchannel}.tsv"
    conda:
        "../envs/edgespec.yaml"
    # Device and edge on a core each; nothing else runs beside what the testbed times.
    threads: timing_threads
    resources:
        mem_mb=grows_with_attempt(MODEL_MEM_MB),
        runtime=grows_with_attempt(60),
    params:
        model_dir=model_dir_of,
        models=MODEL_LOAD,
        testbed=TB_SETTINGS,
        channel=lambda wildcards: WISV_CHANNELS[wildcards.tbchannel],
        temperature=config["decoding"]["temperature"],
        policy=TB_POLICY,
        heads=TB_HEADS,
        prompting=PROMPTING,
        seed=config["seed"],
    script:
        "../scripts/testbed.py"


rule testbed_reference:
    """The single-process decode of every testbed answer (the tokens the testbed must commit)."""
    input:
        **TB_EXTRA,
        prompts=eval_prompt_files(),
        provenance=model_provenance(),
        precision=PRECISION,
        prefill=expand("results/prefill/{shard}.safetensors", shard=EVAL_SHARDS),
    output:
        reference="results/testbed/reference.parquet",
    log:
        "logs/testbed_reference.log",
    benchmark:
        "benchmarks/testbed_reference.tsv"
    conda:
        "../envs/edgespec.yaml"
    threads: MODEL_THREADS
    resources:
        mem_mb=grows_with_attempt(MODEL_MEM_MB),
        runtime=grows_with_attempt(60),
    params:
        model_dir=model_dir_of,
        models=MODEL_LOAD,
        testbed=TB_SETTINGS,
        channels={c: WISV_CHANNELS[c] for c in TB_CHANNELS},
        temperature=config["decoding"]["temperature"],
        policy=TB_POLICY,
        heads=TB_HEADS,
        prompting=PROMPTING,
        seed=config["seed"],
    script:
        "../scripts/testbed_reference.py"


localrules:
    report_testbed,


rule report_testbed:
    """Testbed against simulator: bytes and latency measured against the delay model's, term
    by term, with the latency ratio's interval over prompts per method and channel."""
    input:
        **{
            name: expand(
                f"results/testbed/{{channel}}/{name}.parquet", channel=TB_CHANNELS
            )
            for name in TB_TABLES
        },
        reference="results/testbed/reference.parquet",
        profile="results/latency/profile.json",
        head_times=HEAD_TIMES,
        provenance=model_provenance(),
    output:
        summary=report(
            "results/report/testbed_summary.csv",
            caption="../report/testbed_summary.rst",
            category="Testbed",
            subcategory="Tables",
        ),
        markdown="results/report/testbed_summary.md",
        answers="results/report/testbed_answers.csv",
        figure=report(
            "results/report/testbed_against_simulator.png",
            caption="../report/testbed_against_simulator.rst",
            category="Testbed",
            subcategory="Figures",
        ),
    log:
        "logs/report_testbed.log",
    conda:
        "../envs/edgespec.yaml"
    threads: 1
    resources:
        mem_mb=grows_with_attempt(2000),
        runtime=grows_with_attempt(10),
    params:
        testbed=TB_SETTINGS,
        channels={c: WISV_CHANNELS[c] for c in TB_CHANNELS},
        models=pick(MODELS, "preset", "dtype"),
        seed=config["seed"],
    script:
        "../scripts/report_testbed.py"
