"""The README's example summary is a real run's, rendered again from the report kept in
docs/evidence/ (the README's rows are parsed, not copied here)."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from specgate.report.terminal import acceptance_table, breakeven_table, speed_table

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent


def _rows(text: str) -> set[str]:
    """Table rows with their cells' padding removed: ``| a | b |``."""
    return {"| " + " | ".join(cell.strip() for cell in line.strip().strip("|").split("|")) + " |"
            for line in text.splitlines() if line.strip().startswith("|") and not set(line) <= set("|-: ")}


def test_the_readmes_example_summary_is_the_kept_reports() -> None:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("It ends with the summary lines")
    excerpt = readme[start:readme.index("\n\n", readme.index("it reached", start))]
    kept = re.search(r"`(docs/evidence/calibration/[\w./-]+report\.json\.gz)`", excerpt).group(1)
    report = json.loads(gzip.decompress((ROOT / kept).read_bytes()))
    rendered = _rows(speed_table(report, "github")) | _rows(acceptance_table(report, "github"))
    shown = _rows(excerpt)
    assert len(shown) >= 4 and shown <= rendered, sorted(shown - rendered)
    for line in re.findall(r"^ {4}(\w+'s step costs .*)$", excerpt, re.M):
        assert line in breakeven_table(report, "github"), line
