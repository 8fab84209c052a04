"""The docs stay true: their generated blocks equal what their sources render, the README opens
with the two commands CI runs, and it stays short enough to read in five minutes."""

from __future__ import annotations

import re

import pytest

from edgespec import readme_results
from edgespec.config import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()
REGENERATE = "regenerate it with python -m edgespec.readme_results write"


def test_readme_headline_is_generated_from_the_latest_full_run():
    assert readme_results.readme_block(README) == readme_results.render(), (
        f"README headline results are stale: {REGENERATE}"
    )


def test_results_index_lists_every_snapshot():
    index = (readme_results.RESULTS_DIR / readme_results.INDEX).read_text()
    assert index == readme_results.render_index(), f"docs/results/README.md is stale: {REGENERATE}"
    for run_dir, _ in readme_results.runs():
        assert f"]({run_dir.name}/)" in index


def test_config_reference_and_key_table_match_the_schema():
    keys, reference = readme_results.config_tables()
    config_readme = (REPO_ROOT / "config" / "README.md").read_text()
    assert readme_results.block(config_readme, *readme_results.CONFIG_BLOCK) == reference + "\n", (
        f"config/README.md reference is stale: {REGENERATE}"
    )
    assert readme_results.block(README, *readme_results.KEYS_BLOCK) == keys + "\n", (
        f"README key table is stale: {REGENERATE}"
    )


def test_readme_opens_with_the_two_commands_and_ci_runs_the_test_one():
    block = README.split("```bash\n", 1)[1].split("```", 1)[0].strip().splitlines()
    assert len(block) == 2
    assert "snakemake" in block[0] and "pytest" in block[1]
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    assert block[1] in ci


def test_readme_is_short_and_its_sections_come_in_order():
    assert len(README.splitlines()) <= 320, "README.md grew past ~300 lines: link, don't inline"
    sections = re.findall(r"^## (.+)$", README, flags=re.MULTILINE)
    assert sections[:2] == ["What it reproduces", "Headline results"]
    assert sections[-1] == "Known differences from the papers"


def test_every_relative_link_in_the_docs_resolves():
    docs = [REPO_ROOT / "README.md", REPO_ROOT / "config" / "README.md"]
    docs += sorted((REPO_ROOT / "docs").glob("*.md"))
    docs.append(readme_results.RESULTS_DIR / readme_results.INDEX)
    broken = []
    for doc in docs:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if "://" in target:
                continue
            if not (doc.parent / target).exists():
                broken.append(f"{doc.relative_to(REPO_ROOT)} -> {target}")
    assert not broken, "\n".join(broken)


def test_a_generated_block_without_its_markers_is_an_error():
    with pytest.raises(ValueError, match="no generated block"):
        readme_results.replace_block("no markers here", "body")
