# Configuration validation and path helpers shared by every rule module.
import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "src"))

from edgespec.config import check_inputs_exist, validate_config

config.update(validate_config(config))
check_inputs_exist(config)

MODELS = config["models"]
MODEL_DIR = f"{MODELS['cache_dir']}/{MODELS['preset']}"
DATASETS = sorted(config["data"]["datasets"])
MODEL_THREADS = MODELS["threads"]


wildcard_constraints:
    dataset="|".join(DATASETS),


def model_provenance():
    return f"{MODEL_DIR}/provenance.json"


def final_outputs():
    return [
        *expand("results/traces/{dataset}/tokens.parquet", dataset=DATASETS),
        "results/latency/profile.json",
    ]


def dataset_spec(wildcards):
    return config["data"]["datasets"][wildcards.dataset]
