"""A stored figure is compared only on a host of the stored pace (``gates.host_pace_tolerance``).

Real windows from lab visit 13 (docs/journal/lab/2026-12-02-h200-visit13.md; the GPU-bound rig, CUDA graphs,
48 pairs each): the 1-layer async draft against the live no-speculation server gave 2.312 in J2,
on a host at its usual pace, and 1.846 in J1, while every CPU of that host ran a fixed piece of
Python work ~1.8x slower (the lab helper's canary on the otherwise idle CPU 12: median 25.4 us in
J2, 47.5 us in J1). specgate's own canary did not run in visit 13, so these tests give the two
windows those helper readings as their canaries."""

import gzip
import json
from pathlib import Path

import pytest
from standins import gate_settings
from words import said

from specgate.config.rig import load_rig
from specgate.decide.entry import baseline_entry
from specgate.decide.gates import check_throughput
from specgate.decide.host_pace import host_canary_us
from specgate.decide.outcome import Outcome
from specgate.measure.protocol import ClassMeasurement
from specgate.store.baselines import Fingerprint

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent
LAB = ROOT / "tests" / "data" / "lab" / "2026-12-02-h200-visit13"
MODE = "draft1l_al30_async"


def _window(session: str, canary_us: float | None) -> ClassMeasurement:
    data = json.loads(gzip.decompress((LAB / session / "report.json.gz").read_bytes()))
    window = next(ClassMeasurement.from_dict(m) for m in data["measurements"] if m["mode"] == MODE)
    telemetry = window.extra.setdefault("telemetry", {}).setdefault("window", {})
    if canary_us is None:
        telemetry.pop("cpu_canary_us", None)
    else:
        telemetry["cpu_canary_us"] = [canary_us, canary_us + 3, canary_us + 20]
    return window


@pytest.fixture(scope="module")
def rig():
    return load_rig("h200-llama8b-dummy", ROOT / "fixtures")


@pytest.fixture(scope="module")
def stored_j2():
    """J2's window stored as the reference figures, with its host's pace."""
    return baseline_entry(_window("J2", 25.4), Fingerprint())


def test_the_stored_entry_keeps_the_hosts_pace(stored_j2) -> None:
    assert host_canary_us(_window("J1", 47.5)) == 47.5  # the window's fastest reading
    assert host_canary_us(_window("J1", None)) is None
    assert stored_j2.host_canary_us == [25.4]
    assert round(stored_j2.ratio_to_reference.ratio, 3) == 2.312
    again = baseline_entry(_window("J3", 24.7), Fingerprint(), stored_j2)
    assert again.host_canary_us == [25.4, 24.7]
    assert baseline_entry(_window("J3", None), Fingerprint(), again).host_canary_us == [25.4, 24.7]


def test_a_window_on_a_slower_host_is_undecided_and_says_what_the_comparison_gave(rig, stored_j2) -> None:
    window = _window("J1", 47.5)
    result = check_throughput(gate_settings(rig, window), window, stored_j2)
    assert result.details["verdict"] == "undecided" and result.details["undecided"]
    assert result.details["decided_as"] == "slower"  # 1.846 against 2.312: this would have failed
    assert result.details["ratio"] == pytest.approx(1.846 / 2.312, abs=0.001)
    assert result.details["host_pace"]["factor"] == pytest.approx(47.5 / 25.4)
    assert "took 47.5 us for specgate's CPU canary against 25.4 us behind the stored figures" in said(result)
    assert "1.87x as long: a slower host; the rig allows ±25 %, host_pace_tolerance" in said(result)
    assert "It gave: " in said(result) and "slower" in said(result)


def test_at_the_stored_pace_the_comparison_decides_as_before(rig, stored_j2) -> None:
    window = _window("J1", 26.0)
    same_pace = check_throughput(gate_settings(rig, window), window, stored_j2)
    window = _window("J1", None)
    no_canary = check_throughput(gate_settings(rig, window), window, stored_j2)
    assert same_pace.details["verdict"] == no_canary.details["verdict"] == "slower"
    assert not same_pace.passed and not no_canary.passed
    assert same_pace.details["host_pace"]["factor"] == pytest.approx(26.0 / 25.4)
    assert "host_pace" not in no_canary.details  # nothing to compare: no canary ran


def test_a_faster_host_is_undecided_too_and_none_turns_the_check_off(rig, stored_j2) -> None:
    # A faster host can hide a slowdown as well as a slower one can invent it.
    window = _window("J3", 15.0)
    faster = check_throughput(gate_settings(rig, window), window, stored_j2)
    assert faster.details["verdict"] == "undecided" and "1.69x as fast: a faster host" in said(faster)
    assert faster.outcome is Outcome.OTHER_MACHINE
    unchecked = rig.model_copy(update={"gates": rig.gates.model_copy(update={"host_pace_tolerance": None})})
    window = _window("J3", 15.0)
    decided = check_throughput(gate_settings(unchecked, window), window, stored_j2)
    assert "host_pace" not in decided.details and decided.outcome is not Outcome.OTHER_MACHINE


def test_the_run_lists_it_as_other_host_pace_not_as_inconclusive(rig, stored_j2, tmp_path) -> None:
    from specgate.decide.host_pace import HOST_PACE
    from specgate.plugin.gatekeeper import GateKeeper
    from specgate.plugin.resolve import SessionOptions
    from specgate.plugin.session import SpecgateSession
    from specgate.report.terminal import failed_gate_lines

    session = SpecgateSession(SessionOptions(rig_name=rig.name, fixtures_dir=ROOT / "fixtures",
                                             baselines_path=tmp_path / "b.json", run_dir=tmp_path, repo_root=ROOT))
    with pytest.raises(pytest.skip.Exception,
                       match=r"^draft1l_al30_async coding c1 throughput: host at 1\.87x the stored figures' CPU "
                             r"canary time \(47\.5 vs 25\.4 us\): not compared \[other machine\]$"):
        window = _window("J1", 47.5)
        GateKeeper(session)._finish(check_throughput(gate_settings(rig, window), window, stored_j2))
    recorded = session.undecided
    assert [(u["kind"], u["outcome"]) for u in recorded] == [(HOST_PACE, "other machine")]
    *_, line = failed_gate_lines({"gates": [], "undecided": recorded})
    assert line.startswith("OTHER HOST PACE draft1l_al30_async coding c1 throughput: host at 1.87x the stored")
