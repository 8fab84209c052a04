localrules:
    fetch_models,


rule fetch_models:
    """Materialise the draft/target pair as a safetensors cache with provenance."""
    output:
        provenance=f"{MODEL_DIR}/provenance.json",
    log:
        "logs/fetch_models.log",
    benchmark:
        "benchmarks/fetch_models.tsv"
    conda:
        "../envs/edgespec.yaml"
    threads: MODEL_THREADS
    resources:
        mem_mb=16000,
        runtime=60,
    params:
        model_dir=model_dir_of_output,
        models=MODELS,
    script:
        "../scripts/fetch_models.py"
