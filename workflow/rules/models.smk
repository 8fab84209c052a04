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


rule select_dtype:
    """The decoding dtype of this run: models.dtype, or for auto the faster one on this machine."""
    input:
        provenance=model_provenance(),
    output:
        precision=PRECISION,
    log:
        "logs/select_dtype.log",
    conda:
        "../envs/edgespec.yaml"
    threads: MODEL_THREADS
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        dtype=MODELS["dtype"],
        device=MODELS["device"],
        quantize=MODELS["quantize"],
        batch_size=config["decoding"]["batch_size"],
        gamma=max([*config["wisv"]["gammas"], 1]),
    script:
        "../scripts/select_dtype.py"


rule check_quantization:
    """Top-1 agreement and mean TV of the int8-quantised target against the unquantised one."""
    input:
        provenance=model_provenance(),
        prompts=eval_prompt_files(),
    output:
        report="results/machine/quantization.json",
    log:
        "logs/check_quantization.log",
    conda:
        "../envs/edgespec.yaml"
    threads: MODEL_THREADS
    resources:
        mem_mb=16000,
        runtime=30,
    params:
        model_dir=model_dir_of,
        quantize=MODELS["quantize"],
        num_prompts=4,
        new_tokens=32,
        prompting=PROMPTING,
    script:
        "../scripts/check_quantization.py"
