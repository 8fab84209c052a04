rule profile_latency:
    """Time the pair on this machine (or take the configured profile) for the delay model."""
    input:
        prompts=f"results/data/{DATASETS[0]}.jsonl",
        provenance=model_provenance(),
        precision=PRECISION,
    output:
        profile="results/latency/profile.json",
    log:
        "logs/profile_latency.log",
    benchmark:
        "benchmarks/profile_latency.tsv"
    conda:
        "../envs/edgespec.yaml"
    threads: MODEL_THREADS
    resources:
        mem_mb=16000,
        runtime=30,
    params:
        model_dir=model_dir_of,
        models=MODEL_LOAD,
        # The profile reads mode, repeats and given; the paper-hardware profile is derived
        # later from its own keys, so changing those does not re-time the models.
        latency={k: v for k, v in config["latency"].items() if k != "paper_hardware"},
        gammas=PROFILE_GAMMAS,
        uncertainty=config["uncertainty"],
        prompting=PROMPTING,
        seed=config["seed"],
    script:
        "../scripts/profile_latency.py"
