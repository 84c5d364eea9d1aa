"""The CI the docs describe is the CI that exists: every workflow file the docs name is shipped, and
every shipped one is described (issue 47: the page named a workflow file that did not exist)."""

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "docs" / "reports-and-ci.md"]


def test_the_workflow_files_the_docs_name_exist_and_every_one_is_named():
    named = {m for doc in DOCS for m in re.findall(r"\.github/workflows/[\w.-]+\.ya?ml", doc.read_text())}
    shipped = {str(p.relative_to(ROOT)) for p in (ROOT / ".github" / "workflows").glob("*.y*ml")}
    assert shipped, "no workflow file shipped"
    assert named - shipped == set(), f"named in the docs but not shipped: {sorted(named - shipped)}"
    missing = {f for f in shipped if f not in (ROOT / "docs" / "reports-and-ci.md").read_text()}
    assert not missing, f"shipped but not described in docs/reports-and-ci.md: {sorted(missing)}"


def test_ci_runs_the_stages_the_workflow_runs():
    ci = (ROOT / ".ci" / "run").read_text()
    cpu = (ROOT / ".github" / "workflows" / "specgate-cpu.yml").read_text()
    assert "bash .ci/run fast" in cpu and "bash .ci/run cpu" in cpu
    assert "fast) fast_stage" in ci and "cpu) cpu_stage" in ci
