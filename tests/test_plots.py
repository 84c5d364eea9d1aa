"""Tests for specgate.report.plots and report.render_all, on real reports: the cpu tier's two in
fixtures/recorded/cpu/reports (rig cpu-smollm2, no_spec and ngram, 6 classes x 6 requests) and the
GPU lab's in fixtures/recorded/gpu/reports (rig h200-smollm2, 4 modes x 2 classes, one run under xdist)."""

from __future__ import annotations

import copy
import gzip
import json
import re
from pathlib import Path
from typing import Any

import pytest
from old_reports import with_old_mode_name

from specgate.report.terminal import render_all, render_markdown, render_text, window_table

pytestmark = pytest.mark.fast

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "recorded"
REPORTS = RECORDED / "cpu" / "reports"
RENDERED = ["cpu/reports/run1-update.json.gz", "cpu/reports/run2-plain.json.gz", "gpu/reports/run1-update.json.gz",
            "gpu/reports/run2-plain.json.gz", "gpu/reports/run3-xdist.json.gz"]
# Time to first token of the recorded runs: ~0.1-1 s on 2 CPU cores, 20-80 ms on the H200.
TTFT_MS = {"cpu": (100, 2000), "gpu": (10, 500)}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _read(path: Path) -> dict[str, Any]:
    return json.loads(gzip.decompress(path.read_bytes()))


def _load(name: str) -> dict[str, Any]:
    return _read(REPORTS / f"{name}.gz")


# matplotlib costs about a second a report: every report's summary is checked, the plots of two of them,
# one per tier; the GPU one in its older form, which names the no-speculation mode "baseline".
DRAWN = ["cpu/reports/run2-plain.json.gz", "gpu/reports/run1-update.json.gz (old mode name)"]


@pytest.fixture(scope="module", params=RENDERED)
def summary(request: pytest.FixtureRequest) -> tuple[dict[str, Any], str]:
    report = _read(RECORDED / request.param)
    return report, render_markdown(report)


@pytest.fixture(scope="module", params=DRAWN)
def drawn(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    name, _, old = request.param.partition(" ")
    report = _read(RECORDED / name)
    if old:
        report = with_old_mode_name(report)
    out = tmp_path_factory.mktemp(name.replace("/", "-").removesuffix(".json.gz"))
    return report, out, render_all(report, out)


def _is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == PNG_MAGIC


def _tables(markdown: str) -> list[list[str]]:
    """The Markdown tables: runs of consecutive lines starting with '|'."""
    tables, current = [], []
    for line in [*markdown.splitlines(), ""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    return tables


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]


def test_render_all_writes_summary_plots_and_page(drawn) -> None:
    report, out, written = drawn
    assert written == {"summary": out / "summary.md", "forest": out / "forest.png",
                       "throughput": out / "throughput.png", "acceptance": out / "acceptance.png",
                       "html": out / "report.html"}
    assert written["summary"].read_text() == render_markdown(report)
    for name in ("forest", "throughput", "acceptance"):
        assert _is_png(written[name]), name
        assert written[name].stat().st_size > 20_000, name  # a drawn figure, not an empty canvas


def test_no_figure_is_left_open(drawn) -> None:
    from matplotlib._pylab_helpers import Gcf

    assert Gcf.get_num_fig_managers() == 0


def test_markdown_tables_are_rectangular(summary) -> None:
    tables = _tables(summary[1])
    assert len(tables) == 5  # verdicts, speed, acceptance, per window, break-even
    for table in tables:
        width = len(_cells(table[0]))
        assert all(len(_cells(line)) == width for line in table), table
        assert re.match(r"^\|[-:| ]+\|$", table[1])


def test_client_vs_server_table(summary) -> None:
    report, markdown = summary
    assert "client vs server decode tok/s" in markdown
    table = next(t for t in _tables(markdown) if "server tok/s" in t[0])
    header = _cells(table[0])
    assert header == ["mode", "class", "conc.", "requests", "TTFT median ms", "aggregate tok/s",
                      "client tok/s", "server tok/s", "diff %"]
    rows = [dict(zip(header, _cells(line), strict=True)) for line in table[2:]]
    assert len(rows) == len(report["measurements"]) == {"cpu": 12, "gpu": 8}[report["rig"]["tier"]]
    low, high = TTFT_MS[report["rig"]["tier"]]
    for row, m in zip(rows, report["measurements"], strict=True):
        assert (row["mode"], row["class"]) == (m["mode"], m["prompt_class"])
        assert row["requests"] == str(len(m["records"]))  # no follow-up rounds in these recordings
        assert row["server tok/s"] == f"{m['server_decode_tokens_per_s']:.1f}"
        # The recorded runs agree to within 2 % (client 1 / mean TPOT vs vLLM's histogram).
        assert abs(float(row["diff %"].removesuffix(" %"))) < 2.0, row
        assert low < float(row["TTFT median ms"]) < high, row
    assert "client tok/s" not in render_text(report)  # the terminal leaves the per-window table to summary.md


def test_client_vs_server_figures() -> None:
    def record(tpot: float, ttft: float) -> dict[str, Any]:
        return {"tpot_s": tpot, "decode_tokens_per_s": 1 / tpot, "ttft_s": ttft}

    report = {"measurements": [
        {"mode": "ngram", "prompt_class": "coding", "concurrency": 1, "server_decode_tokens_per_s": 40.0,
         "server_metric_source": "vllm:request_time_per_output_token_seconds",
         "records": [record(0.01, 0.2), record(0.03, 0.3), record(0.02, 0.5)]},
        {"mode": "no_spec", "prompt_class": "coding", "concurrency": 1, "server_decode_tokens_per_s": None,
         "records": [record(0.02, 0.1)]}]}
    report["measurements"][0]["follow_up"] = "the backfire gate is undecided after 2 pairs"
    table = window_table(report)
    # client: 1 / mean(0.01, 0.03, 0.02) = 50 tok/s (not the mean of 100, 33.3, 50); +25 % vs 40.
    assert re.search(r"ngram\s+coding\s+1\s+3 \(follow-up\)\s+300\s+\S+\s+50\.0\s+40\.0\s+\+25\.00 %", table), table
    assert re.search(r"no_spec\s+coding\s+1\s+1\s+100\s+\S+\s+50\.0\s+-\s+-", table), table
    assert "request_time_per_output_token_seconds histogram" in table


def test_no_server_figures_gives_ttft_only() -> None:
    report = _load("run2-plain.json")
    for m in report["measurements"]:
        m["server_decode_tokens_per_s"] = m["server_metric_source"] = None
    table = window_table(report)
    assert "server tok/s" not in table and "TTFT median ms" in table


def test_no_speculative_mode_no_acceptance_plot(tmp_path: Path) -> None:
    report = _load("run2-plain.json")
    report["measurements"] = [m for m in report["measurements"] if m["mode"] == "no_spec"]
    report["gates"] = [g for g in report["gates"] if g["mode"] == "no_spec"]
    (tmp_path / "acceptance.png").write_bytes(PNG_MAGIC)  # stale, from an earlier render
    written = render_all(report, tmp_path)
    assert set(written) == {"summary", "forest", "throughput", "html"}
    assert _is_png(written["throughput"])
    assert not (tmp_path / "acceptance.png").exists()
    assert "acceptance (" not in written["summary"].read_text()


def test_nothing_measured_draws_nothing(tmp_path: Path) -> None:
    from specgate.report.plots import plot_acceptance, plot_forest, plot_throughput

    report = _load("run2-plain.json")
    report["measurements"], report["gates"] = [], []
    assert plot_throughput(report, tmp_path / "t.png") is None
    assert plot_acceptance(report, tmp_path / "a.png") is None
    assert plot_forest(report, tmp_path / "f.png") is None
    assert list(tmp_path.iterdir()) == []
    assert set(render_all(report, tmp_path / "out")) == {"summary", "html"}


def test_two_levels_and_a_failed_gate_with_a_pipe(tmp_path: Path) -> None:
    report = _load("run1-update.json")
    second = copy.deepcopy(report["measurements"])
    for m in second:
        m["concurrency"] = 4
    report["measurements"] += second
    report["gates"].append({"gate": "back|fire", "mode": "ngram", "prompt_class": "coding",
                            "concurrency": 4, "passed": False, "verdict": "FAIL",
                            "message": "ngram is 9 % slower", "declared": None})
    from specgate.report.plots import plot_throughput

    assert _is_png(plot_throughput(report, tmp_path / "throughput.png"))
    markdown = render_markdown(report)
    assert "FAIL back\\|fire" in markdown  # escaped: GitHub keeps it in one cell
    for table in _tables(markdown):
        assert len({len(_cells(line)) for line in table}) == 1, table
    assert "concurrency 4" in markdown


@pytest.mark.parametrize("name", RENDERED)
def test_a_report_from_before_the_rename_renders_the_same(name: str) -> None:
    """report.json files that name the no-speculation mode "baseline" (written before it became
    no_spec) render as they did: the same summary with the old name, and every plot."""
    report = _read(RECORDED / name)
    old = with_old_mode_name(report)
    assert "baseline" in json.dumps(old["rig"]) and "no_spec" not in json.dumps(old)

    def words(text: str) -> str:  # column widths (and rules) follow the names' lengths
        return " ".join(re.sub(r"-{3,}", "---", text.replace("no_spec", "baseline")).split())

    assert words(render_text(old)) == words(render_text(report))
    assert words(render_markdown(old)) == words(render_markdown(report))  # the plots: DRAWN above
