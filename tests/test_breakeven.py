"""Issue 14, point 5: the break-even diagnosis, c = AL x no-spec tok/s / spec tok/s, in the
report's tables and report.json."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specgate.decide.breakeven import break_even, from_report
from specgate.report.verdicts import breakeven_line

pytestmark = pytest.mark.fast

rates = st.floats(min_value=1.0, max_value=1000.0)
lengths = st.floats(min_value=1.0, max_value=9.0)


@given(al=lengths, spec=rates, plain=rates)
def test_speculation_pays_iff_al_exceeds_the_step_cost(al, spec, plain):
    d = break_even("m", acceptance_length=al, spec_tokens_per_s=spec, plain_tokens_per_s=plain)
    (cost, _), (steps, _) = d.step_cost, d.spec_steps_per_s
    assert steps == pytest.approx(spec / al)
    assert cost == pytest.approx(plain / steps)  # one speculative step in plain steps
    assert d.predicted_speedup(al)[0] == pytest.approx(spec / plain)  # at its own AL: the measured speedup
    if spec / plain > 1 + 1e-9:
        assert d.verdict == "pays" and al > cost
    elif spec / plain < 1 - 1e-9:
        assert d.verdict == "backfires" and al < cost


def test_ranges_straddling_break_even_say_so():
    d = break_even("eagle", acceptance_length=(2.0, 2.2), spec_tokens_per_s=(40.0, 60.0), plain_tokens_per_s=50.0)
    assert d.verdict == "break-even"
    assert breakeven_line(d.to_dict()) == ("eagle's step costs 1.7-2.8 plain steps; it needs AL above that; it reached "
                                           "2.00-2.20")
    with pytest.raises(ValueError, match="positive ranges"):
        break_even("x", acceptance_length=(3.0, 2.0), spec_tokens_per_s=1.0, plain_tokens_per_s=1.0)


def _window(mode, tps, acceptance=None):
    return {"mode": mode, "prompt_class": "coding", "concurrency": 1, "acceptance": acceptance,
            "records": [{"decode_tokens_per_s": v} for v in tps]}


REPORT = {
    "rig": {"name": "r", "tier": "cpu", "model": "m", "reference_mode": "no_spec", "modes": {}},
    "measurements": [
        _window("no_spec", [30.0, 31.0, 29.0]),
        _window("ngram", [20.0, 21.0, 19.0], {"mean_acceptance_length": 2.0, "acceptance_rate": 0.2,
                                              "accepted_per_position": [3, 2, 1, 1, 0],
                                              "per_position_rates": [0.6, 0.2, 0.1, 0.1, 0.0]}),
    ],
    "gates": [], "undecided": [], "failures": [],
}


def test_rows_from_a_report_and_their_rendering():
    from specgate.report.terminal import render_markdown, render_text

    (row,) = from_report(REPORT)
    assert (row["mode"], row["prompt_class"], row["verdict"]) == ("ngram", "coding", "backfires")
    assert row["step_cost"] == pytest.approx([3.0, 3.0])
    assert row["speedup_at_full_acceptance"] == pytest.approx([2.0, 2.0])  # AL 6 / c 3
    line = "ngram's step costs 3.0 plain steps; it needs AL above that; it reached 2.00"
    assert breakeven_line(row) == line
    text = render_text(REPORT)  # the terminal's table has the figures, summary.md the diagnosis too
    assert "break-even: step cost c = AL x no-spec tok/s / spec tok/s" in text and "backfires" in text
    assert f"| {line} |" in render_markdown(REPORT)


def test_report_json_carries_the_break_even_rows(tmp_path):
    from pathlib import Path

    from specgate.measure.client import RequestRecord
    from specgate.measure.metrics import AcceptanceStats
    from specgate.measure.protocol import ClassMeasurement
    from specgate.plugin.resolve import SessionOptions
    from specgate.plugin.session import SpecgateSession

    def window(mode, rate, acceptance=None):
        span = 63 / rate  # 64 tokens: (64 - 1) / span == rate
        records = [RequestRecord(request_id=f"{mode}/coding/p{i}#0", mode=mode, prompt_class="coding",
                                 prompt_id=f"p{i}", concurrency=1, started_at=0.0, first_token_at=0.1,
                                 last_token_at=0.1 + span, finished_at=0.1 + span, chunk_times=[0.1, 0.1 + span],
                                 prompt_tokens=10, completion_tokens=64, text="x", finish_reason="length")
                   for i in range(3)]
        return ClassMeasurement(rig="cpu-smollm2", mode=mode, prompt_class="coding", concurrency=1, records=records,
                                acceptance=acceptance, server_decode_tokens_per_s=None, server_metric_source=None,
                                wall_s=1.0)

    root = Path(__file__).resolve().parent.parent
    session = SpecgateSession(SessionOptions(rig_name="cpu-smollm2", fixtures_dir=root / "fixtures",
                                             baselines_path=tmp_path / "b.json", run_dir=tmp_path, repo_root=root))
    session.measurements[("no_spec", "coding", 1)] = window("no_spec", 30.0)
    session.measurements[("ngram", "coding", 1)] = window("ngram", 45.0, AcceptanceStats(
        drafts=10, draft_tokens=50, accepted_tokens=20, accepted_per_position=(8, 6, 4, 2, 0)))

    (row,) = json.loads(session.write_report(complete=True).read_text())["breakeven"]

    assert row["acceptance_length"] == pytest.approx([3.0, 3.0])
    assert row["step_cost"] == pytest.approx([2.0, 2.0])  # 3 x 30 / 45
    assert row["verdict"] == "pays"
    assert breakeven_line(row) == "ngram's step costs 2.0 plain steps; it needs AL above that; it reached 3.00"
