# Device-edge hybrid LM inference: CU-HLM and WISV reproduced as one workflow.
# `snakemake --cores 2` runs the embedded default (config.yaml); see README.md.
from pathlib import Path

from snakemake.utils import min_version

min_version("9.0")


configfile: Path(workflow.basedir) / "config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/models.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/traces.smk"
include: "workflow/rules/latency.smk"
include: "workflow/rules/cuhlm.smk"
include: "workflow/rules/wisv.smk"
include: "workflow/rules/multidevice.smk"
include: "workflow/rules/testbed.smk"


rule all:
    default_target: True
    input:
        final_outputs(),
