"""Issue 55, "the A/B report a reviewer reads": one verdict table for every gate (terminal and
summary.md alike, passing gates included), the forest plot with a row per gate, an A/B's throughput
plot with both sides, report.html (opened in a real browser by
tests/test_report_in_browser.py), and a saved report that re-renders the
same table, plot and page. On recorded reports: the GPU lab's A/B (docs/evidence), a passing cpu A/B
and a cpu A/B with its TTFT and acceptance gates (tests/data), a backfire duet run and a stored-history
replay."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from specgate.plugin.output import render_saved_report
from specgate.report.comparisons import gate_comparisons
from specgate.report.plots import forest_figure, throughput_figure
from specgate.report.run_report import step_summary
from specgate.report.terminal import render_all, render_markdown, render_text
from specgate.store.saved_report import read_saved_report

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[1]
GPU_AB = ROOT / "docs/evidence/lab/2026-12-01-h200-draft4l/ab/report.json.gz"
PASSING_AB = ROOT / "docs/evidence/calibration/cpu-2026-12-04-kept-reference/K2-report.json.gz"
AB_WITH_TTFT = ROOT / "tests/data/calibration/cpu-2026-12-04-acceptance/k3-48-auto-report.json.gz"
BACKFIRE = ROOT / "docs/evidence/lab/2026-12-01-h200-visit5/s4/report.json.gz"
STORED = ROOT / "docs/evidence/lab/2026-12-04-h200-history/replay-02.report.json.gz"


def _entries(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [*report["gates"], *report.get("undecided", [])]


def _verdict_lines(text: str) -> list[str]:
    """The verdict table's rows, as printed (after its title, header and rule); a cell wrapped onto
    the next lines (the terminal's table is at most 120 columns) joined to its row."""
    lines = text[text.index("verdicts, one row per gate"):].split("\n\n", 1)[0].splitlines()
    rows = lines[lines.index(next(line for line in lines if line.startswith(("---", "|---")))) + 1:]
    return [row for row in "\n".join(rows).replace("\n ", " ").splitlines()]


@pytest.mark.parametrize("path", [GPU_AB, PASSING_AB, AB_WITH_TTFT], ids=["gpu-ab", "passing-ab", "ab-ttft"])
def test_a_recorded_ab_prints_every_gates_ratio_and_interval(path: Path, capsys, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import specgate.report.terminal

    # what it prints (the plots and the page: tests/test_saved_reports.py and the tests below)
    monkeypatch.setattr(specgate.report.terminal, "render_all", lambda report, out_dir: {})
    copy = tmp_path / "report.json.gz"
    shutil.copyfile(path, copy)
    assert render_saved_report(copy) == 0
    printed = capsys.readouterr().out
    report = read_saved_report(path)
    rows = _verdict_lines(printed)
    assert len(rows) == len(_entries(report)) == len(gate_comparisons(report))
    for c, line in zip(gate_comparisons(report), rows, strict=True):
        assert c.ratio is not None and c.ci_low is not None and c.ci_high is not None, c
        assert c.against == "reference side"
        for cell in (c.mode, c.gate, c.ratio_text, c.threshold_text, c.n, c.outcome_text):
            assert cell in line, (cell, line)
        assert len(line) <= 120 or "\n" not in line
    for c, line in zip(gate_comparisons(report), _verdict_lines(render_markdown(report)), strict=True):
        if c.gate == "throughput":  # both sides' figures, in summary.md (the terminal's speed table has them)
            assert re.search(r"\d+\.\d tok/s +\| \d+\.\d tok/s", line), line


def test_a_passing_ab_shows_its_comparison() -> None:
    """The complaint: a passing A/B showed the candidate's tok/s and "pass" only."""
    text = render_text(read_saved_report(PASSING_AB))
    (row,) = _verdict_lines(text)
    assert re.search(r"eagle3\s+coding\s+1\s+throughput\s+reference side\s+"
                     r"1\.013 \(0\.942-1\.065\)\s+< 0\.90\s+12 pairs\s+PASS \(not slower\)", row), row
    (md_row,) = _verdict_lines(render_markdown(read_saved_report(PASSING_AB)))
    assert re.search(r"\| 31\.6 tok/s +\| 32\.8 tok/s +\|", md_row), md_row


def test_the_gpu_ab_of_an_older_report_reads_its_undecided_gate_from_the_message() -> None:
    """An undecided entry of before issue 36 has no details: its ratio, interval, threshold and
    pairs come from its message, and the summary says so."""
    report = read_saved_report(GPU_AB)
    throughput = next(c for c in gate_comparisons(report) if c.gate == "throughput")
    assert (throughput.ratio, throughput.ci_low, throughput.ci_high, throughput.threshold, throughput.n) == \
        (0.972, 0.932, 1.006, 0.97, "12 pairs")
    assert throughput.tag == "UNDECIDED" and throughput.reference == "333.8 tok/s"
    acceptance = next(c for c in gate_comparisons(report) if c.gate == "acceptance")
    # the failing check (position 2), its interval on the ratio's scale
    assert acceptance.metric == "pos. 2" and acceptance.ratio_text == "0.825 (0.791-0.855)" and acceptance.tag == "FAIL"
    assert "the details of 1 gate(s)" in render_text(report)


def test_terminal_and_summary_md_show_one_table() -> None:
    report = read_saved_report(AB_WITH_TTFT)
    terminal = [sorted(line.split()) for line in _verdict_lines(render_text(report))]
    markdown = render_markdown(report)
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in _verdict_lines(markdown)]
    # the terminal's table leaves both sides' figures to its speed table
    assert [sorted(" ".join(row[:5] + row[7:]).split()) for row in cells] == terminal
    assert "[report.html](report.html)" in markdown
    passing = [row for row in cells if row[-1].startswith("PASS")]
    assert passing and all(re.match(r"\d\.\d{3} \(\d\.\d{3}-\d\.\d{3}\)$", row[7]) for row in passing)


@pytest.mark.parametrize("path", [AB_WITH_TTFT, BACKFIRE, STORED], ids=["ab", "backfire", "stored"])
def test_the_forest_has_a_row_for_every_gate(path: Path) -> None:
    """forest.png is written for each kind of comparison where its report is rendered in full: an A/B
    (below, and tests/test_saved_reports.py's GPU A/B), backfire duets (tests/test_plots.py's recorded
    cpu runs) and stored figures (tests/test_saved_reports.py's history replay)."""
    report = read_saved_report(path)
    fig = forest_figure(report)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert len(labels) == len(_entries(report)) > 0
    assert labels == [c.label for c in gate_comparisons(report)]
    keys = sorted((e["mode"], e["prompt_class"], e["concurrency"], e["gate"]) for e in _entries(report))
    assert sorted((c.mode, c.prompt_class, c.concurrency, c.gate) for c in gate_comparisons(report)) == keys
    against = {c.against for c in gate_comparisons(report)}
    assert against & {"reference side", "no speculation", "stored level"}, against
    fig.clear()


def test_the_forest_holds_30_rows_unclipped() -> None:
    """30 rows (a cpu-smollm2 run): full labels, nothing past the figure's edges."""
    report = read_saved_report(ROOT / "docs/evidence/calibration/cpu-2026-12-01b/run-a-report.json.gz")
    fig = forest_figure(report)
    assert len(fig.axes[0].get_yticklabels()) == len(_entries(report)) == 30
    fig.canvas.draw()
    box = fig.bbox
    texts = [*fig.axes[0].get_yticklabels(), *fig.axes[1].get_yticklabels(), fig._suptitle]
    for text in texts:
        extent = text.get_window_extent()
        assert box.x0 - 1 <= extent.x0 and extent.x1 <= box.x1 + 1, text.get_text()
        assert box.y0 - 1 <= extent.y0 and extent.y1 <= box.y1 + 1, text.get_text()
    fig.clear()


def test_an_ab_throughput_plot_shows_both_sides_and_its_subtitle_fits() -> None:
    fig = throughput_figure(read_saved_report(AB_WITH_TTFT))
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["ngram @ reference side", "ngram @ candidate"]
    assert len(ax.patches) == 4  # two classes x two sides
    fig.canvas.draw()
    extent = fig._suptitle.get_window_extent()
    assert fig.bbox.x0 <= extent.x0 and extent.x1 <= fig.bbox.x1, "the subtitle is cut at the figure's edges"
    fig.clear()


def test_a_saved_report_renders_the_same_table_plot_and_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The live run's rendering (render_all on the session's report) and --specgate-report-only on the
    report.json it wrote give the same files, byte for byte."""
    import specgate.report.plots

    # the page embeds every plot; the forest is the one compared here (matplotlib is the slow part)
    monkeypatch.setattr(specgate.report.plots, "plot_acceptance", lambda report, path: None)
    report = read_saved_report(PASSING_AB)
    live = render_all(report, tmp_path / "live")
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "report.json").write_text(json.dumps(report, indent=1))
    assert render_saved_report(saved / "report.json") == 0
    assert set(live) == {"summary", "forest", "throughput", "html"}
    for name in ("summary.md", "forest.png", "throughput.png", "report.html"):
        assert (saved / "report-rendered" / name).read_bytes() == (tmp_path / "live" / name).read_bytes(), name


def test_the_job_summary_links_the_page() -> None:
    markdown = render_markdown(read_saved_report(PASSING_AB))
    assert step_summary(markdown, {}) == markdown
    linked = step_summary(markdown, {"GITHUB_SERVER_URL": "https://github.com", "GITHUB_REPOSITORY": "o/r",
                                     "GITHUB_RUN_ID": "42"})
    assert linked.startswith(markdown) and "https://github.com/o/r/actions/runs/42#artifacts" in linked


