"""Sizing a study from a pilot's per-prompt scores (edgespec.cuhlm.pilot)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from edgespec.cuhlm.pilot import main, pilot_table

Z95_80 = 1.959963984540054 + 0.8416212335729143


def _scores() -> pd.DataFrame:
    hlm = [0.8, 0.6, 0.7, 0.9]
    online = [0.8, 0.3, 0.7, 0.9]
    return pd.DataFrame(
        {
            "variant": ["hlm"] * 4 + ["cuhlm_online"] * 4 + ["llm_only"] * 4,
            "prompt_id": ["p1", "p2", "p3", "p4"] * 3,
            "dataset": "arithmetic",
            "semantic_accuracy": hlm + online + hlm,
            "similarity_to_llm": [0.7] * 4 + [0.7] * 4 + [1.0] * 4,
        }
    )


def test_the_pilot_table_sizes_each_figure_by_hand():
    table = pilot_table(_scores(), difference=0.02).set_index(["variant", "metric"])
    row = table.loc[("cuhlm_online", "semantic_accuracy")]
    sd = math.sqrt(0.136889 / 3)  # tests/test_power.py's hand case
    assert (row["dataset"], row["n"], row["floor"]) == ("arithmetic", 4, pytest.approx(0.75))
    assert row["relative"] == pytest.approx(0.9) and row["sd"] == pytest.approx(sd, abs=1e-5)
    assert row["mdd"] == pytest.approx(Z95_80 * sd / 2, abs=1e-5)
    assert row["n_needed"] == math.ceil((Z95_80 * row["sd"] / 0.02) ** 2)  # 896
    # identical to the floor: no spread, nothing to size; LLM-only has no similarity to itself
    assert math.isnan(table.loc[("llm_only", "semantic_accuracy"), "n_needed"])
    assert ("llm_only", "similarity_to_llm") not in table.index
    assert ("hlm", "semantic_accuracy") not in table.index


def test_the_pilot_command_prints_the_table(tmp_path, capsys):
    path = tmp_path / "scores.parquet"
    _scores().to_parquet(path)
    main([str(path), "--difference", "0.05"])
    out = capsys.readouterr().out
    assert out.startswith("| dataset | variant | metric | n | floor | relative | sd | mdd |")
    assert "| arithmetic | cuhlm_online | semantic_accuracy | 4 |" in out
    with pytest.raises(KeyError, match="hlm"):
        pilot_table(_scores().query("variant != 'hlm'"))


def test_a_figure_against_llm_only_is_sized_from_a_second_lossless_sample():
    """U-HLM's similarity to LLM-only has no pilot variant to pair with: the floor's (HLM's)
    scores b stand for two independent lossless samples, sd = sqrt(2) sd(b) / mean(b)."""
    scores = _scores()
    scores.loc[scores["variant"] == "hlm", "similarity_to_llm"] = [0.6, 0.8, 0.7, 0.9]
    table = pilot_table(scores).set_index(["variant", "metric"])
    row = table.loc[("lossless_pair", "similarity_to_llm")]
    sd_b = math.sqrt(((0.15**2 + 0.05**2) * 2) / 3)  # b's deviations from 0.75, ddof 1
    assert row["floor"] == pytest.approx(0.75) and row["relative"] == pytest.approx(1.0)
    assert row["sd"] == pytest.approx(math.sqrt(2) * sd_b / 0.75)  # 0.2811
    assert row["n_needed"] == math.ceil((Z95_80 * row["sd"] / 0.02) ** 2)
    assert ("lossless_pair", "semantic_accuracy") not in table.index
