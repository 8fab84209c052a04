"""Rule optimize_k (CU-HLM wing, edgespec.cuhlm.kstar, edgespec.cuhlm.traces): the offline k*
over every k in [1, |V|] (cvxpy, HiGHS), the joint (u_th, k) programme at cuhlm.kstar_channel,
the per-grid bound table, and the dense bound curves (rule joint_kstar solves the joint
programme per channel from them)."""

from edgespec.artifacts import setup_logging

setup_logging(snakemake.log[0])

import pandas as pd
import torch

from edgespec import plots
from edgespec.artifacts import read_json, write_csv, write_json
from edgespec.cuhlm.calibration import LinearFit
from edgespec.cuhlm.kcurves import save_curves
from edgespec.cuhlm.kstar import (
    choose_k,
    load_replay_draft,
    ordered_trace,
    replay_completions,
    replayed_curves,
    trace_k_grid,
)
from edgespec.cuhlm.traces import replay_draft_probs
from edgespec.runconfig import chat_prompts, model_settings, prompt_split
from edgespec.wireless.channel import ChannelCondition
from edgespec.wireless.delay import LatencyProfile

params, inputs, cuhlm = snakemake.params, snakemake.input, snakemake.params.cuhlm
fit_record = read_json(inputs.fit)
trace = ordered_trace(pd.concat([pd.read_parquet(p) for p in inputs.tokens], ignore_index=True))
k_grid = trace_k_grid(trace)
# x(t) of every calibration token, recomputed by one teacher-forced draft forward per prompt
# with the draft as the traces ran it: same dtype, same quantisation.
torch.set_num_threads(snakemake.threads)
models = model_settings(params.models, inputs.precision)
draft, tokenizer, token_by_token = load_replay_draft(params.model_dir, models)
records, completions = replay_completions(trace, prompt_split(inputs.prompts, "calib"))
prompts = chat_prompts(tokenizer, records, params.prompting)
probs = replay_draft_probs(draft, prompts, completions, params.temperature, token_by_token)
curves, diff = replayed_curves(probs, trace, LinearFit.from_record(fit_record))
profile = LatencyProfile.from_dict(read_json(inputs.profile))
reference = ChannelCondition.from_dict(params.reference_channel)
choice = choose_k(curves, fit_record, profile, reference, cuhlm)
save_curves(curves, snakemake.output.curves)
table = choice.grid_table(trace, k_grid)
write_csv(table, snakemake.output.table)
write_json(choice.record(k_grid, diff), snakemake.output.kstar)
plots.bound_vs_k(
    table,
    choice.theta_tv,
    choice.offline.k_star,
    snakemake.output.figure,
    subtitle=f"|V| = {curves.vocab_size}; {len(trace)} traced tokens",
    dense_k=curves.k_values,
    dense_bound=curves.mean_bound(choice.u_th),
)
