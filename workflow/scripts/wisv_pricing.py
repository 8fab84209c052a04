"""Rule wisv_pricing (WISV wing, edgespec.wisv.regimes): what one pricing regime prices with
(latency profile, the uplink's sizes, the decision heads' time per round): the measured profile
of this machine, or the emulated testbed of the WISV paper; torch-free."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import logging

from edgespec.artifacts import read_json, write_json
from edgespec.wisv.regimes import regime_pricing

params, inp = snakemake.params, snakemake.input
measured = params.regime == "measured"
pricing = regime_pricing(
    params.regime,
    hidden_bits=params.hidden_bits,
    gammas=params.gammas,
    measured_profile=read_json(inp.profile) if measured else None,
    head_times=read_json(inp.head) if measured else None,
    provenance=read_json(inp.provenance) if measured else None,
    testbed=params.testbed,
    head_hidden=params.head_hidden,
    csi_features=params.csi_features,
)
logging.info("%s", pricing["description"])
write_json(pricing, snakemake.output.pricing)
