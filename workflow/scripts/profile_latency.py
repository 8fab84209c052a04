"""Rule profile_latency (edgespec.profiling): measured (or configured) compute times of the pair."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

from edgespec.artifacts import write_json  # noqa: E402

params = snakemake.params
latency = params.latency
if latency["mode"] == "given":
    profile = {**latency["given"], "source": "given"}
else:
    from edgespec.data.records import read_jsonl
    from edgespec.profiling import measure_latency_profile
    from edgespec.runconfig import chat_prompts, load_models

    draft, target, tokenizer = load_models(params, snakemake.input, snakemake.threads)
    record = read_jsonl(snakemake.input.prompts)[0]
    prompt = chat_prompts(tokenizer, [record], params.prompting)[0]
    profile = measure_latency_profile(
        draft,
        target,
        prompt,
        params.gammas,
        latency["repeats"],
        params.uncertainty["num_samples"],
        params.uncertainty["theta_max"],
        params.seed,
    )
write_json(profile, snakemake.output.profile)
