"""The stored-ratio throughput gate across sessions, on the GPU lab's real reports
(docs/journal/lab/2026-12-01-h200-draft4l.md): draft_al30 against the live no-speculation server measured
1.538 (s1b), 1.624 (s2) and 1.630 (s3) in three fresh sessions (Hodges-Lehmann; with the prompts as strata,
as they are stored now, 1.534, 1.617 and 1.628), nothing changed in between."""

import gzip
import json
from pathlib import Path

import pytest
from standins import gate_settings
from words import said

from specgate.cli import main
from specgate.config.rig import load_rig
from specgate.decide.gates import check_throughput
from specgate.decide.history import StartHistory
from specgate.decide.outcome import Outcome
from specgate.measure.protocol import ClassMeasurement
from specgate.store.baselines import load_baselines, lookup

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent
LAB = ROOT / "tests" / "data" / "lab" / "2026-12-01-h200-draft4l"
RIG = "h200-llama8b-dummy"


MACHINE = "GPU-lab-h200"  # the three sessions ran on one lease; their reports predate the machine's key


def _report(tmp_path: Path, session: str) -> Path:
    """The session's report, its fingerprints naming the lease's machine (stored starts of one machine
    and build make one history: specgate.store.baselines.place_start)."""
    data = json.loads(gzip.decompress((LAB / session / "report.json.gz").read_bytes()))
    for fingerprint in data.get("fingerprints", {}).values():
        fingerprint["machine"] = MACHINE
    out = tmp_path / f"{session}.json"
    out.write_text(json.dumps(data))
    return out


def _window(report: Path, mode: str) -> ClassMeasurement:
    """The window as this checkout measures it: these reports predate the no-speculation mode's
    rename, so its duet partner is called "baseline" there (adopt-baselines renames it the same way)."""
    data = json.loads(report.read_text())
    window = next(ClassMeasurement.from_dict(m) for m in data["measurements"] if m["mode"] == mode)
    if window.partner is not None and window.partner.mode == "baseline":
        window.partner.mode = "no_spec"
    return window


@pytest.fixture
def baselines(tmp_path: Path) -> Path:
    path = tmp_path / "baselines.json"
    store = json.loads((ROOT / "baselines.json").read_text())
    store["rigs"].pop(RIG, None)
    path.write_text(json.dumps(store))
    return path


def _adopt(baselines: Path, *reports: Path) -> None:
    for report in reports:
        assert main(["adopt-baselines", str(report), "--baselines", str(baselines), "--modes", "draft_al30"]) == 0


def test_adopting_reports_in_turn_keeps_the_ratio_and_level_histories(tmp_path, baselines, capsys):
    _adopt(baselines, *(_report(tmp_path, s) for s in ("s1b", "s2", "s3")))
    entry = lookup(load_baselines(baselines), RIG, "draft_al30", "coding", 1)
    assert [round(r, 3) for r in entry.ratio_history] == [1.534, 1.617, 1.628]  # prompts as strata
    assert entry.ratio_to_reference.ratio == pytest.approx(entry.ratio_history[-1])
    assert [round(x) for x in entry.level_history] == [334, 362, 361]


def test_a_session_6_percent_off_is_undecided_and_the_stored_spread_says_why(tmp_path, baselines):
    rig = load_rig(RIG, ROOT / "fixtures")
    s1b, s2, s3 = (_report(tmp_path, s) for s in ("s1b", "s2", "s3"))
    window = _window(s1b, "draft_al30")
    only_s3, all_three = tmp_path / "only-s3.json", tmp_path / "all-three.json"
    for path in (only_s3, all_three):
        path.write_text(baselines.read_text())

    _adopt(only_s3, s3)  # one stored session: the two windows' intervals only
    one = check_throughput(gate_settings(rig, window), window,
                           lookup(load_baselines(only_s3), RIG, "draft_al30", "coding", 1))
    # 0.942x (0.910-0.976; Hodges-Lehmann gave 0.944x, 0.906-0.977): nothing changed, and only the
    # stored window's interval kept this from failing at 0.97; the message says the spread between
    # sessions is not known.
    assert one.outcome is Outcome.UNDECIDED and one.details["verdict"] == "undecided"
    assert round(one.details["ratio"], 3) == 0.942 and 0.97 < one.details["ci_high"] < 0.98
    assert "session-to-session spread unknown (fewer than 3 stored ratios, no start_noise)" in said(one)

    # with three stored, the comparison is with their mean (s1b's own ratio among them), within their
    # prediction interval alone: 2 degrees of freedom, t = 4.30 (not 1.96) x s x sqrt(1 + 1/3)
    _adopt(all_three, s1b, s2, s3)
    entry = lookup(load_baselines(all_three), RIG, "draft_al30", "coding", 1)
    three = check_throughput(gate_settings(rig, window), window, entry)
    mean = StartHistory(tuple(entry.ratio_history)).center
    assert three.details["ratio"] == pytest.approx(one.details["ratio"] * entry.ratio_to_reference.ratio / mean)
    assert three.outcome is Outcome.UNDECIDED and three.details["verdict"] == "undecided"
    assert three.details["ci_low"] < one.details["ci_low"] and three.details["ci_high"] > 1.0
    assert "against the mean of the stored ratios; session-to-session spread 3.26 %" in said(three)
    assert "95.0 % prediction interval 0.819-1.133" in said(three)
    assert "(t, 2 df = 4.30)" in said(three)


def test_with_fewer_than_3_stored_ratios_the_rigs_start_noise_stands_in_for_the_sessions(tmp_path, baselines):
    # The cpu rigs (start_noise 0.10): the strata interval of one window is narrow (+-1-2 % on a quiet
    # VM) while ngram's ratio moved 1.145 -> 1.006 between two runs of a busy one; until 3 ratios are
    # stored, four server starts' worth of the rig's start noise is what the pairs cannot see.
    rig = load_rig(RIG, ROOT / "fixtures")
    noisy = rig.model_copy(update={"gates": rig.gates.model_copy(update={"start_noise": 0.02})})
    s1b, s3 = (_report(tmp_path, s) for s in ("s1b", "s3"))
    _adopt(baselines, s3)
    entry = lookup(load_baselines(baselines), RIG, "draft_al30", "coding", 1)
    window = _window(s1b, "draft_al30")
    plain = check_throughput(gate_settings(rig, window), window, entry)
    window = _window(s1b, "draft_al30")
    widened = check_throughput(gate_settings(noisy, window), window, entry)
    assert widened.details["ratio"] == pytest.approx(plain.details["ratio"])
    assert widened.details["ci_low"] < plain.details["ci_low"] and widened.details["ci_high"] > 1.0
    assert "from the rig's start noise (2 % per start, four starts, z = 1.96) until 3 ratios are stored" \
        in said(widened)
