"""Rule joint_kstar (CU-HLM wing, edgespec.cuhlm.joint): the joint (u_th, k) programme at every
channel of the sweep, from the bound curves optimize_k saved, for the report's k*-vs-SNR figure
(cuhlm_joint decodes the solution at cuhlm.kstar_channel, which optimize_k writes to kstar.json),
and again under every reported risk budget and slower uplinks (where the channel moves it)."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import logging

import pandas as pd

from edgespec.artifacts import read_json, write_csv
from edgespec.cuhlm.joint import joint_row, joint_sensitivity, latency_inputs, solve_joint
from edgespec.cuhlm.kcurves import load_curves
from edgespec.wireless.channel import ChannelCondition
from edgespec.wireless.delay import LatencyProfile

params = snakemake.params
cuhlm = params.cuhlm
curves = load_curves(snakemake.input.curves)
profile = LatencyProfile.from_dict(read_json(snakemake.input.profile))
reference_name = cuhlm["kstar_channel"]
rows = []
for name, spec in params.channels.items():
    condition = ChannelCondition.from_dict(spec)
    latency = latency_inputs(profile, condition, cuhlm["prob_bits"], curves.vocab_size)
    solution = solve_joint(curves, cuhlm["theta_tv"], latency, cuhlm["risk_budget"])
    rows.append(joint_row(name, condition, solution, decoded=name == reference_name))
table = pd.DataFrame(rows).sort_values(["fading", "snr_db"], kind="stable")
logging.info(
    "joint programme over the sweep: k* %s, u_th %s (decoded at %s)",
    table["k_star"].tolist(),
    table["u_th"].tolist(),
    reference_name,
)
write_csv(table, snakemake.output.joint)
# Where does the channel move the choice? Other risk budgets and slower uplinks, on the
# reference channel's fading model.
fading = params.channels[reference_name]["fading"]
same_fading = {
    name: ChannelCondition.from_dict(spec)
    for name, spec in params.channels.items()
    if spec["fading"] == fading
}
budgets = sorted({*cuhlm["risk_budgets"], cuhlm["risk_budget"]})
sensitivity = joint_sensitivity(
    curves, cuhlm["theta_tv"], profile, same_fading, cuhlm["prob_bits"], budgets
)
write_csv(sensitivity, snakemake.output.sensitivity)
