"""Issue 64 item 6's entry (docs/journal/lab/two-machine-history.md): every line it quotes from the two leases
is what its re-derive command prints from the kept raw data."""

from __future__ import annotations

import pytest
from journal_commands import re_derive

pytestmark = pytest.mark.fast


def test_every_line_the_entry_quotes_re_derives() -> None:
    text, out = re_derive("lab/two-machine-history.md", "two_machine")
    quoted = [line.strip() for line in text.split("## Results", 1)[1].splitlines()
              if line.startswith(("    lease ", "      A's ", "      histories ", "        unknown ", "        GPU-",
                                  "      on B's", "      OM ", "        its plan"))]
    assert len(quoted) == 9
    printed = [line.strip() for line in out.splitlines()]
    assert [line for line in quoted if line not in printed] == []
    assert "two machines: True" in printed
    assert "finished: False" in out  # OM reached no verdict: said so in the entry, not counted
