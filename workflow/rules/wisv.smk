rule mine_labels:
    """AutoJudge-style mismatch labels on one dataset's calibration prompts (methods §4.2)."""
    input:
        prompts="results/data/{dataset}.jsonl",
        provenance=model_provenance(),
    output:
        table="results/wisv/labels/{dataset}/mismatches.parquet",
        hidden="results/wisv/labels/{dataset}/hidden.npz",
    log:
        "logs/mine_labels/{dataset}.log",
    benchmark:
        "benchmarks/mine_labels/{dataset}.tsv"
    conda:
        "../envs/edgespec.yaml"
    threads: MODEL_THREADS
    resources:
        mem_mb=grows_with_attempt(16000),
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
        ),
        prompting=PROMPTING,
    script:
        "../scripts/mine_labels.py"


localrules:
    join_labels,


rule join_labels:
    """The mined mismatches of every dataset as one table, hidden states in the same order."""
    input:
        table=expand(
            "results/wisv/labels/{dataset}/mismatches.parquet", dataset=DATASETS
        ),
        hidden=expand("results/wisv/labels/{dataset}/hidden.npz", dataset=DATASETS),
    output:
        table="results/wisv/labels/mismatches.parquet",
        hidden="results/wisv/labels/hidden.npz",
    log:
        "logs/join_labels.log",
    conda:
        "../envs/edgespec.yaml"
    threads: 1
    resources:
        mem_mb=grows_with_attempt(8000),
        runtime=grows_with_attempt(10),
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
    conda:
        "../envs/edgespec.yaml"
    threads: 1
    resources:
        mem_mb=grows_with_attempt(4000),
        runtime=grows_with_attempt(30),
    params:
        wisv=pick(config["wisv"], "relabel", "hidden_bits", "csi_features"),
        seed=config["seed"],
    script:
        "../scripts/relabel_csi.py"


rule train_head:
    """The WISV decision head (with CSI) and the no-CSI judge head, with tau on validation."""
    input:
        table="results/wisv/labels/mismatches.parquet",
        hidden="results/wisv/labels/hidden.npz",
        train="results/wisv/relabel/train.parquet",
    output:
        wisv_head="results/wisv/head/wisv_head.pt",
        judge_head="results/wisv/head/no_csi_head.pt",
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
    conda:
        "../envs/edgespec.yaml"
    threads: MODEL_THREADS
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
    """Greedy gamma-token rounds under one variant; the channel only matters for CSI heads."""
    input:
        prompts=eval_prompt_files(),
        provenance=model_provenance(),
        heads=wisv_head_inputs,
    output:
        rounds="results/wisv/decode/{wvariant}/g{gamma}/{wchannel}.parquet",
        completions="results/wisv/decode/{wvariant}/g{gamma}/{wchannel}.jsonl",
    log:
        "logs/decode_wisv/{wvariant}/g{gamma}/{wchannel}.log",
    benchmark:
        "benchmarks/decode_wisv/{wvariant}/g{gamma}/{wchannel}.tsv"
    conda:
        "../envs/edgespec.yaml"
    threads: MODEL_THREADS
    resources:
        mem_mb=grows_with_attempt(16000),
        runtime=grows_with_attempt(240),
    params:
        model_dir=model_dir_of,
        models=MODEL_LOAD,
        decoding=WISV_GREEDY_DECODING,
        wisv=wisv_decode_settings,
        channels=wisv_decode_channel,
        prompting=PROMPTING,
        seed=config["seed"],
    script:
        "../scripts/decode_wisv.py"


rule evaluate_wisv:
    """Price one variant's rounds under one channel and gamma: latency, AAL, text scores."""
    input:
        rounds=wisv_decoded_rounds,
        completions=wisv_decoded_completions,
        reference="results/wisv/decode/vanilla_sd/g{gamma}/any.jsonl",
        prompts=eval_prompt_files(),
        profile="results/latency/profile.json",
        provenance=model_provenance(),
    output:
        metrics="results/wisv/metrics/{wvariant}/{wchannel}/g{gamma}.json",
    log:
        "logs/evaluate_wisv/{wvariant}/{wchannel}/g{gamma}.log",
    # Seconds each: on a cluster, the profile's group-components batches them into few jobs.
    group:
        "evaluate"
    conda:
        "../envs/edgespec.yaml"
    threads: 1
    resources:
        mem_mb=grows_with_attempt(4000),
        runtime=grows_with_attempt(5),
    params:
        wisv=pick(config["wisv"], "max_new_tokens", "hidden_bits"),
        channels=wisv_channel_of,
        seed=config["seed"],
    script:
        "../scripts/evaluate_wisv.py"


localrules:
    report_wisv,


rule report_wisv:
    """WISV table against vanilla SD beside the paper's numbers, and the WISV figures."""
    input:
        metrics=expand(
            "results/wisv/metrics/{wvariant}/{wchannel}/g{gamma}.json",
            wvariant=WISV_VARIANTS,
            wchannel=sorted(WISV_CHANNELS),
            gamma=config["wisv"]["gammas"],
        ),
        head="results/wisv/head/metrics.json",
        safe="results/wisv/relabel/safe_fraction.csv",
        wisv_rounds=(
            expand(
                "results/wisv/decode/wisv/g{gamma}/{wchannel}.parquet",
                gamma=config["wisv"]["gammas"][0],
                wchannel=sorted(WISV_CHANNELS)[0],
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
        wisv=pick(config["wisv"], "hidden_bits"),
    script:
        "../scripts/report_wisv.py"
