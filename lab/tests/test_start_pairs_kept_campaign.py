"""The second 2026-12-06 lab entry (docs/journal/lab/2026-12-06-gpu-start-pairs-kept.md): every verdict
line it quotes is what its re-derive command prints from the kept raw data."""

from __future__ import annotations

import pytest
from journal_commands import re_derive

pytestmark = pytest.mark.fast


def test_every_verdict_line_the_entry_quotes_re_derives() -> None:
    text, out = re_derive("lab/2026-12-06-gpu-start-pairs-kept.md", "spread_campaign")
    quoted = [line for line in text.splitlines() if line.startswith(("- pair-", "- combined: ", "- K", "  - draft1l"))]
    assert len(quoted) == 10
    printed = out.splitlines()
    missing = [line for line in quoted if not any(p.startswith(line) for p in printed)]
    assert missing == []
    assert "FAIL 0.9522" in out and "PASS 0.9998" in out
