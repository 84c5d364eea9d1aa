"""Issue 47, item 5: a paired TTFT gate per mode and class in A/B and backfire windows (higher TTFT
is worse), decided by the speed gates' rules and interval machinery, shown in the summary's TTFT
table and in report.json with the same numbers as its message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from standins import gate_settings, window_side
from words import said

from specgate.config.rig import Gates, load_rig
from specgate.decide.gates import check_ttft
from specgate.decide.outcome import Outcome
from specgate.measure.client import RequestRecord
from specgate.measure.protocol import ClassMeasurement
from specgate.plugin.resolve import SessionOptions
from specgate.plugin.session import SpecgateSession
from specgate.report.terminal import render_markdown, render_text, verdict_rows

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["p0", "p1", "p2", "p3", "p4", "p5"]


def _record(mode: str, key: str, ttft: float) -> RequestRecord:
    return RequestRecord(request_id=f"{mode}/coding/{key}", mode=mode, prompt_class="coding",
                         prompt_id=key.split("#")[0], concurrency=1, started_at=10.0, first_token_at=10.0 + ttft,
                         last_token_at=12.0 + ttft, finished_at=12.0 + ttft, chunk_times=[10.0 + ttft, 12.0 + ttft],
                         prompt_tokens=10, completion_tokens=48, text="x", finish_reason="length")


def _window(mode: str, ttfts: dict[str, float], side: str = "subject") -> ClassMeasurement:
    return ClassMeasurement(rig="cpu-smollm2", mode=mode, prompt_class="coding", concurrency=1,
                            records=[_record(mode, k, t) for k, t in ttfts.items()], acceptance=None,
                            server_decode_tokens_per_s=None, server_metric_source=None, wall_s=1.0,
                            arrangement="duet", **window_side(side))


def _ttfts(base: list[float], factor: float = 1.0, repeats: int = 2, wobble: float = 0.01) -> dict[str, float]:
    out = {}
    for r in range(repeats):
        for i, (prompt, t) in enumerate(zip(PROMPTS, base)):
            out[f"{prompt}#{r}"] = t * factor * (1 + wobble * ((i + r) % 3 - 1))
    return out


BASE = [0.45, 0.50, 0.40, 0.60, 0.55, 0.48]


@pytest.fixture(scope="module")
def rig():
    return load_rig("cpu-smollm2", ROOT / "fixtures")


def _ab(rig, factor: float, wobble: float = 0.01):
    candidate = _window("ngram", _ttfts(BASE, factor, wobble=wobble))
    candidate.partner = _window("ngram", _ttfts(BASE, wobble=0.0), side="reference")
    return check_ttft(gate_settings(rig, candidate), candidate, candidate.partner)


def test_an_ab_with_the_same_ttft_passes_and_one_twenty_percent_longer_fails(rig):
    same = _ab(rig, 1.0)
    assert same.outcome is Outcome.PASS and same.gate == "ttft"
    assert same.details["ci_low"] <= 1.0 <= same.details["ci_high"]
    longer = _ab(rig, 1.2)
    assert longer.outcome is Outcome.FAIL
    assert longer.details["ratio"] == pytest.approx(1.2, abs=0.02)
    assert longer.details["ci_low"] > longer.details["limit"] == pytest.approx(1.10)
    assert "TTFT longer: 1.2" in said(longer) and "x the reference side (" in said(longer)
    assert "fails above 1.10" in said(longer)


def test_a_noisy_window_near_the_limit_is_undecided(rig):
    result = _ab(rig, 1.09, wobble=0.2)
    assert result.outcome is Outcome.UNDECIDED
    assert result.details["ci_low"] < result.details["limit"] < result.details["ci_high"]
    assert "TTFT undecided" in said(result)


def test_a_backfire_window_compares_with_no_speculation_by_prompt(rig):
    ngram = _window("ngram", _ttfts(BASE, 1.03))
    no_spec = _window("no_spec", _ttfts(BASE, wobble=0.0), side="partner")
    ngram.partner = no_spec
    result = check_ttft(gate_settings(rig, ngram), ngram, no_spec)
    assert result.outcome is Outcome.PASS
    assert "x no speculation" in said(result) and "prompts as strata" in result.details["method"]


def test_the_tolerance_comes_from_the_rig_per_class():
    gates = Gates(ttft_tolerance=0.2, classes={"coding": {"ttft_tolerance": 0.3}})
    assert gates.for_class("coding").ttft_tolerance == 0.3
    assert gates.for_class("math").ttft_tolerance == 0.2
    assert Gates().ttft_tolerance == 0.10


def test_the_summary_and_report_json_show_the_numbers_of_the_message(rig, tmp_path):
    session = SpecgateSession(SessionOptions(
        rig_name="cpu-smollm2", fixtures_dir=ROOT / "fixtures", baselines_path=tmp_path / "baselines.json",
        run_dir=tmp_path / "run", repo_root=ROOT))
    longer = _ab(rig, 1.2)
    open_ = _ab(rig, 1.09, wobble=0.2)
    open_.prompt_class = "math"
    session.record(longer)
    session.record(open_)
    report = json.loads(json.dumps(session.report_data(complete=True)))
    (stored,) = [g for g in report["gates"] if g["gate"] == "ttft"]
    (undecided,) = [u for u in report["undecided"] if u["gate"] == "ttft"]
    d = stored["details"]
    assert stored["outcome"] == "fail" and undecided["outcome"] == "undecided"
    ratio, interval = f"{d['ratio']:.3f}", f"{d['ci_low']:.3f}-{d['ci_high']:.3f}"
    assert ratio in stored["message"] and interval in stored["message"]
    rows = [row for row in verdict_rows(report) if row[3] == "ttft"]  # the TTFT table's numbers, one row per gate
    row = next(row for row in rows if row[:2] == ["ngram", "coding"])
    assert row[7] == f"{ratio} ({interval})" and row[10] == "FAIL (longer)"
    assert row[6] == f"{d['median_ttft_ms']:.0f} ms" and row[5] == f"{d['reference_median_ttft_ms']:.0f} ms"
    assert next(row for row in rows if row[1] == "math")[10] == "UNDECIDED"
    report["measurements"] = [_window("ngram", _ttfts(BASE)).to_dict()]
    report["rig"]["modes"] = {"ngram": {}}
    assert "ngram coding c1 ttft: " in render_text(report) and "time to first token" in render_markdown(report)
