"""Rule profile_latency (edgespec.profiling; CU-HLM wing, edgespec.cuhlm.profile): measured (or
configured) compute times of the pair, prompt prefill and the CU-HLM vocabulary work included."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

from edgespec.artifacts import write_json  # noqa: E402

params = snakemake.params
latency = params.latency
if latency["mode"] == "given":
    # The head's time is not a profile entry: profile_head reads latency.given.head_round_s.
    given = {k: v for k, v in latency["given"].items() if k != "head_round_s"}
    profile = {**given, "source": "given"}
else:
    from edgespec.cuhlm.profile import measure_draft_vocabulary_operations
    from edgespec.data.records import read_jsonl
    from edgespec.profiling import measure_latency_profile, measure_prefill_token_s
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
    profile.update(measure_draft_vocabulary_operations(draft, prompt, latency["repeats"]))
    # WISV charges each answer its prompt's prefill on both models.
    profile["draft_prefill_token_s"] = measure_prefill_token_s(draft, prompt, latency["repeats"])
    profile["target_prefill_token_s"] = measure_prefill_token_s(target, prompt, latency["repeats"])
write_json(profile, snakemake.output.profile)
