"""Issue 64 item 6's entry (docs/journal/lab/two-machine-history.md): every line it quotes from the two leases
is what its re-derive command prints from the kept raw data."""

from __future__ import annotations

import pytest
from journal_commands import re_derive

pytestmark = pytest.mark.fast


def test_every_line_the_entry_quotes_re_derives() -> None:
    text, out = re_derive("lab/two-machine-history.md", "two_machine")
    results = text.split("## Results", 1)[1].split("## Lease B again", 1)[0]
    quoted = [line.strip() for line in results.splitlines()
              if line.startswith(("    lease ", "      A's ", "      histories ", "        unknown ", "        GPU-",
                                  "      on B's", "      OM ", "        its plan"))]
    assert len(quoted) == 9
    printed = [line.strip() for line in out.splitlines()]
    assert [line for line in quoted if line not in printed] == []
    assert "two machines: True" in printed
    assert "finished: False" in out  # OM reached no verdict: said so in the entry, not counted


def test_lease_b_again_re_derives_and_counts_the_plain_runs() -> None:
    text, out = re_derive("lab/two-machine-history.md", "two_machine")
    section = text.split("## Lease B again", 1)[1]
    starts = ("    lease B again", "    a third", "      OM again", "        specgate:", "      histories ",
              "        unknown ", "        GPU-", "      B's ", "      | P", "      A/A ", "      injected ",
              "      P1:", "      P4:", "      P6:")
    quoted = [line.strip() for line in section.splitlines() if line.startswith(starts)]
    assert len(quoted) == 21
    printed = [line.strip() for line in out.splitlines()]
    assert [line for line in quoted if line not in printed] == []
    # the plan's draw: P1, P4 and P6 slowed 5 %, each FAILED; the A/As passed
    assert "injected sessions failed: 3/3" in out and "A/A sessions failed: 0/3" in out
    assert "a third machine: True" in printed and "A's history unchanged: True" in out
