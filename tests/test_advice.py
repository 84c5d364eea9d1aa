"""Issue 54: config advice. From a run's report, the tok/s ratio against no speculation each mode would
reach at every k up to the served one (AL(k) / c(k)), on recorded reports, and the seed case from its
published figures."""

import copy
import gzip
import json
import math
import re
from pathlib import Path

import pytest

from specgate.advise.advice import (
    BOUNDS,
    CONSTANT,
    FITTED,
    LINEAR,
    AdviceError,
    Span,
    advice_text,
    advise_report,
    seed_advice,
)
from specgate.decide.stats import wilson_interval

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent
CPU_REPORT = ROOT / "fixtures" / "recorded" / "cpu" / "reports" / "run2-plain.json.gz"
GPU_REPORT = ROOT / "fixtures" / "recorded" / "gpu" / "reports" / "run2-plain.json.gz"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _load(path: Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


@pytest.fixture(scope="module")
def cpu_report() -> dict:
    return _load(CPU_REPORT)


def _window(advice, mode, prompt_class):
    return next(w for w in advice.windows if (w.mode, w.prompt_class) == (mode, prompt_class))


def _backfire(report, mode, prompt_class):
    return next(g["details"] for g in report["gates"]
                if (g["gate"], g["mode"], g["prompt_class"]) == ("backfire", mode, prompt_class))


def test_acceptance_length_at_every_k_is_one_plus_the_position_shares(cpu_report):
    advice = advise_report(cpu_report, source=str(CPU_REPORT))
    coding = _window(advice, "ngram", "coding")
    # the recorded coding window: 13 drafts, accepted at positions 1..5: 10, 9, 7, 7, 3
    assert [r.acceptance_length.value for r in coding.rows] == pytest.approx(
        [1 + 10 / 13, 1 + 19 / 13, 1 + 26 / 13, 1 + 33 / 13, 1 + 36 / 13])
    for w in advice.windows:  # AL at the served k is vLLM's mean acceptance length of the window
        m = next(m for m in cpu_report["measurements"] if (m["mode"], m["prompt_class"]) == (w.mode, w.prompt_class))
        assert w.rows[-1].acceptance_length.value == pytest.approx(m["acceptance"]["mean_acceptance_length"])
        assert w.served_k == 5 and w.models == BOUNDS


def test_the_prediction_at_the_served_k_is_the_measured_ratio(cpu_report):
    advice = advise_report(cpu_report, source=str(CPU_REPORT))
    assert len(advice.windows) == 6
    for w in advice.windows:
        gate = _backfire(cpu_report, w.mode, w.prompt_class)
        served = w.rows[-1]
        assert served.measured and served.k == 5
        for model in BOUNDS:
            ratio = served.predictions[model].ratio
            assert (ratio.value, ratio.low, ratio.high) == (gate["ratio"], gate["ci_low"], gate["ci_high"])
        al = served.acceptance_length.value
        assert (w.served_cost.value, w.served_cost.low, w.served_cost.high) == pytest.approx(
            (al / gate["ratio"], al / gate["ci_high"], al / gate["ci_low"]))  # c(K) = AL(K) / R


def test_the_two_bounds_by_hand_at_k_1(cpu_report):
    """coding, k=1: k-independent c(1) = c(5); linear c(1) = 1 + (c(5) - 1) / 5; ratio = AL(1) / c(1).
    The low end of the k-independent ratio is R's low end times the low end of AL(1) / AL(5), the
    positions' Wilson intervals at 1 - 0.05 / 5 each."""
    coding = _window(advise_report(cpu_report), "ngram", "coding")
    r = _backfire(cpu_report, "ngram", "coding")
    al1, al5 = 1 + 10 / 13, 1 + 36 / 13
    c5 = al5 / r["ratio"]
    row = coding.rows[0]
    assert row.predictions[CONSTANT].cost.value == pytest.approx(c5)
    assert row.predictions[CONSTANT].ratio.value == pytest.approx(al1 / c5)
    assert row.predictions[LINEAR].cost.value == pytest.approx(1 + (c5 - 1) / 5)
    assert row.predictions[LINEAR].ratio.value == pytest.approx(al1 / (1 + (c5 - 1) / 5))
    bounds = [wilson_interval(a, 13, 0.99) for a in (10, 9, 7, 7, 3)]
    kept_low = (1 + bounds[0][0]) / (1 + bounds[0][0] + sum(hi for _, hi in bounds[1:]))
    assert row.predictions[CONSTANT].ratio.low == pytest.approx(kept_low * r["ci_low"])
    # at the recorded figures the two bounds disagree: 0.49x (slower) against 1.16x (faster)
    assert row.predictions[CONSTANT].ratio.value < 1 < row.predictions[LINEAR].ratio.value
    assert 1 in coding.flips()


def test_a_flip_is_an_acceptance_length_between_the_two_break_even_lengths(cpu_report):
    advice = advise_report(cpu_report)
    flipped = 0
    for w in advice.windows:
        assert w.best(CONSTANT).k == w.served_k  # AL only falls with k: a k-independent cost favours the served k
        for row in w.rows:
            al = row.acceptance_length.value
            low, high = sorted(row.predictions[m].cost.value for m in BOUNDS)
            assert (row.k in w.flips()) == (low < al < high)
            flipped += row.k in w.flips()
    assert flipped > 0
    # extraction (AL(5) 4.63): every k is predicted faster under both bounds but k=1
    extraction = _window(advice, "ngram", "extraction")
    assert extraction.flips() == [1] and extraction.beating(LINEAR, sure=True) == [1, 2, 3, 4, 5]


def _with_a_second_k(report: dict, ratio_k2: float) -> dict:
    """The cpu report plus a mode ngram_k2 (k=2, prompt_lookup_max 3) on coding whose drafts accepted what
    ngram's first two positions did, measured at ``ratio_k2`` (+-10 %)."""
    out = copy.deepcopy(report)
    out["rig"]["modes"]["ngram_k2"] = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}
    ngram = next(m for m in out["measurements"] if (m["mode"], m["prompt_class"]) == ("ngram", "coding"))
    k2 = {**copy.deepcopy(ngram), "mode": "ngram_k2"}
    k2["acceptance"] = {"drafts": 13.0, "draft_tokens": 26.0, "accepted_tokens": 19.0,
                        "accepted_per_position": [10.0, 9.0]}
    out["measurements"].append(k2)
    out["gates"].append({"gate": "backfire", "mode": "ngram_k2", "prompt_class": "coding", "concurrency": 1,
                         "passed": True, "details": {"ratio": ratio_k2, "ci_low": ratio_k2 * 0.9,
                                                     "ci_high": ratio_k2 * 1.1}})
    return out


def test_step_costs_measured_at_two_k_are_fitted(cpu_report):
    al2 = 1 + 19 / 13
    c2 = 1.9
    advice = advise_report(_with_a_second_k(cpu_report, al2 / c2))
    ngram, k2 = _window(advice, "ngram", "coding"), _window(advice, "ngram_k2", "coding")
    assert ngram.models == k2.models == (FITTED,)
    assert ngram.fit is not None
    c5 = ngram.served_cost.value
    # two points: the line goes through both
    assert ngram.fit.at(2).value == pytest.approx(c2) and ngram.fit.at(5).value == pytest.approx(c5)
    assert ngram.fit.slope == pytest.approx((c5 - c2) / 3)
    # ngram's prediction at k=2 is what ngram_k2 measured (same drafts, the fitted cost at 2 is its own)
    assert ngram.rows[1].predictions[FITTED].ratio.value == pytest.approx(al2 / c2)
    assert ngram.rows[1].predictions[FITTED].cost.value == pytest.approx(c2)
    # classes measured at one k keep the two bounds
    assert _window(advice, "ngram", "math").models == BOUNDS
    text = advice_text(advice)
    assert "fitted c(k) = " in text and "c(2) = 1.90" in text
    assert "ranking, coding / concurrency 1" in text


def test_several_modes_are_ranked_per_class_measured_and_predicted_apart():
    report = _load(GPU_REPORT)  # ngram k=5, draft_l6 and draft_self k=3
    advice = advise_report(report, source=str(GPU_REPORT))
    ranking = advice.ranking()
    assert [w.mode for w in ranking[("coding", 1)]] == ["draft_self", "ngram", "draft_l6"]  # 1.566, 1.319, 0.658
    text = advice_text(advice)
    assert ("  1. draft_self (draft_model, served k=3): measured 1.566x (1.235-1.733); best k-independent cost: "
            "k=3 1.57x (1.23-1.73) measured; cost linear from k=0: k=3 1.57x (1.23-1.73) measured") in text
    assert "  2. ngram (ngram, served k=5): measured 1.319x (1.244-1.893); best k-independent cost: k=5" in text
    assert "cost linear from k=0: k=2 1.49x (1.02-2.21) predicted" in text
    draft_l6 = _window(advice, "draft_l6", "coding")
    assert draft_l6.beating(LINEAR, sure=False) == [] and draft_l6.flips() == []  # slower at every k, both bounds


def test_advise_prints_the_table_and_writes_the_png(tmp_path, capsys):
    from specgate.cli import main

    code = main(["advise", "--rig", "cpu-smollm2", "--report", str(CPU_REPORT), "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    assert "ngram / coding / concurrency 1 (ngram, served k=5): measured 1.047x (0.893-1.537)" in out
    assert "c(k) const" in out and "ratio linear" in out and "flips between the bounds" in out
    png = tmp_path / "advice.png"
    assert f"plot: {png}" in out
    assert png.read_bytes()[:8] == PNG_MAGIC


def _drop(report: dict, what: str) -> dict:
    out = copy.deepcopy(report)
    if what == "speculative":
        out["rig"]["modes"] = {"no_spec": None}
        out["measurements"] = [m for m in out["measurements"] if m["mode"] == "no_spec"]
    elif what == "no_spec":
        out["measurements"] = [m for m in out["measurements"] if m["mode"] != "no_spec"]
    else:
        for m in out["measurements"]:
            if m.get("acceptance"):
                m["acceptance"]["accepted_per_position"] = []
    return out


@pytest.mark.parametrize(("what", "key"), [
    ("speculative", "rig.modes / measurements: no speculative mode"),
    ("no_spec", "measurements: no window of the reference mode 'no_spec'"),
    ("counters", "measurements[].acceptance.accepted_per_position: no speculative window has per-position"),
])
def test_a_report_advice_cannot_come_from_exits_4_naming_file_and_key(cpu_report, tmp_path, capsys, what, key):
    from specgate.cli import main

    path = tmp_path / "report.json"
    path.write_text(json.dumps(_drop(cpu_report, what)))
    assert main(["advise", "--rig", "cpu-smollm2", "--report", str(path), "--out", str(tmp_path)]) == 4
    err = capsys.readouterr().err
    assert f"specgate: {path}: {key}" in err
    assert not (tmp_path / "advice.png").exists()
    with pytest.raises(AdviceError, match=re.escape(key)):
        advise_report(_drop(cpu_report, what), source=str(path))


def test_a_missing_report_exits_4_naming_it(tmp_path, capsys):
    from specgate.cli import main

    missing = tmp_path / "nowhere.json.gz"
    assert main(["advise", "--rig", "cpu-smollm2", "--report", str(missing)]) == 4
    assert f"specgate: {missing}: cannot read the report" in capsys.readouterr().err


def test_the_seed_case_cannot_say_whether_a_smaller_k_beats_no_speculation():
    """ngram k=5 on Kimi-K2.5: measured 9-26 % slower, AL(5) 1.86-2.55 and position 1 40-56 %, position 5
    4-13 % over every prompt (none per class). Coding (46.4 / 62.6 tok/s) at k=1: under a k-independent
    cost R x AL(1) / AL(5), under a cost linear from k=0 AL(1) / (1 + (AL(5) / R - 1) / 5), each at its
    extremes; the two ranges lie on both sides of 1."""
    seed = seed_advice()
    coding = next(c for c in seed.classes if c.prompt_class == "coding")
    r = 46.4 / 62.6
    assert coding.measured_ratio == pytest.approx(r)
    assert coding.served_cost.low == pytest.approx(1.86 / r) and round(coding.served_cost.low, 2) == 2.51
    const, linear = coding.predictions[(CONSTANT, 1)], coding.predictions[(LINEAR, 1)]
    assert (const.low, const.high) == pytest.approx((r * 1.40 / 2.55, r * 1.56 / 1.86), abs=1e-6)
    assert (linear.low, linear.high) == pytest.approx(
        (1.40 / (1 + (2.55 / r - 1) / 5), 1.56 / (1 + (1.86 / r - 1) / 5)), abs=1e-6)
    assert const.high < 1 < linear.high  # 0.41-0.62x against 0.94-1.20x
    assert (round(const.low, 2), round(const.high, 2), round(linear.low, 2), round(linear.high, 2)) == \
        (0.41, 0.62, 0.94, 1.2)
    assert not seed.decides_small_k and all(1 in c.flips() for c in seed.classes)
    # under a k-independent cost no k below 5 beats no speculation on any class; k=5 is measured slower
    assert all(c.predictions[(CONSTANT, k)].high < 1 for c in seed.classes for k in range(1, 5))
    assert all(c.measured_ratio < 1 for c in seed.classes)
    # positions 2-4 were not published: AL(2) only within 1.40 + 2 x 0.04 ... 1 + 2 x 0.56
    assert seed.classes[0].acceptance_length[2].text() == "1.52-2.12"
    conclusion = "\n".join(seed.conclusion)
    assert "cannot conclude: whether a smaller k beats no speculation" in conclusion
    assert "at a second k with the same prompt_lookup_max 4" in conclusion


def test_advise_seed_from_the_command_line(tmp_path, capsys, monkeypatch):
    import specgate.advise.advice
    from specgate.cli import main

    drawn = []
    monkeypatch.setattr(specgate.advise.advice, "plot_seed", lambda seed, path: drawn.append(path) or path)
    assert main(["advise", "--seed", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "coding: measured 0.741x at k=5, c(5) = 2.51-3.44 plain steps" in out
    assert "1    1.40-1.56  2.51-3.44     0.41-0.62x slower  1.30-1.49      0.94-1.20x undecided" in out
    assert drawn == [tmp_path / "advice-seed.png"]
    assert main(["advise", "--seed", "--rig", "cpu-smollm2"]) == 4  # the seed's figures are the seed rig's


def test_spans_read_against_no_speculation():
    assert Span(1.2, 1.05, 1.3).verdict == "faster" and Span(0.9, 0.8, 0.95).verdict == "slower"
    assert Span(1.0, 0.9, 1.1).verdict == "undecided"
    assert Span(None, 0.41, 0.62).text(2, "x") == "0.41-0.62x"
    assert Span(1.047, 0.893, 1.537).text(3, "x") == "1.047x (0.893-1.537)"
    assert Span(2.0, 1.0, math.inf).text() == "2.00 (1.00-inf)"
