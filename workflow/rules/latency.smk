# With latency.mode given the profiles write the configured times and load no model: they run
# where Snakemake runs, instead of waiting in a cluster's queue for seconds of work.
if not LATENCY_MEASURED:

    localrules:
        profile_latency,
        profile_head,


rule profile_latency:
    """Time the pair on this machine (or take the configured profile) for the delay model."""
    input:
        # A given profile reads neither the models nor the prompts.
        prompts=f"results/data/{DATASETS[0]}.jsonl" if LATENCY_MEASURED else [],
        provenance=model_provenance() if LATENCY_MEASURED else [],
        precision=PRECISION if LATENCY_MEASURED else [],
    output:
        profile="results/latency/profile.json",
    log:
        "logs/profile_latency.log",
    benchmark:
        "benchmarks/profile_latency.tsv"
    priority: PRIORITY_TIMING
    conda:
        "../envs/edgespec.yaml"
    threads: timing_threads
    resources:
        **(MODEL_GPU if LATENCY_MEASURED else {}),
        mem_mb=grows_with_attempt(MODEL_MEM_MB if LATENCY_MEASURED else 1000),
        runtime=grows_with_attempt(30),
    params:
        model_dir=model_dir_of,
        # The profile reads mode and repeats, or the given table; the paper-hardware profile is
        # derived later from its own keys and the head's time is train_head's, so changing
        # those does not re-time the models.
        latency=(
            pick(config["latency"], "mode", "repeats")
            if LATENCY_MEASURED
            else {"mode": "given", "given": GIVEN_PROFILE}
        ),
        models=MODEL_LOAD if LATENCY_MEASURED else None,
        gammas=PROFILE_GAMMAS if LATENCY_MEASURED else None,
        uncertainty=config["uncertainty"] if LATENCY_MEASURED else None,
        prompting=PROMPTING if LATENCY_MEASURED else None,
        seed=config["seed"] if LATENCY_MEASURED else None,
    script:
        "../scripts/profile_latency.py"


rule profile_head:
    """Time each WISV decision head per round on this machine (or take latency.given's), on
    untrained heads of the trained heads' sizes: the edge's head time is known before the labels
    the heads learn from."""
    input:
        # the pair's hidden sizes; a given time reads nothing
        provenance=model_provenance() if LATENCY_MEASURED else [],
    output:
        times=HEAD_TIMES,
    log:
        "logs/profile_head.log",
    benchmark:
        "benchmarks/profile_head.tsv"
    priority: PRIORITY_TIMING
    conda:
        "../envs/edgespec.yaml"
    threads: timing_threads
    resources:
        mem_mb=grows_with_attempt(2000),
        runtime=grows_with_attempt(10),
    params:
        latency=HEAD_TIMING,
        gamma=max(config["wisv"]["gammas"]),
        # what sizes the heads: a given time reads neither
        head_hidden=config["wisv"]["head"]["hidden"] if LATENCY_MEASURED else None,
        csi_features=config["wisv"]["csi_features"] if LATENCY_MEASURED else None,
    script:
        "../scripts/profile_head.py"
