"""The out-of-sample advice check (docs/advice.md, issue 62 build item 5) re-derived from the kept data:
the command's whole output (table and summary) must stand in the doc as it is."""

from pathlib import Path

import pytest

from specgate_lab.analyses.advice_out_of_sample import main

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "docs" / "evidence" / "calibration" / "cpu-2026-12-04c" / "advice"
CLUSTERING = ROOT / "docs" / "evidence" / "advice" / "cpu-2026-12-06-schedule" / "advise-report.json.gz"
COMMAND = ("python -m specgate_lab.analyses.advice_out_of_sample docs/evidence/calibration/cpu-2026-12-04c/advice \\\n"
           "        --clustering docs/evidence/advice/cpu-2026-12-06-schedule/advise-report.json.gz")


def test_the_kept_session_re_derives_the_docs_out_of_sample_section(capsys):
    assert main([str(DATA), "--clustering", str(CLUSTERING)]) == 0
    out = capsys.readouterr().out
    table, summary = out.split("\n\n", 1)
    doc = (ROOT / "docs" / "advice.md").read_text()
    assert COMMAND in doc
    assert table in doc
    assert f"```\n{summary.rstrip()}\n```" in doc
    assert table.count("\n| coding |") + table.count("\n| extraction |") == 40
    assert "lab interval (95 % simultaneous): 40 of 40" in summary
    assert "product's fitted interval (as shipped): 37 of 40" in summary
    assert "25 above, 15 below" in summary
