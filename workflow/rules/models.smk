localrules:
    fetch_models,


rule fetch_models:
    """Materialise the draft/target pair as a safetensors cache with provenance."""
    output:
        provenance=f"{MODEL_DIR}/provenance.json",
    params:
        model_dir=MODEL_DIR,
        models=MODELS,
    log:
        "logs/fetch_models.log",
    benchmark:
        "benchmarks/fetch_models.tsv"
    threads: MODEL_THREADS
    resources:
        mem_mb=16000,
        runtime=60,
    script:
        "../scripts/fetch_models.py"
