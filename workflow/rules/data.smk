# Preparing a dataset may download it from a dataset hub: it runs where Snakemake runs, which
# has the network (compute nodes often do not); it is small.
localrules:
    prepare_data,


rule prepare_data:
    """Draw one prompt set and split it into calibration and evaluation prompts."""
    input:
        data_files=dataset_files,
    output:
        prompts="results/data/{dataset}.jsonl",
    log:
        "logs/prepare_data/{dataset}.log",
    # The latency and batching profiles read the prepared prompts: prepared first, they are
    # ready when select_dtype frees every core.
    priority: PRIORITY_TIMING
    conda:
        "../envs/edgespec.yaml"
    threads: 1
    resources:
        mem_mb=grows_with_attempt(2000),
        runtime=grows_with_attempt(10),
    params:
        spec=dataset_spec,
        calib_fraction=lambda wildcards: calib_fraction_of(wildcards.dataset),
        seed=config["seed"],
    script:
        "../scripts/prepare_data.py"
