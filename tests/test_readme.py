"""The README is short and its example outputs are today's: each is rendered again from the real code
(``python -m specgate plan`` through specgate.cli.main; the kept report through specgate.report.terminal) and
its lines must be in that rendering. Any other code block holds commands only, so an example that
cannot be rendered again has no place there."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from specgate.cli import main
from specgate.report.terminal import render_markdown, render_text
from specgate.store.saved_report import read_saved_report

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_LINES = 200
COMMANDS = ("pip ", "tox ", "pytest ", "python ")
ELIDED = "..."  # a line of an example that stands for lines left out


def _text() -> str:
    return README.read_text()


def _row(line: str) -> str:
    """A Markdown table row with its cells' padding removed."""
    return "| " + " | ".join(cell.strip() for cell in line.strip().strip("|").split("|")) + " |"


def _is_rule(line: str) -> bool:
    return set(line.strip()) <= set("|-: ")


def _fenced(text: str) -> list[tuple[str, list[str]]]:
    return [(m.group(1), m.group(2).splitlines()) for m in re.finditer(r"^```(\w*)\n(.*?)^```$", text, re.M | re.S)]


def _indented(text: str) -> list[list[str]]:
    """The README's indented code blocks (four spaces after a blank line), fenced blocks left out."""
    text = re.sub(r"^```.*?^```$", "", text, flags=re.M | re.S)
    return [[line[4:] for line in m.group(0).splitlines()] for m in re.finditer(r"(?:^ {4}\S.*\n?)+", text, re.M)]


def _tables(text: str) -> list[tuple[str, list[str]]]:
    """Every Markdown table: (the line just above it, its lines)."""
    lines, found, i = text.splitlines(), [], 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and _is_rule(lines[i + 1]):
            j = i
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            found.append((lines[i - 1] if i else "", lines[i:j]))
            i = j
        else:
            i += 1
    return found


@pytest.fixture(scope="module")
def kept_report() -> tuple[str, str]:
    """The README's kept report rendered again: (the terminal summary, summary.md)."""
    path = re.search(r"`(docs/evidence/[\w./-]+\.json\.gz)`", _text()).group(1)
    report = read_saved_report(ROOT / path)
    return render_text(report), render_markdown(report)


def test_the_readme_reads_in_five_minutes() -> None:
    lines = _text().count("\n")
    assert lines <= MAX_LINES, f"README.md has {lines} lines, over {MAX_LINES}: move detail into docs/"


def test_every_plan_shown_is_what_plan_prints_today(capsys: pytest.CaptureFixture[str]) -> None:
    shown = [lines for kind, lines in _fenced(_text()) if kind == "text"]
    assert shown, "the README shows no plan"
    for lines in shown:
        command = lines[0].removeprefix("$ ")
        words = shlex.split(command)
        assert lines[0].startswith("$ ") and words[:3] == ["python", "-m", "specgate"], (
            f"an example's first line is the `$ python -m specgate ...` command that prints it: {lines[0]!r}")
        assert main(words[3:]) == 0, command
        printed = {line.rstrip() for line in capsys.readouterr().out.splitlines()}
        stale = [line for line in lines[1:] if line.strip() != ELIDED and line.rstrip() not in printed]
        assert not stale, f"`{command}` no longer prints:\n" + "\n".join(stale)


def test_every_table_of_a_report_is_what_the_kept_report_renders(kept_report: tuple[str, str]) -> None:
    """A README table with a header summary.md has is summary.md's: its rows, and the title above it
    that says what its columns mean (so "+20 %" under "(change)" reads as the ratio it is)."""
    markdown = kept_report[1].splitlines()
    headers = {_row(line): markdown[i - 1] for i, line in enumerate(markdown)
               if line.startswith("|") and i + 1 < len(markdown) and _is_rule(markdown[i + 1])}
    rows = {_row(line) for line in markdown if line.startswith("|") and not _is_rule(line)}
    shown = [(title, lines) for title, lines in _tables(_text()) if _row(lines[0]) in headers]
    assert any("| change |" in lines[0] for _, lines in shown), "the README shows no speed table"
    for title, lines in shown:
        assert title == headers[_row(lines[0])], f"{lines[0]}: the title above it is not {headers[_row(lines[0])]!r}"
        stale = [line for line in lines if not _is_rule(line) and _row(line) not in rows]
        assert not stale, "rows the kept report no longer renders:\n" + "\n".join(stale)


def test_every_other_block_is_commands_or_the_kept_reports_lines(kept_report: tuple[str, str]) -> None:
    assert {kind for kind, _ in _fenced(_text())} <= {"text"}, "a fenced block other than a plan example"
    rendered = "\n".join(kept_report)
    for block in _indented(_text()):
        if all(line.startswith(COMMANDS) for line in block):
            continue
        stale = [line for line in block if line.strip() not in rendered]
        assert not stale, "neither commands nor lines of the kept report:\n" + "\n".join(stale)
