"""``--specgate-report-only`` on every report the project keeps (issue 53): docs/evidence holds them
gzip-compressed and trimmed (records with decode tok/s only), many written by older versions of
specgate. Each renders (the terminal summary and summary.md for all; the plots and the page for a
few, matplotlib being the slow part) into a folder of its own or --specgate-run-dir, says what it
lacks, and an unreadable file exits 4 naming why."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import tomllib
from pathlib import Path

import pytest

from specgate.errors import SpecgateError
from specgate.plugin.output import render_saved_report, rendered_dir
from specgate.report.comparisons import gate_comparisons
from specgate.report.terminal import render_markdown, render_text
from specgate.store.saved_report import missing_parts, read_saved_report

pytestmark = pytest.mark.fast

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
EVIDENCE = sorted(ROOT.glob("docs/evidence/**/*report*.json*"))
# Rendered in full (plots and page): a GPU A/B (through pytest, the command the docs give) and a
# stored-history replay; tests/test_ab_report.py and tests/test_plots.py draw more.
IN_FULL = ["docs/evidence/lab/2026-12-01-h200-draft4l/ab/report.json.gz",
           "docs/evidence/lab/2026-12-04-h200-history/replay-02.report.json.gz"]


# The terminal's widths (issue 61): a line a person reads in one breath, a table a terminal shows whole.
LINE_WIDTH, TABLE_WIDTH = 160, 120
RECORDED = sorted(ROOT.glob("fixtures/recorded/**/reports/*.json*"))
RULE = re.compile(r"^-+(  -+)*$")


def too_wide(text: str) -> list[str]:
    """The lines of a terminal summary that do not fit. A table is tabulate's: a header line, the rule
    under it (dashes, two spaces between columns) and every line down to the next blank one; each of
    those is at most TABLE_WIDTH columns. Every other line (a gate's FAILED or UNDECIDED line, a table's
    legend, a notice) is at most LINE_WIDTH characters."""
    lines = text.splitlines()
    in_table = set()
    for i, line in enumerate(lines):
        if i and RULE.match(line):
            end = next((j for j in range(i, len(lines)) if not lines[j].strip()), len(lines))
            in_table.update(range(i - 1, end))
    return [line for i, line in enumerate(lines) if len(line) > (TABLE_WIDTH if i in in_table else LINE_WIDTH)]


def test_the_evidence_is_there() -> None:
    assert len(EVIDENCE) >= 90, EVIDENCE  # 98 when this was written
    assert all(ROOT / name in EVIDENCE for name in IN_FULL)


@pytest.mark.parametrize("path", EVIDENCE, ids=[str(p.relative_to(ROOT / "docs/evidence")) for p in EVIDENCE])
def test_every_kept_report_renders(path: Path) -> None:
    report = read_saved_report(path)
    text = render_text(report)
    assert not too_wide(text)
    markdown = render_markdown(report)
    entries = [*report["gates"], *report.get("undecided", [])]
    assert len(gate_comparisons(report)) == len(entries)
    if entries:
        assert text.count("\n", text.index("verdicts, one row per gate")) >= len(entries)
    trimmed = any("started_at" not in r for m in report["measurements"] for r in m["records"])
    if trimmed:  # the kept evidence is trimmed: the summary says what it could not show
        assert "NOT IN THIS REPORT" in text and "request timestamps" in markdown
        assert any("request timestamps" in part for part in missing_parts(report))


def test_a_level_gate_counts_its_stored_starts_not_pairs() -> None:
    """A plain run against a history of 3 starts (the lab's second H100, issue 64 item 6) rests on 3
    stored starts, not on 3 pairs (the kept run's own terminal said "3 pairs" before this was mended)."""
    report = read_saved_report(ROOT / "docs/evidence/lab/two-machine-history/HB2/P1.report.json.gz")
    (row,) = gate_comparisons(report)
    assert row.n == "3 stored starts, one sitting"
    assert "[3 stored starts, one sitting]" in render_text(report)


@pytest.mark.parametrize("path", RECORDED, ids=[str(p.relative_to(ROOT / "fixtures/recorded")) for p in RECORDED])
def test_the_recorded_runs_fit_the_terminal(path: Path) -> None:
    assert not too_wide(render_text(read_saved_report(path)))


def _quick_runs() -> list[tuple[str, dict]]:
    """The quick rig's kept runs (its A/Bs), and the cpu tier's kept plain run cut to the quick rig's
    classes (the main job on a fresh machine: stored figures of another machine)."""
    classes = set(tomllib.loads((ROOT / "fixtures/rigs/cpu-smollm2-quick.toml").read_text())["classes"])
    runs = [(p.name, read_saved_report(p)) for p in sorted(ROOT.glob("tests/data/calibration/*/*report.json.gz"))]
    plain = read_saved_report(ROOT / "docs/evidence/calibration/cpu-2026-12-03/run-x-report.json.gz")
    for key in ("measurements", "gates", "undecided"):
        plain[key] = [e for e in plain[key] if e["prompt_class"] in classes]
    return [(name, r) for name, r in runs if r["rig"]["name"] == "cpu-smollm2-quick"] + [("run-x, quick", plain)]


def test_the_quick_rigs_summary_fits_in_50_lines() -> None:
    runs = _quick_runs()
    assert len(runs) >= 4
    for name, report in runs:
        text = render_text(report)
        assert len(text.splitlines()) <= 50 and not too_wide(text), (name, text)


def test_a_line_too_wide_is_found() -> None:
    table = "mode  class\n----  -----\n" + "x" * 121 + "\n\n"
    assert too_wide(table + "y" * 160) == ["x" * 121]
    assert too_wide("z" * 161 + "\n" + "x" * 121) == ["z" * 161]


def test_report_only_renders_a_kept_report_in_full(tmp_path: Path, capsys) -> None:
    copy = tmp_path / Path(IN_FULL[1]).name  # replay-02.report.json.gz
    shutil.copyfile(ROOT / IN_FULL[1], copy)
    assert render_saved_report(copy) == 0
    out = capsys.readouterr().out
    assert out.startswith("specgate: rig ")
    rendered = tmp_path / "replay-02.report-rendered"
    assert rendered_dir(copy) == rendered
    assert (rendered / "summary.md").is_file() and (rendered / "throughput.png").is_file()
    assert (rendered / "report.html").is_file() and (rendered / "forest.png").is_file()
    assert {p.name for p in tmp_path.iterdir()} == {copy.name, rendered.name}


def test_report_only_through_pytest_reads_gzip(pytester: pytest.Pytester) -> None:
    """The command the docs give, on a compressed report: exit 0 (it was a UnicodeDecodeError, exit 1)."""
    copy = pytester.path / "report.json.gz"
    shutil.copyfile(ROOT / IN_FULL[0], copy)
    result = pytester.runpytest("-p", "no:cacheprovider", f"--specgate-report-only={copy}")
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    rendered = pytester.path / "report-rendered"
    result.stdout.fnmatch_lines(["verdicts, one row per gate*", "*draft_al30*throughput*0.972 (0.932-1.006)*",
                                 f"html: {rendered / 'report.html'}"])
    for name in ("summary.md", "forest.png", "throughput.png", "acceptance.png", "report.html"):
        assert (rendered / name).is_file(), name


def test_reports_of_one_folder_render_into_folders_of_their_own(tmp_path: Path, no_plots, capsys) -> None:
    """An evidence folder holds up to 18 reports: each renders into its own folder, none over another's."""
    names = {"ab.report.json.gz": IN_FULL[0], "replay-02.report.json.gz": IN_FULL[1]}
    for name, kept in names.items():
        shutil.copyfile(ROOT / kept, tmp_path / name)
        assert render_saved_report(tmp_path / name) == 0
    for name, kept in names.items():
        rendered = tmp_path / name.replace(".json.gz", "-rendered")
        assert (rendered / "summary.md").read_text() == render_markdown(read_saved_report(ROOT / kept))
        assert (rendered / "report.html").is_file()
    assert not (tmp_path / "summary.md").exists() and not (tmp_path / "report.html").exists()


def test_report_only_writes_into_the_run_dir(pytester: pytest.Pytester, no_plots) -> None:
    copy = pytester.path / "report.json.gz"
    shutil.copyfile(ROOT / IN_FULL[1], copy)
    out = pytester.path / "out"
    result = pytester.runpytest("-p", "no:cacheprovider", f"--specgate-report-only={copy}", f"--specgate-run-dir={out}")
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    assert (out / "summary.md").is_file() and (out / "report.html").is_file()
    assert {p.name for p in pytester.path.iterdir()} == {"out", copy.name}


def _gz(path: Path, data: object) -> Path:
    path.write_bytes(gzip.compress(json.dumps(data).encode()))
    return path


@pytest.mark.parametrize(("content", "says"), [
    (b"\x1f\x8b\x08\x00truncated", "cannot read the report"),
    (b"\xff\xfe not utf-8", "cannot read the report: UnicodeDecodeError"),
    (b"{not json", "cannot read the report: JSONDecodeError"),
    (b'{"gates": []}', "not a specgate report"),
    (b'{"specgate_report": 1, "rig": {"name": "r"}, "gates": []}', "without measurements, rig.reference_mode"),
])
def test_an_unreadable_report_exits_4_naming_why(content: bytes, says: str, tmp_path: Path, capsys) -> None:
    path = tmp_path / "report.json"
    path.write_bytes(content)
    with pytest.raises(SpecgateError, match=r"cannot|not a|without"):
        read_saved_report(path)
    assert render_saved_report(path) == 4
    err = capsys.readouterr().err
    assert says in err and str(path) in err


def test_compressed_is_told_by_its_bytes_not_its_name(tmp_path: Path) -> None:
    report = read_saved_report(ROOT / IN_FULL[0])
    assert read_saved_report(_gz(tmp_path / "report.json", report)) == report
    plain = tmp_path / "plain.json.gz"
    plain.write_text(json.dumps(report))
    assert read_saved_report(plain) == report


def test_a_live_report_lacks_nothing() -> None:
    """A report of today's specgate (an A/B with its start order and fingerprints) says nothing is missing."""
    report = read_saved_report(ROOT / "tests/data/calibration/cpu-2026-12-04-acceptance/k3-48-auto-report.json.gz")
    assert missing_parts(report) == []
    assert "NOT IN THIS REPORT" not in render_text(report)
