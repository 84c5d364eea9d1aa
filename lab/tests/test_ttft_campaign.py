"""The third 2026-12-06 lab entry (docs/journal/lab/2026-12-06-gpu-ttft-advice.md): every TTFT line it quotes is
what its re-derive command prints from the kept raw data, and the injection's size is the rule's."""

from __future__ import annotations

import gzip
import json

import pytest
from journal_commands import ROOT, re_derive

from specgate_lab.analyses import ttft_campaign

pytestmark = pytest.mark.fast

KEPT = ROOT / "docs" / "evidence" / "lab" / "2026-12-06-h100-ttft"


def test_every_ttft_line_the_entry_quotes_re_derives() -> None:
    text, out = re_derive("lab/2026-12-06-gpu-ttft-advice.md", "ttft_campaign")
    quoted = [line for line in text.splitlines()
              if line.startswith(("- S67 ", "- S68 ", "- cpu ", "  - ttft: ", "  - candidate TTFT at",
                                  "  - reference TTFT at"))]
    assert len(quoted) == 16
    printed = out.splitlines()
    assert [line for line in quoted if line not in printed] == []


@pytest.mark.parametrize("lease", ["S67", "S68"])
def test_the_spin_asked_is_fifteen_percent_of_the_aa_reference_median(lease: str) -> None:
    report = json.loads(gzip.decompress((KEPT / lease / "TAA.report.json.gz").read_bytes()))
    assert ttft_campaign.spin_ms(report) == float((KEPT / lease / "spin-ms.txt").read_text())


WAIT = ROOT / "docs" / "evidence" / "lab" / "2026-12-06-h100-ttft-wait"


def test_the_fourth_lease_s_ttft_lines_re_derive_and_the_wait_is_the_rule_s() -> None:
    text, out = re_derive("lab/2026-12-06-gpu-ttft-wait-advice.md", "ttft_campaign")
    quoted = [line for line in text.splitlines()
              if line.startswith(("- S69 ", "  - ttft: ", "  - candidate TTFT at", "  - reference TTFT at"))]
    assert len(quoted) == 8
    printed = out.splitlines()
    assert [line for line in quoted if line not in printed] == []
    report = json.loads(gzip.decompress((WAIT / "S69" / "TAA.report.json.gz").read_bytes()))
    assert ttft_campaign.spin_ms(report) == float((WAIT / "S69" / "wait-ms.txt").read_text())


def test_the_fourth_lease_s_advice_rows_re_derive() -> None:
    from specgate_lab.analyses.advice_check import _load, table

    text = (ROOT / "docs" / "journal" / "lab" / "2026-12-06-gpu-ttft-wait-advice.md").read_text()
    report = _load(WAIT / "S69" / "ADV.report.json.gz")
    for served in ("dhi", "dlo"):
        for row in table(report, served=served).splitlines()[2:]:
            cells = [c.strip() for c in row.strip("|").split("|")]
            # the journal's row: the drafter first, the fitted column (none on this rig) left out
            quoted = " | ".join([served, *cells[1:5], *cells[6:7], cells[7].removesuffix(" / -")])
            assert f"| {quoted} |" in text, quoted
