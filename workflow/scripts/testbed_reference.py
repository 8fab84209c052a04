"""Rule testbed_reference (edgespec.testbed.reference): the single-process decode of every
testbed answer, both models in one process, batch of one, the testbed's seeds and fading draws."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

from edgespec.artifacts import read_json, write_parquet
from edgespec.decoding.prefill_store import PrefillStore
from edgespec.models.load import stop_token_ids
from edgespec.runconfig import chat_prompts, load_models
from edgespec.testbed.reference import reference_tokens
from edgespec.testbed.stage import device_policies, pick_records

params, inputs = snakemake.params, snakemake.input
settings = params.testbed
draft, target, tokenizer = load_models(params, inputs, snakemake.threads)
records = pick_records(list(inputs.prompts), settings["prompts"])
fit = read_json(inputs.fit) if inputs.get("fit") else None
pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
reference = reference_tokens(
    (draft, target),
    settings["methods"],
    params.channels,
    records,
    chat_prompts(tokenizer, records, params.prompting),
    settings,
    {
        "temperature": params.temperature,
        "eos_token_ids": stop_token_ids(tokenizer, target),
        "pad_token_id": pad,
    },
    device_policies(settings["methods"], params.policy, fit),
    dict(params.heads),
    params.seed,
    prefilled=PrefillStore.load(list(inputs.prefill)),
)
write_parquet(reference, snakemake.output.reference)
