"""A lab journal entry's re-derive command, run as the entry prints it (an indented
``python -m specgate_lab.analyses.NAME ...``, on one line or continued with backslashes)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def re_derive(entry: str, analysis: str) -> tuple[str, str]:
    """The text of the journal entry ``entry`` (under docs/journal) and what its re-derive command for
    ``specgate_lab.analyses.<analysis>`` prints, run from the repository root on the kept raw data."""
    journal = ROOT / "docs" / "journal" / entry
    text = journal.read_text()
    command = re.search(rf"\n    (python -m specgate_lab\.analyses\.{analysis}(?:[^\n]*\\\n)*[^\n]*)\n", text)
    assert command, f"{journal} prints no re-derive command for specgate_lab.analyses.{analysis}"
    words = shlex.split(command.group(1).replace("\\\n", " "))
    out = subprocess.run([sys.executable, *words[1:]], cwd=ROOT, check=True, capture_output=True, text=True).stdout
    return text, out
