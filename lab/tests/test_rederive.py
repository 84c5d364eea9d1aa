"""A re-derive command the docs print, run on the evidence kept in docs/evidence/: the figures it
prints must be the ones the docs state (the docs' numbers are parsed, not copied here)."""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[2]
JOURNAL = ROOT / "docs" / "journal" / "calibration" / "cpu-2026-12-03c.md"
README = ROOT / "README.md"


def _arguments(command: str, out: Path) -> list[str]:
    """A doc's ``python -m specgate_lab calibrate --render ...``: its arguments, globs expanded as a
    shell would from the repository root, with --out in ``out``."""
    words = shlex.split(command)
    assert words[:5] == ["python", "-m", "specgate_lab", "calibrate", "--render"], command
    words[words.index("--out") + 1] = str(out)
    args = []
    for word in words[3:]:
        matches = sorted(glob.glob(word, root_dir=ROOT)) if glob.has_magic(word) else [word]
        assert matches, f"{word} matches nothing under {ROOT}"
        args += matches
    return args


def _folders(args: list[str]) -> set[str]:
    return set(args[args.index("--render") + 1:args.index("--out")])


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[str], dict[str, dict]]:
    """The journal's text, its re-derive command's arguments, and the rows that command renders
    (the duet's, by injected slowdown; the sequential rows are a stand-in)."""
    text = JOURNAL.read_text()
    out = tmp_path_factory.mktemp("render")
    args = _arguments(re.search(r"```\n(python -m specgate_lab calibrate --render [^\n]+)\n```", text).group(1), out)
    subprocess.run([sys.executable, "-m", "specgate_lab", *args], cwd=ROOT, check=True, capture_output=True,
                   env={**os.environ, "MPLBACKEND": "Agg"})
    rows = json.loads((out / "summary.json").read_text())["rows"]
    return text, args, {row["injected slowdown"]: row for row in rows if row["design"] == "duet"}


def _close(stated: str, computed: float) -> bool:
    """``computed`` rounds to the doc's ``stated`` figure at the doc's precision."""
    decimals = len(stated.partition(".")[2])
    return abs(float(stated) - computed) <= 0.5 * 10 ** -decimals + 1e-12


def _percent(cell: str) -> tuple[float, float]:
    """``"99.2 % (>= 97.54 %)"`` -> (99.2, 97.54)."""
    estimate, bound = re.fullmatch(r"([\d.]+) % \((?:<=|>=) ([\d.]+) %\)", cell).groups()
    return float(estimate), float(bound)


def test_the_journals_pooled_calibration_figures_re_derive(journal) -> None:
    text, _, rows = journal

    caught, n, low, high, model, bound = re.search(
        r"10 % pooled [^:]*: (\d+)/(\d+) \((\d+)-(\d+) %\), model ([\d.]+) % \(exact bound >= ([\d.]+) %\)",
        text).groups()
    assert rows["10 %"]["fail @ tol 3 %"] == f"{caught}/{n} ({low}-{high} %)"
    computed = _percent(rows["10 %"]["normal model @ 3 %"])
    assert _close(model, computed[0]) and _close(bound, computed[1]), (model, bound, computed)

    alarms, windows, model, bound = re.search(
        r"A/A unchanged: (\d+)/(\d+), model ([\d.]+) % \(<= ([\d.]+) %\)", text).groups()
    assert rows["0 %"]["fail @ tol 3 %"].startswith(f"{alarms}/{windows} ")
    computed = _percent(rows["0 %"]["normal model @ 3 %"])
    assert _close(model, computed[0]) and _close(bound, computed[1]), (model, bound, computed)


def test_the_readmes_calibration_example_re_derives(journal, tmp_path: Path) -> None:
    """The README's example renders the journal's folders (its glob matches them all), so the
    journal's render holds its figures too."""
    _, journal_args, rows = journal
    text = " ".join(README.read_text().split())
    alarms, windows, caught, n = map(int, re.search(
        r"raised (\d+) false alarms in (\d+) A/A windows and caught an injected 10 % slowdown in (\d+) of (\d+)",
        text).groups())
    command = re.search(r"`(python -m specgate_lab calibrate --render [^`]+)`", text).group(1)
    assert _folders(_arguments(command, tmp_path)) == _folders(journal_args)
    assert rows["0 %"]["windows"] == windows and rows["0 %"]["fail @ tol 3 %"].startswith(f"{alarms}/{windows} ")
    assert rows["10 %"]["windows"] == n and rows["10 %"]["fail @ tol 3 %"].startswith(f"{caught}/{n} ")
