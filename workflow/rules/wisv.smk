rule mine_labels:
    """AutoJudge-style mismatch labels on the calibration prompts (methods §4.2)."""
    input:
        prompts=eval_prompt_files(),
        provenance=model_provenance(),
        precision=PRECISION,
    output:
        table="results/wisv/labels/mismatches.parquet",
        hidden="results/wisv/labels/hidden.npz",
        summary="results/wisv/labels/summary.json",
    log:
        "logs/mine_labels.log",
    benchmark:
        "benchmarks/mine_labels.tsv"
    conda:
        "../envs/edgespec.yaml"
    threads: MODEL_THREADS
    resources:
        mem_mb=16000,
        runtime=240,
    params:
        model_dir=model_dir_of,
        models=MODEL_LOAD,
        decoding=config["decoding"],
        wisv=config["wisv"],
        prompting=PROMPTING,
    script:
        "../scripts/mine_labels.py"


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
    conda:
        "../envs/edgespec.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        wisv=config["wisv"],
        channels=WISV_CHANNELS,
        seed=config["seed"],
    script:
        "../scripts/relabel_csi.py"


rule train_head:
    """The WISV decision head (hidden states + CSI, relabeled labels) and its two ablations (no
    CSI: original labels; relabeled labels), each tau on the same original validation labels,
    and the head's measured time per round."""
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
    conda:
        "../envs/edgespec.yaml"
    threads: MODEL_THREADS
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        wisv=config["wisv"],
        channels=WISV_CHANNELS,
        seed=config["seed"],
        latency=config["latency"],
    script:
        "../scripts/train_head.py"


rule decode_wisv:
    """Greedy gamma-token rounds of a channel-blind variant, once, without a channel."""
    input:
        prompts=eval_prompt_files(),
        provenance=model_provenance(),
        precision=PRECISION,
        heads=wisv_head_inputs,
    output:
        rounds="results/wisv/decode/{wvariant}/g{gamma}/any.parquet",
        completions="results/wisv/decode/{wvariant}/g{gamma}/any.jsonl",
    log:
        "logs/decode_wisv/{wvariant}/g{gamma}/any.log",
    benchmark:
        "benchmarks/decode_wisv/{wvariant}/g{gamma}/any.tsv"
    conda:
        "../envs/edgespec.yaml"
    threads: MODEL_THREADS
    resources:
        mem_mb=16000,
        runtime=240,
    params:
        model_dir=model_dir_of,
        models=MODEL_LOAD,
        decoding=config["decoding"],
        wisv=config["wisv"],
        channels=WISV_CHANNELS,
        prompting=PROMPTING,
        seed=config["seed"],
    script:
        "../scripts/decode_wisv.py"


rule decode_wisv_csi:
    """Greedy gamma-token rounds of the CSI-reading head under one channel and fading seed."""
    input:
        prompts=eval_prompt_files(),
        provenance=model_provenance(),
        precision=PRECISION,
        heads=["results/wisv/head/wisv_head.pt", "results/wisv/head/metrics.json"],
    output:
        rounds="results/wisv/decode/wisv/g{gamma}/{wchannel}/s{fseed}.parquet",
        completions="results/wisv/decode/wisv/g{gamma}/{wchannel}/s{fseed}.jsonl",
    log:
        "logs/decode_wisv/wisv/g{gamma}/{wchannel}/s{fseed}.log",
    benchmark:
        "benchmarks/decode_wisv/wisv/g{gamma}/{wchannel}/s{fseed}.tsv"
    conda:
        "../envs/edgespec.yaml"
    threads: MODEL_THREADS
    resources:
        mem_mb=16000,
        runtime=240,
    params:
        model_dir=model_dir_of,
        models=MODEL_LOAD,
        decoding=config["decoding"],
        wisv=config["wisv"],
        channels=WISV_CHANNELS,
        prompting=PROMPTING,
        seed=config["seed"],
    script:
        "../scripts/decode_wisv.py"


rule score_wisv:
    """Text scores of one decode (exact match, answer fidelity, semantic accuracy), so that the
    evaluation jobs stay torch-free."""
    input:
        completions="results/wisv/decode/{wdecode}.jsonl",
        vanilla=wisv_vanilla_completions,
        prompts=eval_prompt_files(),
    output:
        scores="results/wisv/scores/{wdecode}.parquet",
    log:
        "logs/score_wisv/{wdecode}.log",
    conda:
        "../envs/edgespec.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=20,
    script:
        "../scripts/score_wisv.py"


rule evaluate_wisv:
    """Price one variant's rounds under one channel and gamma over every fading seed (common
    random numbers); torch-free."""
    input:
        rounds=wisv_decoded_rounds,
        head=wisv_head_metrics,
        profile="results/latency/profile.json",
        provenance=model_provenance(),
    output:
        costs="results/wisv/metrics/{wvariant}/{wchannel}/g{gamma}.parquet",
        metrics="results/wisv/metrics/{wvariant}/{wchannel}/g{gamma}.json",
    log:
        "logs/evaluate_wisv/{wvariant}/{wchannel}/g{gamma}.log",
    conda:
        "../envs/edgespec.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=10,
    params:
        wisv=config["wisv"],
        channels=WISV_CHANNELS,
        evaluation=config["evaluation"],
        seed=config["seed"],
    script:
        "../scripts/evaluate_wisv.py"


localrules:
    report_wisv,


rule report_wisv:
    """WISV table against vanilla SD beside the paper's numbers, with intervals, and the WISV
    figures."""
    input:
        costs=expand(
            "results/wisv/metrics/{wvariant}/{wchannel}/g{gamma}.parquet",
            wvariant=WISV_VARIANTS,
            wchannel=sorted(WISV_CHANNELS),
            gamma=config["wisv"]["gammas"],
        ),
        scores=wisv_score_files(),
        head="results/wisv/head/metrics.json",
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
        mem_mb=2000,
        runtime=10,
    params:
        variants=WISV_VARIANTS,
        channels=WISV_CHANNELS,
        gammas=config["wisv"]["gammas"],
        wisv=config["wisv"],
        evaluation=config["evaluation"],
        seed=config["seed"],
    script:
        "../scripts/report_wisv.py"
