"""Issue 52: an A/B over start pairs (specgate.decide.start_pairs). The session commands alternate the side
started first; each window's throughput ratios combine into one verdict that names its start pairs,
from the rig's measured start-pair spread with 2, from their own spread with 3 or more."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from specgate.config.rig import load_rig
from specgate.decide.start_pairs import combine_reports, session_command
from specgate.report.start_pairs_view import run_start_pairs
from specgate.report.verdicts import statement

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent
# the teeth's A/A start pairs on the cpu tier read 1.060x, 0.998x, 0.942x, 1.026x, 0.982x, 1.012x and
# 1.025x (issue 52): a start-pair SD of 3.8 %
SEVEN_AA = (1.060, 0.998, 0.942, 1.026, 0.982, 1.012, 1.025)


@pytest.fixture(scope="module")
def rig():
    return load_rig("cpu-smollm2-teeth", ROOT / "fixtures")


def _report(ratio: float, half: float = 0.02) -> dict:
    details = {"ratio": ratio, "ci_low": ratio * (1 - half), "ci_high": ratio * (1 + half), "confidence": 0.95,
               "n": 12, "reference_label": "the reference side", "verdict": "equal"}
    gate = {"gate": "throughput", "mode": "no_spec", "prompt_class": "coding", "concurrency": 1, "outcome": "pass",
            "details": details}
    return {"specgate_report": 1, "rig": {"name": "cpu-smollm2-teeth"}, "measurements": [], "gates": [gate]}


def _with_spread(rig, spread: float):
    return rig.model_copy(update={"gates": rig.gates.model_copy(update={"start_pair_spread": spread})})


def test_the_sessions_alternate_the_side_started_first(rig, tmp_path):
    first, second = (session_command(rig, side, tmp_path / "p", ["-k", "throughput"])
                     for side in ("reference", "candidate"))
    assert "--specgate-first-side=reference" in first and "--specgate-first-side=candidate" in second
    assert f"--specgate-rig={rig.name}" in first and first[-2:] == ["-k", "throughput"]


def test_two_start_pairs_fold_in_the_rigs_measured_spread(rig):
    (gate,) = combine_reports(_with_spread(rig, 0.038), [("reference", _report(1.060)),
                                                        ("candidate", _report(0.942))])
    assert gate["start_pairs"] == 2 and "2 start pairs, the first side alternating" in statement(gate)
    assert "reference first: 1.060x" in statement(gate) and "candidate first: 0.942x" in statement(gate)
    assert gate["details"]["ratio"] == pytest.approx((1.060 * 0.942) ** 0.5)
    assert "the rig's start-pair spread 3.8 %" in statement(gate)
    # the two worst A/A start pairs of seven, averaged: not a FAIL
    assert gate["outcome"] != "fail"
    (unknown,) = combine_reports(_with_spread(rig, 0.0), [("reference", _report(1.0)), ("candidate", _report(1.0))])
    assert "start-pair spread unknown (start_pair_spread = 0)" in statement(unknown)


def test_two_start_pairs_take_t_at_the_degrees_of_freedom_of_the_rigs_spread(rig):
    """Issue 62, build item 2: the rig's 0.038 rests on seven start pairs (start_pair_spread_pairs = 7),
    so two start pairs combine with t(6) = 2.45, not z = 1.96: the A/A's interval widens."""
    assert rig.gates.start_pair_spread_pairs == 7 and rig.gates.start_pair_dof == 6
    aa = [("reference", _report(1.0)), ("candidate", _report(1.0))]
    (with_t,) = combine_reports(rig, aa)
    known = rig.model_copy(update={"gates": rig.gates.model_copy(update={"start_pair_spread_pairs": None})})
    (with_z,) = combine_reports(known, aa)
    assert "t, 6 df = 2.45" in statement(with_t) and "over 7 start pairs" in statement(with_t)
    assert "(z = 1.96)" in statement(with_z)
    assert with_t["details"]["ci_low"] < with_z["details"]["ci_low"] < 1 < with_z["details"]["ci_high"] < \
        with_t["details"]["ci_high"]


def test_three_or_more_start_pairs_take_their_own_spread(rig):
    reports = [(("reference", "candidate")[i % 2], _report(r)) for i, r in enumerate(SEVEN_AA)]
    (gate,) = combine_reports(rig, reports)
    assert gate["start_pairs"] == 7 and "t, 6 df" in statement(gate)
    assert gate["outcome"] == "pass"  # the seven A/A start pairs together: within the teeth's tolerance
    slowed = [(("reference", "candidate")[i % 2], _report(r * 0.90)) for i, r in enumerate(SEVEN_AA)]
    (slow,) = combine_reports(rig, slowed)
    assert slow["outcome"] == "fail" and slow["details"]["ci_high"] < 1 - rig.gates.ab_gate_tolerance


def test_run_start_pairs_combines_the_sessions_and_exits_as_the_gates_say(rig, tmp_path, monkeypatch, capsys):
    ratios = iter((0.90, 0.89, 0.91))

    def session(argv, **_):
        run_dir = Path(next(a for a in argv if a.startswith("--specgate-run-dir=")).split("=", 1)[1])
        run_dir.mkdir(parents=True)
        (run_dir / "report.json").write_text(json.dumps(_report(next(ratios), half=0.01)))
        return subprocess.CompletedProcess(argv, 1)

    monkeypatch.setattr(subprocess, "run", session)
    assert run_start_pairs(rig, 3, runs_dir=tmp_path) == 1
    out = capsys.readouterr().out
    assert "start pair 2/3 of rig cpu-smollm2-teeth, the candidate side first" in out
    verdict = next(line for line in out.splitlines() if line.startswith("FAIL"))
    assert "[3 start pairs]" in verdict and len(verdict) <= 160  # one line; the rest in the file
    combined = json.loads((tmp_path / "combined.json").read_text())
    assert combined["start_pairs"] == 3 and combined["gates"][0]["outcome"] == "fail"
    assert "3 start pairs" in combined["gates"][0]["message"] and len(combined["gates"][0]["message"]) > 160


def test_the_spread_a_session_folded_in_is_counted_once_and_a_kept_folder_combines_again(rig, tmp_path):
    # each session's own verdict already widened its interval by the rig's start-pair spread
    # (details.start_pair.widened_log); the combination takes the window's own noise without it
    from specgate.decide.start_pairs import combine_folder

    spread = _with_spread(rig, 0.038)
    widened = []
    for k, (first, ratio) in enumerate((("reference", 0.996), ("candidate", 0.987)), start=1):
        report = _report(ratio, half=0.011 + 0.073)  # the window's ±1.1 % and z x ln(1.038) on top
        report["gates"][0]["details"]["start_pair"] = {"widened_log": 0.073}
        report["start_order"] = {"seed": 1, "first": {"no_spec": first}}
        (tmp_path / f"pair-{k:02d}").mkdir()
        (tmp_path / f"pair-{k:02d}" / "report.json").write_text(json.dumps(report))
        widened.append((first, report))
    (once,) = combine_folder(spread, tmp_path)
    assert [p["first"] for p in once["details"]["per_pair"]] == ["reference", "candidate"]
    half = (once["details"]["ci_high"] - once["details"]["ci_low"]) / 2
    assert 0.06 < half < 0.07  # t(6) x sqrt(0.037^2 / 2 + noise / 4): about ±6.5 %, not ±10 %
