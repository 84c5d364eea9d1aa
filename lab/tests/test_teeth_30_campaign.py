"""docs/journal/calibration/cpu-2026-12-06-teeth-30.md: every count and table row the entry quotes for
its campaigns is what the re-derive commands print from the kept lines (parsed, not copied here)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from journal_commands import ROOT, re_derive

pytestmark = pytest.mark.fast

ENTRY = "calibration/cpu-2026-12-06-teeth-30.md"


def _section(text: str, start: str, end: str) -> str:
    return text.split(start)[1].split(end)[0]


def test_campaign_a_counts_and_rows_re_derive() -> None:
    text, out = re_derive(ENTRY, "teeth_campaign")
    section = _section(text, "## Campaign A", "## Campaign B")
    for count in re.findall(r"(A/A red|slowdown missed|teeth red) (\d+) of (\d+)", section):
        what, k, n = count
        printed = {"A/A red": f"A/A red (FAIL): {k} of {n}",
                   "slowdown missed": f"30% slowdown green (no FAIL): {k} of {n}",
                   "teeth red": f"teeth red (the A/A FAILED or the slowdown did not): {k} of {n}"}[what]
        assert printed in out
    rows = re.findall(r"^\| (\d) \| (\w+) ([\d.]+x \([\d.-]+\)) \| \**(\w+) ([\d.]+x \([\d.-]+\))", text, re.M)
    assert len(rows) >= 6
    for run, aa, aa_text, slow, slow_text in rows[:6]:
        line = next(x for x in out.splitlines() if x.startswith(f"run {run}: "))
        assert f"A/A {aa.lower()} {aa_text[:-1]}" in line and f"slowdown {slow.lower()} {slow_text[:-1]}" in line


def test_campaign_b_counts_and_rows_re_derive_from_its_own_log() -> None:
    text = (ROOT / "docs" / "journal" / ENTRY).read_text()
    section = _section(text, "## Campaign B: its 10 runs", "Runs 1-5 ran")
    log = "docs/evidence/calibration/cpu-2026-12-06-teeth-30/campaign-b-teeth.log"
    out = subprocess.run([sys.executable, "-m", "specgate_lab.analyses.teeth_campaign", log], cwd=ROOT,
                         check=True, capture_output=True, text=True).stdout
    assert "A/A red (FAIL): 0 of 10" in out and "30% slowdown green (no FAIL): 0 of 10" in out
    assert "A/A red 0 of 10 (exact one-sided 95 % upper bound 25.9 %)" in section
    rows = re.findall(r"^\| (\d+) \| (\w+) ([\d.]+x \([\d.-]+\)) \| (\w+) ([\d.]+x \([\d.-]+\))", section, re.M)
    assert len(rows) == 10
    for run, aa, aa_text, slow, slow_text in rows:
        line = next(x for x in out.splitlines() if x.startswith(f"run {run}: "))
        assert f"A/A {aa.lower()} {aa_text[:-1]}" in line and f"slowdown {slow.lower()} {slow_text[:-1]}" in line
