rule collect_traces:
    """Decode the calibration prompts with standard HLM and record every token."""
    input:
        prompts="results/data/{dataset}.jsonl",
        provenance=model_provenance(),
        precision=PRECISION,
    output:
        tokens="results/traces/{dataset}/tokens.parquet",
        hidden="results/traces/{dataset}/hidden.npz",
        meta="results/traces/{dataset}/meta.json",
    log:
        "logs/collect_traces/{dataset}.log",
    benchmark:
        "benchmarks/collect_traces/{dataset}.tsv"
    priority: PRIORITY_CHAIN
    conda:
        "../envs/edgespec.yaml"
    threads: MODEL_THREADS
    resources:
        **MODEL_GPU,
        mem_mb=grows_with_attempt(MODEL_MEM_MB),
        runtime=grows_with_attempt(240),
    params:
        model_dir=model_dir_of,
        models=MODEL_LOAD,
        decoding=config["decoding"],
        uncertainty=config["uncertainty"],
        traces=config["traces"],
        prompting=PROMPTING,
        seed=config["seed"],
    script:
        "../scripts/collect_traces.py"
