"""The README stays true: its configuration reference is the schema's, its commands are CI's."""

from __future__ import annotations

from edgespec.config import REPO_ROOT, schema_reference_markdown

README = (REPO_ROOT / "README.md").read_text()


def test_readme_config_reference_matches_schema():
    start = README.index("<!-- config-reference:start -->") + len("<!-- config-reference:start -->")
    end = README.index("<!-- config-reference:end -->")
    assert README[start:end].strip() == schema_reference_markdown().strip(), (
        "README configuration reference is stale: regenerate it with "
        "edgespec.config.schema_reference_markdown()"
    )


def test_readme_opens_with_the_two_commands_and_ci_runs_the_test_one():
    block = README.split("```bash\n", 1)[1].split("```", 1)[0].strip().splitlines()
    assert len(block) == 2
    assert "snakemake" in block[0] and "pytest" in block[1]
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    assert block[1] in ci
