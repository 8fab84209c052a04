# Many devices, one edge (methods §10): batched target forwards timed once (a robust profile),
# then every method's decoded table re-priced as a discrete-event simulation of N devices sharing
# the uplink band and the edge; torch-free apart from the timing.
wildcard_constraints:
    mdmethod="|".join(MD_METHODS) if MD_METHODS else "none",
    mdchannel="[a-z][a-z0-9]*",


# With latency.mode given, profile_batching writes multidevice.target_batch_s and loads no
# model: it runs where Snakemake runs (see profile_latency).
if MD_BATCHING["mode"] == "given":

    localrules:
        profile_batching,


rule profile_batching:
    """Time the target's batched, KV-cached forwards (context x tokens per row x batch size,
    interleaved repeats, outliers re-timed) for the edge of the multi-device simulation, or
    take multidevice.target_batch_s (latency.mode given); and the evaluation prompts' lengths
    (the prefill each answer costs the edge)."""
    input:
        prompts=expand("results/data/{dataset}.jsonl", dataset=DATASETS),
        provenance=model_provenance(),
        precision=PRECISION,
    output:
        times="results/latency/target_batching.json",
    log:
        "logs/profile_batching.log",
    benchmark:
        "benchmarks/profile_batching.tsv"
    priority: PRIORITY_TIMING
    conda:
        "../envs/edgespec.yaml"
    threads: timing_threads
    resources:
        **(MODEL_GPU if MD_BATCHING["mode"] == "measured" else {}),
        mem_mb=grows_with_attempt(
            MODEL_MEM_MB if MD_BATCHING["mode"] == "measured" else 1000
        ),
        runtime=grows_with_attempt(30),
    params:
        model_dir=model_dir_of,
        batching=MD_BATCHING,
        # The models are loaded only when the forwards are timed (else only the tokenizer).
        models=MODEL_LOAD if MD_BATCHING["mode"] == "measured" else None,
        prompting=PROMPTING,
        seed=config["seed"],
    script:
        "../scripts/profile_batching.py"


rule simulate_multidevice:
    """One method under one channel or population: N devices sharing the band and the edge,
    for every replicate, edge policy, uplink scheme and device count (discrete events;
    torch-free)."""
    input:
        unpack(multidevice_extras),
        tables=multidevice_tables,
        profile="results/latency/profile.json",
        batching="results/latency/target_batching.json",
    output:
        runs="results/multidevice/{mdmethod}/{mdchannel}.parquet",
    log:
        "logs/simulate_multidevice/{mdmethod}/{mdchannel}.log",
    benchmark:
        "benchmarks/simulate_multidevice/{mdmethod}/{mdchannel}.tsv"
    conda:
        "../envs/edgespec.yaml"
    threads: 1
    resources:
        mem_mb=lambda wildcards, attempt: 2000 * attempt,
        runtime=lambda wildcards, attempt: 20 * attempt,
    params:
        channels=multidevice_channels,
        population=lambda wildcards: MD_POPULATIONS[wildcards.mdchannel],
        table_keys=multidevice_table_keys,
        sweep=MD_SWEEP,
        pricing=multidevice_pricing,
        replicates=config["evaluation"]["fading_seeds"],
        seed=config["seed"],
    script:
        "../scripts/simulate_multidevice.py"


localrules:
    report_multidevice,


rule report_multidevice:
    """Throughput, latency per token, utilisation and batch size against N per method
    (intervals over replicates), the knee, peak and service-level capacity, the ranking,
    which protocol overtakes which, the headline and the figures."""
    input:
        runs=expand(
            "results/multidevice/{mdmethod}/{mdchannel}.parquet",
            mdmethod=MD_METHODS,
            mdchannel=MD_CHANNELS,
        ),
        profile="results/latency/profile.json",
        batching="results/latency/target_batching.json",
        provenance=model_provenance(),
    output:
        summary=report(
            "results/report/multidevice_summary.csv",
            caption="../report/multidevice_summary.rst",
            category="Many devices",
            subcategory="Tables",
        ),
        markdown="results/report/multidevice_summary.md",
        capacity="results/report/multidevice_capacity.csv",
        ranking="results/report/multidevice_ranking.csv",
        crossovers="results/report/multidevice_crossovers.csv",
        headline="results/report/multidevice_headline.csv",
        scaling=report(
            "results/report/multidevice_scaling.png",
            caption="../report/multidevice_scaling.rst",
            category="Many devices",
            subcategory="Figures",
        ),
        utilisation=report(
            "results/report/multidevice_utilisation.png",
            caption="../report/multidevice_utilisation.rst",
            category="Many devices",
            subcategory="Figures",
        ),
        policies=report(
            "results/report/multidevice_policies.png",
            caption="../report/multidevice_policies.rst",
            category="Many devices",
            subcategory="Figures",
        ),
    log:
        "logs/report_multidevice.log",
    conda:
        "../envs/edgespec.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        headline={"uplink": MULTIDEVICE["uplink"][0], "channel": MD_CHANNELS[0]},
        settings={
            key: MULTIDEVICE[key]
            for key in ("batching", "tdma_slot_s", "prefill", "capacity")
        },
        seed_interval=config["evaluation"]["seed_interval"],
    script:
        "../scripts/report_multidevice.py"
