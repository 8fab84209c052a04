"""Rule check_quantization (edgespec.models.precision): how much int8 dynamic quantisation
changes the target, against the unquantised pair (top-1 agreement and mean TV)."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import copy
import logging

from edgespec.artifacts import write_json
from edgespec.models.load import load_pair_from_dir
from edgespec.models.precision import quantization_fidelity, quantize_model
from edgespec.runconfig import chat_prompts, prompt_split

params = snakemake.params
_, target, tokenizer = load_pair_from_dir(
    params.model_dir, {"dtype": "float32", "device": "cpu"}, snakemake.threads
)
quantized = quantize_model(copy.deepcopy(target), params.quantize)
records = prompt_split(snakemake.input.prompts, "eval")[: params.num_prompts]
prompts = chat_prompts(tokenizer, records, params.prompting)
report = quantization_fidelity(target, quantized, prompts, params.new_tokens)
logging.info("quantisation %s of the target: %s", params.quantize, report)
write_json({"quantize": params.quantize, "model": "target", **report}, snakemake.output.report)
