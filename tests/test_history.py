"""specgate.decide.history and the stored-level gate with a history of starts: the lab's 10 stored starts
(baselines.json, rig h200-wide15b-history) and two of the plain runs replayed against them on the
H200 (docs/evidence/lab/2026-12-04-h200-history), decided again by today's gate code."""

import gzip
import json
import math
from pathlib import Path

import pytest
from standins import gate_settings
from words import said

from specgate.config.rig import load_rig
from specgate.decide.gates import check_throughput
from specgate.decide.history import StartHistory
from specgate.decide.outcome import Outcome
from specgate.measure.protocol import ClassMeasurement
from specgate.store.baselines import load_baselines, lookup

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent
RIG = "h200-wide15b-history"
EVIDENCE = ROOT / "docs" / "evidence" / "lab" / "2026-12-04-h200-history"


def _window(name: str) -> ClassMeasurement:
    # the window as the report kept it, every request's record whole but its text (not read by the gate)
    with gzip.open(EVIDENCE / f"{name}.window.json.gz", "rt") as f:
        return ClassMeasurement.from_dict(json.load(f))


def test_the_prediction_interval_of_a_history():
    history = StartHistory((100.0, 101.0, 99.0))
    assert history.starts == 3 and history.dof == 2 and history.usable
    assert history.center == pytest.approx(math.exp(sum(map(math.log, (100, 101, 99))) / 3))
    # t(2) at 95 % x sd x sqrt(1 + 1/3)
    assert history.half_width(0.95) == pytest.approx(4.3027 * history.log_sd * math.sqrt(4 / 3), rel=1e-3)
    assert not StartHistory((100.0, 101.0)).usable


def test_the_lab_rig_holds_ten_stored_starts():
    entry = lookup(load_baselines(ROOT / "baselines.json"), RIG, "no_spec", "coding", 1)
    assert len(entry.level_history) >= 10


@pytest.mark.parametrize(("replay", "outcome"), [("replay-01", Outcome.FAIL), ("replay-03", Outcome.PASS)])
def test_plain_runs_against_the_stored_starts_decide(replay, outcome):
    # replay-01 ran with every GPU step 5 % longer, replay-03 with nothing changed (the campaign's log)
    rig = load_rig(RIG, ROOT / "fixtures")
    entry = lookup(load_baselines(ROOT / "baselines.json"), RIG, "no_spec", "coding", 1)
    window = _window(replay)
    result = check_throughput(gate_settings(rig, window), window, entry)
    assert result.outcome is outcome, said(result)
    # the history's own words (StartHistory.describe; pinned in test_histories' history command test)
    history = StartHistory(tuple(entry.level_history))
    assert said(result).count(f"{history.starts} stored starts") == 1  # said once, in the ratio's clause
    assert f"start-to-start spread {history.log_sd * 100:.2f} % (" in said(result)
    assert "not pooled" in said(result)
