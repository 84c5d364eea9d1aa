"""wake_penalty: the first request after a sleep-mode wake, read from a saved alternation window."""

import gzip
import json
import math

import pytest

from specgate_lab.analyses.wake_penalty import alternation_windows, turns, window_ratio, woken_before

pytestmark = pytest.mark.fast


def record(at: float, rate: float) -> dict:
    return {"started_at": at, "decode_tokens_per_s": rate}


def test_turns_follow_the_send_order_and_the_first_after_a_wake_is_left_out_of_the_ratio(tmp_path):
    # ABBA by turn: the subject's turn 1 (no wake), the partner's two turns (woken once), the subject's last (woken)
    subject = [record(0, 300), record(1, 300), record(6, 294), record(7, 300)]
    partner = [record(2, 118), record(3, 120), record(4, 120), record(5, 120)]
    window = {"design": "alternation", "side": "subject", "mode": "al30", "prompt_class": "coding",
              "records": subject, "partner": {"mode": "no_spec", "records": partner}}
    path = tmp_path / "report.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"measurements": [window, {**window, "side": "partner"}]}).encode()))

    [read] = alternation_windows(path)
    assert turns(read) == [("subject", [300, 300]), ("partner", [118, 120, 120, 120]), ("subject", [294, 300])]
    every = window_ratio(turns(read), skip_first_after_wake=False)
    assert every == pytest.approx(math.exp((3 * math.log(300) + math.log(294)) / 4
                                           - (math.log(118) + 3 * math.log(120)) / 4))
    assert window_ratio(turns(read), skip_first_after_wake=True) == pytest.approx(300 / 120)
    assert not woken_before(read)
    # a newer report's window can begin right after a wake (a server's first sleep before it): its first turn's
    # first request is left out too
    woken = {**read, "alternation": {"before_window": {"to": "al30", "wake_s": 0.8}}}
    assert woken_before(woken)
    assert window_ratio(turns(woken), skip_first_after_wake=True, first_woken=True) == pytest.approx(300 / 120)
