"""Rule check_quantization (edgespec.models.precision): how much int8 dynamic quantisation
changes the model it quantises (the target under int8_dynamic, the draft under
int8_dynamic_draft), against the unquantised one (top-1 agreement and mean TV)."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import copy
import logging

import torch

from edgespec.artifacts import write_json
from edgespec.models.load import load_model, load_tokenizer, pair_source
from edgespec.models.precision import quantization_fidelity, quantize_for_role, quantized_roles
from edgespec.runconfig import chat_prompts, prompt_split

params = snakemake.params
torch.set_num_threads(snakemake.threads)
# The target's change is what every figure carries where both are quantised; only the model
# measured is loaded.
role = "target" if "target" in quantized_roles(params.quantize) else "draft"
source = pair_source(params.model_dir, "float32")
reference = load_model(source / role, "float32", role)
tokenizer = load_tokenizer(source / "target", role="target")
quantized = quantize_for_role(copy.deepcopy(reference), role, params.quantize)
records = prompt_split(snakemake.input.prompts, "eval")[: params.num_prompts]
prompts = chat_prompts(tokenizer, records, params.prompting)
report = quantization_fidelity(reference, quantized, prompts, params.new_tokens)
logging.info("quantisation %s of the %s: %s", params.quantize, role, report)
write_json({"quantize": params.quantize, "model": role, **report}, snakemake.output.report)
