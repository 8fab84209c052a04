rule prepare_data:
    """Draw one prompt set and split it into calibration and evaluation prompts."""
    output:
        prompts="results/data/{dataset}.jsonl",
    log:
        "logs/prepare_data/{dataset}.log",
    conda:
        "../envs/edgespec.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        spec=dataset_spec,
        calib_fraction=config["data"]["calib_fraction"],
        seed=config["seed"],
    script:
        "../scripts/prepare_data.py"
