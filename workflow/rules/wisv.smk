rule mine_labels:
    """AutoJudge-style mismatch labels on one shard's calibration prompts (methods §4.2): a
    dataset, or small datasets that fill a batch together."""
    input:
        prompts=shard_prompts(CALIB_SHARDS),
        provenance=model_provenance(),
        precision=PRECISION,
    output:
        table="results/wisv/labels/{shard}/mismatches.parquet",
        hidden="results/wisv/labels/{shard}/hidden.npz",
        summary="results/wisv/labels/{shard}/summary.json",
    log:
        "logs/mine_labels/{shard}.log",
    benchmark:
        "benchmarks/mine_labels/{shard}.tsv"
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
        decoding=WISV_GREEDY_DECODING,
        wisv=pick(
            config["wisv"],
            "max_new_tokens",
            "similarity_threshold",
            "max_mismatches_per_prompt",
            "label_max_new_tokens",
            "answer_marker",
        ),
        prompting=PROMPTING,
    script:
        "../scripts/mine_labels.py"


localrules:
    join_labels,


rule join_labels:
    """The mined mismatches of every shard as one table, hidden states in the same order, and
    one summary (counts and seconds summed)."""
    input:
        table=expand(
            "results/wisv/labels/{shard}/mismatches.parquet", shard=CALIB_SHARDS
        ),
        hidden=expand("results/wisv/labels/{shard}/hidden.npz", shard=CALIB_SHARDS),
        summary=expand("results/wisv/labels/{shard}/summary.json", shard=CALIB_SHARDS),
    output:
        table="results/wisv/labels/mismatches.parquet",
        hidden="results/wisv/labels/hidden.npz",
        summary="results/wisv/labels/summary.json",
    log:
        "logs/join_labels.log",
    priority: PRIORITY_CHAIN
    conda:
        "../envs/edgespec.yaml"
    threads: 1
    resources:
        mem_mb=grows_with_attempt(8000),
        runtime=grows_with_attempt(10),
    params:
        # mine_labels' summary: the label budget is a setting; every other number is summed
        summary_settings=["label_max_new_tokens"],
    script:
        "../scripts/join_datasets.py"


rule relabel_csi:
    """Channel-aware relabeling: one cvxpy boolean programme per CSI sample and prompt."""
    input:
        table="results/wisv/labels/mismatches.parquet",
        hidden="results/wisv/labels/hidden.npz",
        profile="results/latency/profile.json",
    output:
        train="results/wisv/relabel/train.parquet",
        safe="results/wisv/relabel/safe_fraction.csv",
        summary="results/wisv/relabel/summary.json",
        figure=report(
            "results/wisv/relabel/safe_vs_channel.png",
            caption="../report/safe_vs_channel.rst",
            category="WISV",
            subcategory="Relabeling",
        ),
    log:
        "logs/relabel_csi.log",
    benchmark:
        "benchmarks/relabel_csi.tsv"
    priority: PRIORITY_CHAIN
    conda:
        "../envs/edgespec.yaml"
    threads: 1
    resources:
        mem_mb=grows_with_attempt(4000),
        runtime=grows_with_attempt(30),
    params:
        wisv=pick(
            config["wisv"], "relabel", "hidden_bits", "correlation", "csi_features"
        ),
        channels=WISV_CHANNELS,
        seed=config["seed"],
    script:
        "../scripts/relabel_csi.py"


rule train_head:
    """The WISV decision head (hidden states + CSI, relabeled labels) and its two ablations (no
    CSI: original labels; relabeled labels), each tau on the same original validation labels.
    """
    input:
        table="results/wisv/labels/mismatches.parquet",
        hidden="results/wisv/labels/hidden.npz",
        train="results/wisv/relabel/train.parquet",
    output:
        wisv_head="results/wisv/head/wisv_head.pt",
        judge_head="results/wisv/head/no_csi_head.pt",
        relabel_head="results/wisv/head/relabel_no_csi_head.pt",
        metrics="results/wisv/head/metrics.json",
        figure=report(
            "results/wisv/head/calibration.png",
            caption="../report/head_calibration.rst",
            category="WISV",
            subcategory="Decision head",
        ),
    log:
        "logs/train_head.log",
    benchmark:
        "benchmarks/train_head.tsv"
    priority: PRIORITY_CHAIN
    conda:
        "../envs/edgespec.yaml"
    threads: 1
    resources:
        mem_mb=grows_with_attempt(4000),
        runtime=grows_with_attempt(30),
    params:
        wisv=pick(config["wisv"], "head", "csi_features"),
        channels=WISV_CHANNELS,
        seed=config["seed"],
    script:
        "../scripts/train_head.py"


rule decode_wisv:
    """Greedy gamma-token rounds of a channel-blind variant, once, without a channel, on one
    shard's evaluation prompts (a dataset, or small datasets that fill a batch together).
    """
    input:
        prompts=shard_prompts(EVAL_SHARDS),
        provenance=model_provenance(),
        precision=PRECISION,
        prefill=["results/prefill/{shard}.safetensors"],
        heads=wisv_head_inputs,
    output:
        rounds="results/wisv/decode/{wvariant}/g{gamma}/any/{shard}.parquet",
        completions="results/wisv/decode/{wvariant}/g{gamma}/any/{shard}.jsonl",
    log:
        "logs/decode_wisv/{wvariant}/g{gamma}/any/{shard}.log",
    benchmark:
        "benchmarks/decode_wisv/{wvariant}/g{gamma}/any/{shard}.tsv"
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
        decoding=WISV_GREEDY_DECODING,
        wisv=wisv_decode_settings,
        prompting=PROMPTING,
        seed=config["seed"],
    script:
        "../scripts/decode_wisv.py"


rule decode_wisv_csi:
    """Greedy gamma-token rounds of the CSI-reading head under one channel and fading seed, on
    one shard's evaluation prompts."""
    input:
        prompts=shard_prompts(EVAL_SHARDS),
        provenance=model_provenance(),
        precision=PRECISION,
        prefill=["results/prefill/{shard}.safetensors"],
        heads=["results/wisv/head/wisv_head.pt", "results/wisv/head/metrics.json"],
    output:
        rounds="results/wisv/decode/wisv/g{gamma}/{wchannel}/s{fseed}/{shard}.parquet",
        completions="results/wisv/decode/wisv/g{gamma}/{wchannel}/s{fseed}/{shard}.jsonl",
    log:
        "logs/decode_wisv/wisv/g{gamma}/{wchannel}/s{fseed}/{shard}.log",
    benchmark:
        "benchmarks/decode_wisv/wisv/g{gamma}/{wchannel}/s{fseed}/{shard}.tsv"
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
        decoding=WISV_GREEDY_DECODING,
        wisv=pick(config["wisv"], "max_new_tokens"),
        channels=wisv_channel_of,
        prompting=PROMPTING,
        seed=config["seed"],
    script:
        "../scripts/decode_wisv.py"


localrules:
    join_wisv_decode,


rule join_wisv_decode:
    """One WISV decode's shards ({wdecode}: a channel-blind variant's g{gamma}/any, or the
    CSI-reading head's g{gamma}/{channel}/s{seed}) as one table and one completions file, in
    dataset order."""
    input:
        rounds=expand(
            "results/wisv/decode/{{wdecode}}/{shard}.parquet", shard=EVAL_SHARDS
        ),
        completions=expand(
            "results/wisv/decode/{{wdecode}}/{shard}.jsonl", shard=EVAL_SHARDS
        ),
    output:
        rounds="results/wisv/decode/{wdecode}.parquet",
        completions="results/wisv/decode/{wdecode}.jsonl",
    log:
        "logs/join_wisv_decode/{wdecode}.log",
    conda:
        "../envs/edgespec.yaml"
    threads: 1
    resources:
        mem_mb=grows_with_attempt(4000),
        runtime=grows_with_attempt(10),
    script:
        "../scripts/join_datasets.py"


rule score_wisv:
    """Text scores of every decode (exact match, answer fidelity, semantic accuracy), in one job
    that loads the sentence encoder once, so the evaluation jobs stay torch-free."""
    input:
        completions=wisv_completion_files(),
        vanilla=wisv_vanilla_completions(),
        prompts=eval_prompt_files(),
    output:
        scores=wisv_score_files(),
    log:
        "logs/score_wisv.log",
    conda:
        "../envs/edgespec.yaml"
    threads: 1
    resources:
        mem_mb=grows_with_attempt(4000),
        runtime=grows_with_attempt(20),
    params:
        decodes=wisv_scored_decodes(),
        gammas=config["wisv"]["gammas"],
    script:
        "../scripts/score_wisv.py"


rule evaluate_wisv:
    """Price one variant's rounds under one channel and gamma over every fading seed (common
    random numbers); torch-free."""
    input:
        rounds=wisv_decoded_rounds,
        head=wisv_head_times,
        profile="results/latency/profile.json",
        provenance=model_provenance(),
    output:
        costs="results/wisv/metrics/{wvariant}/{wchannel}/g{gamma}.parquet",
        metrics="results/wisv/metrics/{wvariant}/{wchannel}/g{gamma}.json",
    log:
        "logs/evaluate_wisv/{wvariant}/{wchannel}/g{gamma}.log",
    # Seconds each: on a cluster, the profile's group-components batches them into few jobs,
    # a group of WISV's own (see evaluate_cuhlm).
    group:
        "evaluate_wisv"
    conda:
        "../envs/edgespec.yaml"
    threads: 1
    resources:
        mem_mb=grows_with_attempt(4000),
        runtime=grows_with_attempt(5),
        group_slots=1,
    params:
        wisv=wisv_evaluate_settings,
        channels=wisv_channel_of,
        evaluation=wisv_evaluate_fading,
        seed=config["seed"],
    script:
        "../scripts/evaluate_wisv.py"


localrules:
    report_wisv,


rule report_wisv:
    """WISV table against vanilla SD beside the paper's numbers, with intervals, and the WISV
    figures."""
    input:
        unpack(run_precision),
        costs=expand(
            "results/wisv/metrics/{wvariant}/{wchannel}/g{gamma}.parquet",
            wvariant=WISV_VARIANTS,
            wchannel=sorted(WISV_CHANNELS),
            gamma=config["wisv"]["gammas"],
        ),
        scores=wisv_score_files(),
        head="results/wisv/head/metrics.json",
        head_times=HEAD_TIMES,
        labels="results/wisv/labels/summary.json",
        relabel="results/wisv/relabel/summary.json",
        safe="results/wisv/relabel/safe_fraction.csv",
        wisv_rounds=(
            expand(
                "results/wisv/decode/wisv/g{gamma}/{wchannel}/s{fseed}.parquet",
                gamma=config["wisv"]["gammas"][0],
                wchannel=sorted(WISV_CHANNELS)[0],
                fseed=CSI_DECODE_SEEDS[0],
            )
            if set(CSI_VARIANTS) & set(WISV_VARIANTS)
            else []
        ),
        profile="results/latency/profile.json",
        provenance=model_provenance(),
    output:
        summary=report(
            "results/report/wisv_summary.csv",
            caption="../report/wisv_summary.rst",
            category="WISV",
            subcategory="Tables",
        ),
        markdown="results/report/wisv_summary.md",
        headline="results/report/wisv_headline.csv",
        latency=report(
            "results/report/wisv_latency_vs_channel.png",
            caption="../report/wisv_latency_vs_channel.rst",
            category="WISV",
            subcategory="Figures",
        ),
        aal=report(
            "results/report/wisv_aal_vs_gamma.png",
            caption="../report/wisv_aal_vs_gamma.rst",
            category="WISV",
            subcategory="Figures",
        ),
        tau=report(
            "results/report/wisv_accuracy_vs_tau.png",
            caption="../report/wisv_accuracy_vs_tau.rst",
            category="WISV",
            subcategory="Figures",
        ),
    log:
        "logs/report_wisv.log",
    conda:
        "../envs/edgespec.yaml"
    threads: 1
    resources:
        mem_mb=grows_with_attempt(2000),
        runtime=grows_with_attempt(10),
    params:
        channels=WISV_CHANNELS,
        variants=WISV_VARIANTS,
        wisv=pick(config["wisv"], "correlation", "csi_decode_seeds", "hidden_bits"),
        evaluation=config["evaluation"],
        seed=config["seed"],
    script:
        "../scripts/report_wisv.py"
