rule collect_traces:
    """Decode the calibration prompts with standard HLM and record every token."""
    input:
        prompts="results/data/{dataset}.jsonl",
        provenance=model_provenance(),
    output:
        tokens="results/traces/{dataset}/tokens.parquet",
        hidden="results/traces/{dataset}/hidden.npz",
        meta="results/traces/{dataset}/meta.json",
    params:
        model_dir=MODEL_DIR,
        models=MODELS,
        decoding=config["decoding"],
        uncertainty=config["uncertainty"],
        traces=config["traces"],
        system_prompt=config["data"]["system_prompt"],
        seed=config["seed"],
    log:
        "logs/collect_traces/{dataset}.log",
    benchmark:
        "benchmarks/collect_traces/{dataset}.tsv"
    threads: MODEL_THREADS
    resources:
        mem_mb=16000,
        runtime=240,
    script:
        "../scripts/collect_traces.py"
