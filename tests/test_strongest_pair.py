"""A pair standing out of a two-mode window (one hiccup request) is named beside the verdict,
never deciding it: replayed on visit 9's real GPU-bound windows (docs/journal/lab/2026-12-01-h200-visit9.md:
E2's eagle3_al30 had one request decoding at 437.8 instead of ~540 tok/s) and on stand-ins."""

import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest
from standins import gate_settings
from words import said

from specgate.config.rig import load_rig
from specgate.decide.gates import check_backfire
from specgate.decide.paired import paired_ratio, stratified_log_ratio, strongest_pair
from specgate.measure.protocol import ClassMeasurement
from specgate.report.terminal import notice_lines
from specgate.report.verdicts import follow_up_text, strongest_pair_text

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent
VISIT9 = ROOT / "tests" / "data" / "lab" / "2026-12-01-h200-visit9"
PROMPTS = [p for p in ("a", "b", "c", "d", "e", "f") for _ in range(2)]  # 6 prompts x 2 repeats


def backfire(session: str) -> dict[str, object]:
    data = json.loads(gzip.decompress((VISIT9 / session / "report.json.gz").read_bytes()))
    rig = load_rig("h200-llama8b-dummy", ROOT / "fixtures")
    out = {}
    for raw in data["measurements"]:
        m = ClassMeasurement.from_dict(raw)
        if m.partner is not None and m.mode != "no_spec":
            out[m.mode] = check_backfire(gate_settings(rig, m), m, m.partner)
    return out


def test_the_hiccup_request_of_visit9_e2_is_named_and_does_not_change_the_verdict():
    result = backfire("E2")["eagle3_al30"]
    pair = result.details["strongest_pair"]
    assert pair["key"] == "bst-insert-delete#1"  # the eagle3 side's slow request, not its partner #0
    assert round(pair["measured"], 1) == 437.8 and round(pair["prompt_others_measured"], 1) == 540.1
    assert round(pair["shift_pct"], 1) == -1.7 and round(pair["ratio_without"], 3) == 2.438
    # the verdict is the strata statistic's, as before: the pair is a note, not a decision
    assert result.details["verdict"] == "faster" and round(result.details["ratio"], 3) == 2.396
    assert ("one pair stands out (72x the window's median residual) and lowers the ratio 1.7 %: "
            "bst-insert-delete#1 at 437.8 vs 221.5 tok/s (its prompt's other pairs: 540.1 vs 221.7); "
            "2.438x without it") in said(result)
    report = {"gates": [{"gate": "backfire", "mode": "eagle3_al30", "prompt_class": "coding", "concurrency": 1,
                         "details": result.details}]}
    assert notice_lines(report) == [f"PAIR STANDS OUT in backfire [eagle3_al30-coding-c1]: {strongest_pair_text(pair)}"]


def test_windows_without_a_hiccup_name_no_pair():
    # E1: every eagle3 request at 537-542 tok/s; the draft path's wider scatter has no outlier
    assert {mode: "strongest_pair" in r.details for mode, r in backfire("E1").items()} == {
        "draft_al30": False, "eagle3_al30": False, "eagle3_al15": False}


def clean_window() -> tuple[np.ndarray, np.ndarray]:
    speed = np.repeat([1.10, 1.50, 1.02, 1.35, 0.97, 1.45], 2) * (1 + np.tile([-0.004, 0.004], 6))
    return 100.0 * speed, np.full(12, 100.0) * (1 + np.tile([0.002, -0.002], 6))


def test_a_slow_request_on_either_side_is_the_one_named():
    measured, reference = clean_window()
    assert strongest_pair(measured, reference, PROMPTS) is None
    slow_subject = measured.copy()
    slow_subject[5] *= 0.8
    found = strongest_pair(slow_subject, reference, PROMPTS)
    assert found is not None and found.index == 5 and found.shift < 0
    slow_reference = reference.copy()
    slow_reference[8] *= 0.8  # the reference's request slow: that pair's ratio is too high
    found = strongest_pair(measured, slow_reference, PROMPTS)
    assert found is not None and found.index == 8 and found.shift > 0


def test_the_ratio_without_the_pair_is_the_strata_estimate_of_the_other_pairs():
    measured, reference = clean_window()
    measured[2] *= 0.75
    found = strongest_pair(measured, reference, PROMPTS, shift=1.3)
    keep = [i for i in range(12) if i != found.index]
    without = stratified_log_ratio(np.log(measured[keep] / reference[keep]) - math.log(1.3),
                                   [PROMPTS[i] for i in keep], threshold=1.0)
    full = paired_ratio(measured, reference, threshold=1.0, shift=1.3, strata=PROMPTS)
    assert found.ratio_without == pytest.approx(without.ratio)
    assert found.shift == pytest.approx(full.ratio / without.ratio - 1)


def test_without_repeats_there_is_no_strata_estimate_to_move():
    measured, reference = clean_window()
    measured[0] *= 0.5
    assert strongest_pair(measured[::2], reference[::2], PROMPTS[::2]) is None


def test_a_backfire_window_with_a_pair_standing_out_gets_its_follow_up_rounds():
    from specgate.decide.follow_up import speed_follow_up_reason

    data = json.loads(gzip.decompress((VISIT9 / "E2" / "report.json.gz").read_bytes()))
    rig = load_rig("h200-llama8b-dummy", ROOT / "fixtures")
    windows = {m.mode: m for m in map(ClassMeasurement.from_dict, data["measurements"]) if m.partner is not None}
    reason = follow_up_text(speed_follow_up_reason(gate_settings(rig, windows["eagle3_al30"]), windows["eagle3_al30"]))
    assert reason is not None and reason.startswith("2.396x (95.0 % CI 2.296-2.501, threshold 1.00) after 12 pairs: "
                                                    "one pair stands out")
    assert "bst-insert-delete#1" in reason
    # eagle3_al15 and draft_al30 of the same session: faster beyond the margin, nothing stands out
    assert speed_follow_up_reason(gate_settings(rig, windows["eagle3_al15"]), windows["eagle3_al15"]) is None
    assert speed_follow_up_reason(gate_settings(rig, windows["draft_al30"]), windows["draft_al30"]) is None


def test_a_pair_off_a_window_of_identical_pairs_is_named_without_a_factor():
    from specgate.decide.gates import _strongest_pair

    measured, reference = [100.0] * 12, [50.0] * 12
    measured[3] = 80.0
    info = _strongest_pair(measured, reference, PROMPTS, [f"{p}#{i % 2}" for i, p in enumerate(PROMPTS)], shift=1.0)
    text = strongest_pair_text(info)
    assert info["key"] == "b#1" and "(the window's other residuals are 0)" in text and "lowers the ratio" in text
