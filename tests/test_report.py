"""Tests for specgate.report.terminal: a run's JSON report (built the way the session builds it) rendered
as terminal text and as GitHub Markdown."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specgate.decide.outcome import NOT_STORED, STORING, Outcome
from specgate.decide.verdict import GateResult
from specgate.errors import RequestError
from specgate.measure.client import RequestRecord
from specgate.measure.metrics import AcceptanceStats
from specgate.measure.protocol import ClassMeasurement
from specgate.plugin.output import progress_writer, render_saved_report
from specgate.plugin.resolve import SessionOptions
from specgate.plugin.session import SpecgateSession
from specgate.report.safe_text import markdown_without_html
from specgate.report.terminal import render_markdown, render_text, speed_table
from specgate.store.saved_report import load_report

pytestmark = pytest.mark.fast

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TOKENS = 64


def _record(mode: str, prompt_class: str, prompt_id: str, tps: float) -> RequestRecord:
    first = 0.25
    last = first + (TOKENS - 1) / tps
    return RequestRecord(
        request_id=f"{mode}/{prompt_class}/{prompt_id}#0", mode=mode, prompt_class=prompt_class,
        prompt_id=prompt_id, concurrency=1, started_at=0.0, first_token_at=first, last_token_at=last,
        finished_at=last + 0.01, chunk_times=[first, last], prompt_tokens=40, completion_tokens=TOKENS,
        text=f"output of {prompt_id}", finish_reason="length")


def _measurement(mode: str, prompt_class: str, tps: list[float],
                 acceptance: AcceptanceStats | None = None) -> ClassMeasurement:
    records = [_record(mode, prompt_class, f"p{i}", value) for i, value in enumerate(tps)]
    return ClassMeasurement(rig="cpu-smollm2", mode=mode, prompt_class=prompt_class, concurrency=1,
                            records=records, acceptance=acceptance, server_decode_tokens_per_s=None,
                            server_metric_source=None, wall_s=3.0)


CODING_ACC = AcceptanceStats(drafts=100, draft_tokens=500, accepted_tokens=150,
                             accepted_per_position=(60, 40, 25, 15, 10))
MATH_ACC = AcceptanceStats(drafts=200, draft_tokens=1000, accepted_tokens=500,
                           accepted_per_position=(150, 120, 100, 80, 50))

BACKFIRE_MESSAGE = ("backfire: ngram is 26 % slower than no speculation on coding (ratio 0.740, 95 % CI "
                    "0.70-0.78)\nsecond line with the samples")


def _session(tmp_path: Path) -> SpecgateSession:
    options = SessionOptions(rig_name="cpu-smollm2", fixtures_dir=FIXTURES,
                             baselines_path=tmp_path / "b.json", run_dir=tmp_path / "run", repo_root=tmp_path)
    session = SpecgateSession(options)
    for m in (_measurement("no_spec", "coding", [100.0, 98.0, 102.0]),
              _measurement("ngram", "coding", [74.0, 73.0, 75.0], CODING_ACC),
              _measurement("no_spec", "math", [50.0, 52.0, 54.0]),
              _measurement("ngram", "math", [65.0, 64.0, 66.0], MATH_ACC)):
        session.measurements[(m.mode, m.prompt_class, m.concurrency)] = m
    session.record(GateResult("throughput", "no_spec", "coding", 1, Outcome.PASS, "throughput: within 5 %"))
    session.record(GateResult("backfire", "ngram", "coding", 1, Outcome.FAIL, BACKFIRE_MESSAGE))
    session.record(GateResult("lossless", "ngram", "coding", 1, Outcome.PASS, "lossless: 3/3 identical"))
    session.record(GateResult("backfire", "ngram", "math", 1, Outcome.PASS, "backfire: ngram is 25 % faster"))
    session.record(GateResult("acceptance", "ngram", "math", 1, Outcome.PASS, "acceptance: within 5 %"))
    return session


@pytest.fixture
def report(tmp_path: Path) -> dict[str, Any]:
    return _session(tmp_path).report_data(complete=True)


def _row(text: str, prompt_class: str, mode: str) -> str:
    """The speed table's row of ``mode`` on ``prompt_class`` (terminal or Markdown)."""
    rows = [line for line in text.splitlines() if re.match(rf"^\|?\s*{prompt_class}\s+\|?\s*{mode}\s", line)]
    assert len(rows) == 1, text
    return rows[0]


def test_report_has_the_session_shape(report: dict[str, Any]) -> None:
    assert report["specgate_report"] == 1
    assert report["rig"]["reference_mode"] == "no_spec"
    assert list(report["rig"]["modes"]) == ["no_spec", "ngram"]
    assert len(report["measurements"]) == 4 and len(report["gates"]) == 5
    ngram = next(m for m in report["measurements"] if m["mode"] == "ngram" and m["prompt_class"] == "coding")
    assert [r["decode_tokens_per_s"] for r in ngram["records"]] == pytest.approx([74.0, 73.0, 75.0])
    assert ngram["acceptance"]["mean_acceptance_length"] == pytest.approx(2.5)
    json.dumps(report)  # JSON-safe as it is


def test_render_text(report: dict[str, Any]) -> None:
    text = render_text(report)
    assert text.startswith("specgate: rig cpu-smollm2 (cpu tier, model ")
    assert "PARTIAL" not in text
    assert "decode tok/s, median per request, concurrency 1" in text
    assert re.search(r"coding\s+no_spec\s+100\.0\s+-\s+pass", text)
    assert re.search(r"74\.0\s+-26 %\s+FAIL backfire$", _row(text, "coding", "ngram"))
    assert "52.0" in _row(text, "math", "no_spec")
    assert re.search(r"65\.0\s+\+25 %\s+pass$", _row(text, "math", "ngram"))
    # Acceptance rows: mode, class, level, mean length, rate, per-position rates in %.
    assert "acceptance (from vLLM's spec-decode counters" in text
    assert re.search(r"ngram\s+coding\s+1\s+2\.50\s+30\.0 %\s+60 40 25 15 10", text), text
    assert re.search(r"ngram\s+math\s+1\s+3\.50\s+50\.0 %\s+75 60 50 40 25", text), text
    # The failed gate: one short line (the ratio and interval of its message), the message in summary.md.
    failed = [line for line in text.splitlines() if line.startswith("FAILED")]
    assert failed == ["FAILED ngram coding c1 backfire: 0.740x of no speculation (0.700-0.780)"]
    assert "second line with the samples" not in text


def test_render_markdown(report: dict[str, Any]) -> None:
    markdown = render_markdown(report)
    assert markdown.startswith("## specgate: rig `cpu-smollm2`\n")
    assert markdown.endswith("\n")
    table = [line for line in markdown.splitlines() if line.startswith("|")]
    assert len(table) >= 2 + 2 + 2 + 2  # speed: header, rule, 2 rows; acceptance: header, rule, 2 rows
    assert re.match(r"^\|[-:| ]+\|$", table[1])  # the header rule of a GitHub table
    assert re.search(r"\| 74\.0 +\| -26 % +\|", _row(markdown, "coding", "ngram"))
    assert "- FAILED backfire [ngram-coding-c1]: backfire: ngram is 26 % slower" in markdown
    assert "All gates passed." not in markdown


# names a downloaded report may hold: raw HTML, and an ANSI escape that would turn a terminal red
HOSTILE = {"ngram": "<script>alert(1)</script>", "coding": "<img src=x onerror=alert(1)>",
           "cpu-smollm2": "\x1b[31mrig\x07\x9b"}


def test_hostile_names_reach_no_writer_raw(report: dict[str, Any], tmp_path: Path, no_plots, capsys) -> None:
    """The mode, class and rig names of a report: no raw tag in summary.md or report.html, no control
    character in either or on the terminal (--specgate-report-only's output and progress lines)."""
    text = json.dumps(report)
    for name, hostile in HOSTILE.items():
        text = text.replace(name, json.dumps(hostile)[1:-1])
    path = tmp_path / "report.json"
    path.write_text(text)
    assert render_saved_report(path) == 0
    progress_writer(SimpleNamespace(pluginmanager=SimpleNamespace(get_plugin=lambda name: None)))(
        f"measuring {HOSTILE['ngram']} on {HOSTILE['cpu-smollm2']}")
    terminal = capsys.readouterr()
    markdown = (tmp_path / "report-rendered" / "summary.md").read_text()
    page = (tmp_path / "report-rendered" / "report.html").read_text()
    for shown in (terminal.out, terminal.err, markdown, page):
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", shown)
        assert "rig" in shown and "[31m" not in shown
    assert "<script>alert(1)</script>" in terminal.out and "<img src=x onerror=alert(1)>" in terminal.out
    for raw in ("<script", "</script", "<img src=x"):
        assert raw not in markdown and raw not in page
    assert "- FAILED backfire [&lt;script>alert(1)&lt;/script>-&lt;img src=x onerror=alert(1)>-c1]" in markdown
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert markdown_without_html("fails < 0.95, catches <= 0.43") == "fails < 0.95, catches <= 0.43"  # as typed


def test_saved_report_renders_like_the_live_one(tmp_path: Path) -> None:
    session = _session(tmp_path)
    path = session.write_report(complete=True)
    saved = load_report(path)
    live = session.report_data(complete=True)
    assert render_text(saved) == render_text(live)
    assert render_markdown(saved) == render_markdown(live)


def test_declared_backfire_and_unmeasured_class(tmp_path: Path) -> None:
    session = _session(tmp_path)
    session.results = [r for r in session.results
                       if not (r.gate == "backfire" and r.prompt_class == "coding")]
    session.record(GateResult("backfire", "ngram", "coding", 1, Outcome.DECLARED_BACKFIRE,
                              "backfire: ngram is 26 % slower", declared="n-gram lookup cannot help free-form code"))
    session.failures[("ngram", "structured_json", 1)] = RequestError("HTTP 500 from the server\ntraceback...")
    report = session.report_data(complete=False)
    text = render_text(report)
    assert "[PARTIAL: the run did not finish]" in text
    assert _row(text, "coding", "ngram").endswith("declared backfire")
    assert "DECLARED ngram coding c1 backfire: backfire: ngram is 26 % slower" in text
    assert "NOT MEASURED [ngram-structured_json-c1]: HTTP 500 from the server" in text
    assert not any(line.startswith("FAILED") for line in text.splitlines())
    assert "(partial run)" in render_markdown(report).splitlines()[0]


def test_all_passed(tmp_path: Path) -> None:
    session = _session(tmp_path)
    session.results = [r for r in session.results if r.passed]
    report = session.report_data(complete=True)
    assert "All gates passed." in render_markdown(report)
    text = render_text(report)
    assert "FAILED" not in text and "FAIL " not in text


# report.json files written before the kinds were named for the stored figures (issue 16) said
# "no baseline" and "baseline update"; they render with today's words.
@pytest.mark.parametrize(("not_stored", "storing"), [pytest.param(NOT_STORED, STORING, id="current"),
                                                     pytest.param("no baseline", "baseline update", id="old-report")])
def test_gates_that_decided_nothing_are_not_called_passed(tmp_path: Path, not_stored: str, storing: str) -> None:
    # The GPU lab's pp2 run had no stored figures: every throughput test failed for want of them,
    # yet its summary ended "All gates passed." with "-" for every verdict.
    session = _session(tmp_path)
    session.results.clear()
    ngram_math = session.measurements[("ngram", "math", 1)]
    session.record_undecided("throughput", session.measurements[("no_spec", "coding", 1)], not_stored,
                             "no stored figures for rig cpu-smollm2 / mode no_spec / class coding / concurrency 1 in "
                             "b.json; store them with: pytest -m cpu --specgate-rig cpu-smollm2 "
                             "--specgate-update-baselines")
    session.record_undecided("throughput", ngram_math, storing, "this run's figures of ... will be stored")
    session.record_undecided("acceptance", ngram_math, storing, "this run's figures of ... will be stored")
    session.record(GateResult("backfire", "ngram", "math", 1, Outcome.PASS, "backfire: ngram is 25 % faster"))
    report = load_report(session.write_report(complete=True))
    markdown = render_markdown(report)
    assert "All gates passed." not in markdown
    assert "- NOT STORED throughput [no_spec-coding-c1]: no stored figures for rig cpu-smollm2" in markdown
    assert "- STORING: 2 gate(s) measured to store their figures, not decided" in markdown
    # the verdict cell: the mode's name, then the gate and why it decided nothing
    assert "| throughput: no stored figures " in _row(markdown, "coding", "no_spec")
    assert "| pass, throughput: storing figures, acceptance: storing figures " in _row(markdown, "math", "ngram")
    assert "no baseline" not in markdown and "baseline update" not in markdown
    session.undecided.clear()
    session.results.clear()
    assert render_markdown(session.report_data(complete=True)).endswith("No gate ran.\n")


def test_nothing_measured(tmp_path: Path) -> None:
    session = _session(tmp_path)
    session.measurements.clear()
    session.results.clear()
    assert render_text(session.report_data(complete=True)) == "specgate: nothing was measured"
    session.failures[("no_spec", "coding", 1)] = RequestError("connection refused")
    text = render_text(session.report_data(complete=True))
    assert text.splitlines() == ["specgate: nothing was measured",
                                 "NOT MEASURED [no_spec-coding-c1]: connection refused"]


def _tiny_report(ref: list[float], mode: list[float]) -> dict[str, Any]:
    def measurement(name: str, values: list[float]) -> dict[str, Any]:
        return {"mode": name, "prompt_class": "coding", "concurrency": 1, "acceptance": None,
                "records": [{"decode_tokens_per_s": v} for v in values]}

    return {"rig": {"name": "r", "tier": "cpu", "model": "m", "reference_mode": "no_spec",
                    "modes": {"no_spec": None, "ngram": {"method": "ngram"}}},
            "measurements": [measurement("no_spec", ref), measurement("ngram", mode)],
            "gates": [], "failures": []}


tps = st.floats(min_value=1.0, max_value=5000.0, allow_nan=False)


@given(ref=st.lists(tps, min_size=1, max_size=5), mode=st.lists(tps, min_size=1, max_size=5))
def test_change_is_the_ratio_of_medians(ref: list[float], mode: list[float]) -> None:
    import statistics

    table = speed_table(_tiny_report(ref, mode))
    r, m = statistics.median(ref), statistics.median(mode)
    assert re.search(rf"ngram +{re.escape(f'{m:.1f}')} +{re.escape(f'{(m / r - 1) * 100:+.0f}')} %", table), table
    assert f"{r:.1f}" in table


def test_markdown_rows_have_as_many_cells_as_the_header(report: dict[str, Any]) -> None:
    """No cell may contain a bare '|' (tabulate does not escape it): it would split the cell."""
    table = [line for line in speed_table(report, "github").splitlines() if line.startswith("|")]
    cells = [len(re.split(r"(?<!\\)\|", line)) for line in table]
    assert len(set(cells)) == 1, table


LAB13 = Path(__file__).resolve().parent / "data" / "lab" / "2026-12-02-h200-visit13"


def test_the_environment_table_and_the_host_bound_notice_on_a_real_lab_session():
    # GPU lab visit 13, session J3 (H200, CUDA graphs): the draft path's engine core kept a CPU busy
    # (and its rate followed that CPU's speed); EAGLE-3's and no_spec's had slack.
    import gzip

    from specgate.report.terminal import engine_cpu_per_s, environment_table, notice_lines

    report = json.loads(gzip.decompress((LAB13 / "J3" / "report.json.gz").read_bytes()))
    by_mode = {m["mode"]: m for m in report["measurements"]}
    assert round(engine_cpu_per_s(by_mode["draft1l_al30_async"]), 2) == 1.01
    assert round(engine_cpu_per_s(by_mode["eagle3_al30"]), 2) == 0.67
    table = environment_table(report)
    assert "engine CPU-s/s" in table and "1980-1980" in table
    host_bound = [line for line in notice_lines(report) if line.startswith("HOST-BOUND")]
    assert len(host_bound) == 1 and host_bound[0].startswith(
        "HOST-BOUND [draft1l_al30_async-coding-c1]: its engine core used 1.01 CPU-s per s of its requests")
    # on a CPU rig every engine core is host-bound by design: no notice
    report["rig"]["tier"] = "cpu"
    assert not [line for line in notice_lines(report) if line.startswith("HOST-BOUND")]


def test_the_canary_column_shows_the_fastest_reading_the_host_pace_check_compares():
    # GPU lab visit 14, session K1: the first lab session with specgate's own canary. The client's
    # CPU ran it at 25.0 us at best (37.8 median, the client's own work delaying it).
    import gzip

    from specgate.report.terminal import environment_table, notice_lines

    report = json.loads(gzip.decompress((LAB13.parent / "2026-12-02-h200-visit14" / "K1" / "report.json.gz"
                                         ).read_bytes()))
    assert "25.0 (37.8)" in environment_table(report)
    host_bound = [line for line in notice_lines(report) if line.startswith("HOST-BOUND")]
    assert len(host_bound) == 1 and "(canary fastest 25.0 us this window)" in host_bound[0]


def test_an_ab_windows_engine_is_the_side_that_worked_during_its_requests():
    # An A/B window's two servers run one mode (labels ngram@reference, ngram@candidate): the
    # window's own engine core is the one that used the CPU during its requests.
    from specgate.report.terminal import engine_cpu_per_s

    records = [{"started_at": 0.0, "finished_at": 2.0}, {"started_at": 4.0, "finished_at": 6.0}]
    telemetry = {"window": {"proc.ngram@reference.EngineCore-11.cpu_s": 1.2,
                            "proc.ngram@candidate.EngineCore-22.cpu_s": 3.6, "proc.ngram@candidate.api.cpu_s": 0.4},
                 "requests": {"p#0": {"proc.ngram@reference.EngineCore-11.cpu_s": 0.1,
                                      "proc.ngram@candidate.EngineCore-22.cpu_s": 1.8},
                              "p#1": {"proc.ngram@reference.EngineCore-11.cpu_s": 0.0,
                                      "proc.ngram@candidate.EngineCore-22.cpu_s": 1.8}}}
    window = {"mode": "ngram", "records": records, "telemetry": telemetry}
    assert engine_cpu_per_s(window) == pytest.approx(3.6 / 4.0)
    assert engine_cpu_per_s({"mode": "eagle3", "records": records, "telemetry": telemetry}) is None
    assert engine_cpu_per_s({"mode": "ngram", "records": records}) is None


@pytest.mark.parametrize("kind", [pytest.param("undecided", id="current"),
                                  pytest.param("inconclusive", id="old-report")])
def test_an_interval_across_the_threshold_reads_undecided_everywhere(tmp_path: Path, kind: str) -> None:
    """The outcome, the summary line and the table cell use one word (older reports said "inconclusive")."""
    session = _session(tmp_path)
    session.results.clear()
    session.record_undecided("backfire", session.measurements[("ngram", "math", 1)], kind,
                             "backfire: ngram 1.010x no_spec (0.980-1.040) holds 1.0")
    report = load_report(session.write_report(complete=True))
    markdown = render_markdown(report)
    assert "| backfire: undecided " in _row(markdown, "math", "ngram")
    assert "- UNDECIDED backfire [ngram-math-c1]: backfire: ngram 1.010x" in markdown
    assert "DECIDED NOTHING: 1 gate(s): 1 undecided" in markdown
    assert "inconclusive" not in markdown
