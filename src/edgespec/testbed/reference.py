"""Rule testbed_reference: the single-process decode of every testbed answer.

Each answer is decoded in one process with both models, by the project's own decoders
(``edgespec.cuhlm.decode.decode_variant``, ``edgespec.wisv.decode.decode_wisv``), one prompt
at a time (batch of one), from the same prefill store, with the generator seed and fading
draws the testbed's answer has (``edgespec.testbed.stage``). The testbed's committed tokens
must equal these (a prefix where the testbed stopped early under ``testbed.max_uplink_s``).
Channel-blind methods are decoded once (channel "any"); the CSI head's per channel.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import torch

from edgespec.cuhlm.decode import decode_variant
from edgespec.data.records import PromptRecord
from edgespec.testbed.answer import TOKENWISE_METHODS
from edgespec.testbed.stage import answer_decoding, answer_seed
from edgespec.wireless.channel import ChannelCondition
from edgespec.wisv.decode import CSI_DECODE, decode_wisv, variant_rule
from edgespec.wisv.evaluate import fading_seed

ANY_CHANNEL = "any"
"""The ``channel`` of a reference decoded without a channel (its method never reads one)."""


def reference_tokens(
    models: tuple[torch.nn.Module, torch.nn.Module],
    methods: Sequence[str],
    channels: Mapping[str, Mapping[str, Any]],
    records: Sequence[PromptRecord],
    prompts: Sequence[Sequence[int]],
    settings: Mapping[str, Any],
    decoding: Mapping[str, Any],
    policies: Mapping[str, Any],
    heads: Mapping[str, str],
    seed: int,
    prefilled=None,
) -> pd.DataFrame:
    """One row per (method, channel, prompt): the single-process decode's new tokens.

    ``models``: (draft, target); ``channels``: name -> ChannelCondition fields;
    ``settings``: config section ``testbed``; ``decoding``: temperature (the CU-HLM
    family's), eos_token_ids, pad_token_id; ``policies``: method -> ``TokenPolicy``;
    ``heads``: method -> decision-head file.
    """
    draft, target = models
    rows = []
    for method in methods:
        cfg = answer_decoding(
            method,
            settings,
            decoding["temperature"],
            decoding["eos_token_ids"],
            decoding["pad_token_id"],
        )
        for record, prompt in zip(records, prompts, strict=True):
            key = {"method": method, "prompt_id": record.id}
            if method in TOKENWISE_METHODS:
                generator = torch.Generator().manual_seed(answer_seed(seed, method, record.id))
                _, done = decode_variant(
                    method,
                    draft,
                    target,
                    [list(prompt)],
                    [record.id],
                    cfg,
                    policies[method],
                    generator,
                    prefilled=prefilled,
                )
                rows.append({**key, "channel": ANY_CHANNEL, "tokens": list(done[0])})
                continue
            if method == "vanilla_sd":
                _, done = decode_wisv(
                    method, draft, target, [list(prompt)], [record.id], cfg,
                    int(settings["gamma"]), None, None, prefilled=prefilled,
                )  # fmt: skip
                rows.append({**key, "channel": ANY_CHANNEL, "tokens": list(done[0])})
                continue
            rule = variant_rule(CSI_DECODE, heads[method])
            for name, fields in channels.items():
                _, done = decode_wisv(
                    "wisv_fh",
                    draft,
                    target,
                    [list(prompt)],
                    [record.id],
                    cfg,
                    int(settings["gamma"]),
                    rule.acceptance,
                    ChannelCondition.from_dict({**fields, "name": name}),
                    fading_seed=fading_seed(seed, int(settings["fading_seed"])),
                    csi_encoder=rule.csi_encoder,
                    prefilled=prefilled,
                )
                rows.append({**key, "channel": name, "tokens": list(done[0])})
    return pd.DataFrame(rows, columns=["method", "prompt_id", "channel", "tokens"])
