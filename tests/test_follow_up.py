"""Follow-up rounds for a duet window whose first look leaves its backfire gate undecided, and the
repeated intervals every gate on such a window uses (specgate.decide.paired.repeated_coverage)."""

import dataclasses
import gzip
import json
from pathlib import Path

import pytest
from standins import gate_settings
from words import said

from specgate.config.rig import ClassGate, load_rig
from specgate.decide.follow_up import speed_follow_up_reason
from specgate.decide.gates import check_backfire
from specgate.decide.paired import paired_log_ratio, repeated_coverage
from specgate.measure.protocol import ClassMeasurement, Duet, Measurer
from specgate.report.verdicts import follow_up_text
from tests.test_duet_window import StandInServer

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "tests" / "data" / "calibration" / "cpu-2026-12-01b"


def real_windows(run: str) -> dict[str, ClassMeasurement]:
    """ngram's duet windows of a real fresh-clone cpu-tier run (12 pairs each, one look)."""
    data = json.loads(gzip.decompress((RUNS / f"run-{run}-report.json.gz").read_bytes()))
    return {m["prompt_class"]: ClassMeasurement.from_dict(m) for m in data["measurements"] if m["mode"] == "ngram"}


def as_first_look(m: ClassMeasurement, share: float = 0.5) -> ClassMeasurement:
    """The same window as the first look of a two-look design."""
    return dataclasses.replace(m, first_look_share=share,
                               partner=dataclasses.replace(m.partner, first_look_share=share))


def test_pocock_constant_for_two_equal_looks():
    # Jennison & Turnbull (2000), table 2.1: Pocock's C_P(2, 0.05) = 2.178.
    assert repeated_coverage(0.95, 0.5) == pytest.approx(0.97061, abs=1e-4)
    # a first look seeing almost everything is one look; a small first share costs less than Bonferroni
    assert repeated_coverage(0.95, 0.999) == pytest.approx(0.95, abs=0.002)
    assert 0.9706 < repeated_coverage(0.95, 1 / 3) < 0.975
    with pytest.raises(ValueError, match="first_share"):
        repeated_coverage(0.95, 1.0)


def test_an_interval_inside_the_margin_is_equal_even_when_it_excludes_one():
    # Run E's explanatory (cpu tier, quiet VM): 1.024 (1.010-1.037) was called "faster" where runs A
    # and B, at 0.997 and 1.001, were "equal": equivalence comes first, so a mode at break-even gets
    # the same verdict in every session.
    import numpy as np

    d = np.log([1.010, 1.024, 1.037, 1.020, 1.028, 1.016, 1.031, 1.022])
    result = paired_log_ratio(d, threshold=1.0)
    assert result.ci_low > 1.0 and result.ci_high < 1.05
    assert result.verdict == "equal"


def test_run_cs_undecided_explanatory_asks_for_a_follow_up_and_a_decided_class_does_not():
    rig = load_rig("cpu-smollm2", ROOT / "fixtures")
    run_c = real_windows("c")
    window = as_first_look(run_c["explanatory"])
    reason = follow_up_text(speed_follow_up_reason(gate_settings(rig, window), window))
    assert reason is not None and "backfire gate is undecided after 12 pairs" in reason
    assert "97.1 % CI" in reason  # the first look's repeated interval, not the one-look 95 %
    window = as_first_look(run_c["coding"])
    assert speed_follow_up_reason(gate_settings(rig, window), window) is None
    # one look (no follow-up planned): the gate keeps its 95 % and says nothing about looks
    plain = check_backfire(gate_settings(rig, run_c["coding"]), run_c["coding"], run_c["coding"].partner)
    assert plain.details["confidence"] == pytest.approx(0.95) and "look" not in said(plain)


def test_every_gate_on_a_two_look_window_uses_the_repeated_interval():
    rig = load_rig("cpu-smollm2", ROOT / "fixtures")
    m = as_first_look(real_windows("b")["coding"])
    result = check_backfire(gate_settings(rig, m), m, m.partner)
    assert result.details["confidence"] == pytest.approx(repeated_coverage(0.95, 0.5))
    assert "first look of two (repeated intervals)" in said(result)
    followed = dataclasses.replace(m, follow_up="the backfire gate is undecided")
    result = check_backfire(gate_settings(rig, followed), followed, m.partner)
    assert "second look, after follow-up rounds" in said(result)


@pytest.fixture()
def stand_in_rig():
    rig = load_rig("cpu-smollm2", ROOT / "fixtures")
    return rig.model_copy(update={"protocol": rig.protocol.model_copy(update={"warmup_requests": 0, "settle_s": 0.0}),
                                  "gates": rig.gates.model_copy(update={"client_server_tolerance": None})})


@pytest.mark.parametrize("undecided", [True, False])
def test_a_window_gets_its_follow_up_rounds_only_when_a_gate_asks(stand_in_rig, undecided):
    rig = stand_in_rig
    seen = []

    def follow_up(first_look: ClassMeasurement) -> str | None:
        seen.append((len(first_look.records), len(first_look.partner.records), first_look.first_look_share))
        return "backfire undecided (test)" if undecided else None

    coding = next(c for c in rig.prompt_classes if c.name == "extraction")  # not a declared backfire
    journal: list = []
    m = Measurer(rig, follow_up=follow_up).measure_duet(
        Duet(StandInServer("ngram", journal), StandInServer("no_spec", journal), rig.mode("ngram"),
             rig.mode("no_spec")), coding, 1)
    prompts, planned, extra = len(coding.prompts), rig.protocol.repeats, rig.protocol.backfire_follow_up_repeats
    assert extra == 8  # a backfire window's follow-up (the rig's A/B windows get follow_up_repeats)
    assert seen == [(planned * prompts, planned * prompts, planned / (planned + extra))]
    rounds = planned + extra if undecided else planned
    assert len(m.records) == len(m.partner.records) == rounds * prompts
    assert sorted(m.sample_keys) == sorted(m.partner.sample_keys)  # the follow-up is paired key by key
    assert {k.rsplit("#", 1)[1] for k in m.sample_keys} == {str(r) for r in range(rounds)}
    assert m.follow_up == m.partner.follow_up == ("backfire undecided (test)" if undecided else None)
    assert m.first_look_share == m.partner.first_look_share == planned / (planned + extra)
    again = ClassMeasurement.from_dict(json.loads(json.dumps(m.to_dict())))
    assert (again.first_look_share, again.follow_up) == (m.first_look_share, m.follow_up)


@pytest.mark.parametrize("budget_left_s", [0.0, 3600.0])
def test_the_time_budget_skips_a_follow_up_that_would_not_fit_and_the_verdict_says_so(stand_in_rig, budget_left_s):
    # --specgate-session-budget (CI on a slow VM): a follow-up expected to end after the deadline is skipped; the
    # window keeps its first look, still read with the two-look design's repeated interval, and the
    # gate's message says what was skipped and why.
    import time

    rig = stand_in_rig
    coding = next(c for c in rig.prompt_classes if c.name == "extraction")  # not a declared backfire
    journal: list = []
    progress: list[str] = []
    m = Measurer(rig, follow_up=lambda first: "backfire undecided (test)", progress=progress.append,
                 deadline=time.monotonic() + budget_left_s).measure_duet(
        Duet(StandInServer("ngram", journal), StandInServer("no_spec", journal), rig.mode("ngram"),
             rig.mode("no_spec")), coding, 1)
    planned, extra = rig.protocol.repeats, rig.protocol.backfire_follow_up_repeats
    if budget_left_s:
        assert len(m.records) == (planned + extra) * len(coding.prompts) and m.follow_up_skipped is None
        return
    assert len(m.records) == len(m.partner.records) == planned * len(coding.prompts)
    assert m.follow_up is None and m.first_look_share == planned / (planned + extra)
    assert m.follow_up_skipped.startswith(f"its {extra} round(s) would take ~")
    assert "the session's time budget (--specgate-session-budget) has 0s left" in m.follow_up_skipped
    assert any("follow-up skipped" in line and "backfire undecided (test)" in line for line in progress)
    message = said(check_backfire(gate_settings(rig, m), m, m.partner))
    assert "first look of two (repeated intervals); its follow-up was skipped: its 8 round(s)" in message
    again = ClassMeasurement.from_dict(json.loads(json.dumps(m.to_dict())))
    assert again.follow_up_skipped == m.follow_up_skipped


def test_without_a_follow_up_rule_a_window_has_one_look(stand_in_rig):
    rig = stand_in_rig
    coding = next(c for c in rig.prompt_classes if c.name == "coding")
    journal: list = []
    m = Measurer(rig).measure_duet(Duet(StandInServer("ngram", journal), StandInServer("no_spec", journal),
                                        rig.mode("ngram"), rig.mode("no_spec")), coding, 1)
    assert m.first_look_share is None and len(m.records) == rig.protocol.repeats * len(coding.prompts)


def test_a_declared_backfire_window_takes_no_follow_up_and_has_one_look(stand_in_rig):
    # its verdict is reported and never fails: 8 more rounds (~7 minutes a window on the cpu rig)
    # would sharpen its words, not decide a gate, so it is one look at the usual 95 %
    rig = stand_in_rig
    assert rig.declared_backfire_for("ngram", "coding") is not None
    assert rig.follow_up_rounds("ngram", "coding", backfire=True) == 0
    assert rig.follow_up_rounds("ngram", "extraction", backfire=True) == 8
    assert rig.follow_up_rounds("ngram", "coding", backfire=False) == 8  # an A/B window is gated: it keeps them
    coding = next(c for c in rig.prompt_classes if c.name == "coding")
    asked: list = []
    m = Measurer(rig, follow_up=lambda first: asked.append(first) or "undecided (test)").measure_duet(
        Duet(StandInServer("ngram", []), StandInServer("no_spec", []), rig.mode("ngram"), rig.mode("no_spec")), coding,
        1)
    assert asked == [] and m.follow_up is None and m.first_look_share is None
    assert len(m.records) == rig.protocol.repeats * len(coding.prompts)
    result = check_backfire(gate_settings(rig, m), m, m.partner)
    assert result.details["confidence"] == pytest.approx(0.95) and "look" not in said(result)


def test_an_ab_window_follows_up_on_its_throughput_gate():
    # An A/B window's partner is the same mode on the reference side; its gate is the throughput
    # ratio against 1 - ab_tolerance. Run C's explanatory pairs read as such a window (the
    # two sides' pairs are real; which build they came from does not matter to the rule).
    rig = load_rig("cpu-smollm2", ROOT / "fixtures")
    m = as_first_look(real_windows("c")["explanatory"])
    m = dataclasses.replace(m, partner=dataclasses.replace(m.partner, role="partner", ab_side="reference", mode=m.mode))
    strict = rig.model_copy(update={"gates": rig.gates.model_copy(update={"ab_tolerance": 0.0})})
    reason = follow_up_text(speed_follow_up_reason(gate_settings(strict, m), m))
    assert reason is not None and reason.startswith("the throughput gate is undecided after 12 pairs")
    assert speed_follow_up_reason(gate_settings(rig, m), m) is None  # at the rig's 3 % it is decided at the first look


def test_an_ab_window_gets_the_ab_follow_up_rounds(stand_in_rig):
    # The A/B windows get follow_up_repeats, not the backfire windows' own setting: the stand-in
    # rig's two settings are made to differ (the cpu rig ships 8 for both) so the test tells them apart.
    rig = stand_in_rig.model_copy(update={"protocol": stand_in_rig.protocol.model_copy(
        update={"follow_up_repeats": 3, "backfire_follow_up_repeats": 5})})
    assert rig.protocol.follow_up_rounds(backfire=False) == 3 and rig.protocol.follow_up_rounds(backfire=True) == 5
    coding = next(c for c in rig.prompt_classes if c.name == "coding")
    journal: list = []
    m = Measurer(rig, follow_up=lambda first: "undecided (test)").measure_duet(
        Duet(StandInServer("ngram", journal), StandInServer("ngram", journal), rig.mode("ngram"), rig.mode("ngram"),
             ab=True), coding, 1)
    planned, extra = rig.protocol.repeats, rig.protocol.follow_up_repeats
    assert extra == 3 and m.first_look_share == planned / (planned + extra)
    assert len(m.records) == (planned + extra) * len(coding.prompts)


RUNS_D = ROOT / "tests" / "data" / "calibration" / "cpu-2026-12-01d"


def run_k_window(prompt_class: str, share: float) -> ClassMeasurement:
    data = json.loads(gzip.decompress((RUNS_D / "run-k-report.json.gz").read_bytes()))
    m = next(ClassMeasurement.from_dict(d) for d in data["measurements"]
             if d["mode"] == "ngram" and d["prompt_class"] == prompt_class)
    return dataclasses.replace(as_first_look(m, share), follow_up=None,
                               partner=dataclasses.replace(as_first_look(m, share).partner, follow_up=None))


def test_a_faster_first_look_reaching_into_the_margin_is_followed_up():
    # Run K (fresh clone, the shipped rig then): explanatory's 24 pairs said "faster", 1.028
    # (1.006-1.051), where runs F, G, H and J said "equal". Read as the first look of the rig's
    # backfire design now (share 2/10, 97.3 % intervals), those pairs are "faster" with a lower end
    # inside the ±5 % margin: not settled, so they get their follow-up rounds.
    rig = load_rig("cpu-smollm2", ROOT / "fixtures")
    share = rig.protocol.repeats / (rig.protocol.repeats + rig.protocol.backfire_follow_up_repeats)
    explanatory = run_k_window("explanatory", share)
    details = check_backfire(gate_settings(rig, explanatory), explanatory, explanatory.partner).details
    assert details["verdict"] == "faster" and 1.0 < details["ci_low"] < 1.05
    assert details["confidence"] == pytest.approx(repeated_coverage(0.95, 0.2))
    reason = follow_up_text(speed_follow_up_reason(gate_settings(rig, explanatory), explanatory))
    assert reason is not None and "reaches into the equivalence margin (±5 %)" in reason
    assert reason.endswith("after 24 pairs reaches into the equivalence margin (±5 %): "
                           "1.028x (97.3 % CI 1.005-1.051, threshold 1.00)")
    # coding, 1.200 (1.16-1.24): faster beyond the margin, settled
    coding = run_k_window("coding", share)
    assert check_backfire(gate_settings(rig, coding), coding, coding.partner).details["ci_low"] > 1.05
    assert speed_follow_up_reason(gate_settings(rig, coding), coding) is None


def test_a_slower_first_look_inside_the_margin_is_followed_up_too():
    # Run U (fresh-clone .ci/run on an Intel Xeon 2-vCPU VM, stop 30): explanatory's 12 pairs said
    # "slower", 0.975 (0.956-0.995), where runs L-S (another VM) said "equal". Estimate and upper end
    # inside the ±5 % margin: a break-even, not settled, as a "faster" there would not be.
    rig = load_rig("cpu-smollm2", ROOT / "fixtures")
    data = json.loads(gzip.decompress((ROOT / "tests/data/calibration/cpu-2026-12-02d/run-u-report.json.gz"
                                       ).read_bytes()))
    window = next(ClassMeasurement.from_dict(d) for d in data["measurements"]
                  if d["mode"] == "ngram" and d["prompt_class"] == "explanatory")
    assert window.first_look_share == pytest.approx(0.2) and window.follow_up is None
    details = check_backfire(gate_settings(rig, window), window, window.partner).details
    assert details["verdict"] == "slower" and 0.95 < details["ci_high"] < 1.0
    reason = follow_up_text(speed_follow_up_reason(gate_settings(rig, window), window))
    assert reason == ("the backfire gate's 'slower' after 12 pairs reaches into the equivalence margin (±5 %): "
                      "0.975x (97.3 % CI 0.956-0.995, threshold 1.00)")


def test_an_ab_window_follows_up_only_when_undecided():
    # The A/B rule is the one the calibration measured: only "undecided" follows up. Run K's
    # explanatory pairs read as an A/B window (threshold 0.97) are "not slower",
    # which a backfire window would follow up and an A/B window does not.
    rig = load_rig("cpu-smollm2", ROOT / "fixtures")
    m = run_k_window("explanatory", 0.5)
    m = dataclasses.replace(m, partner=dataclasses.replace(m.partner, role="partner", ab_side="reference", mode=m.mode))
    from specgate.decide.gates import ab_throughput

    assert ab_throughput(gate_settings(rig, m), m).details["verdict"] == "not slower"
    assert speed_follow_up_reason(gate_settings(rig, m), m) is None


@pytest.mark.parametrize(("verdict", "ratio", "low", "high", "unsettled"), [
    ("faster", 1.028, 1.005, 1.051, True),   # run K's explanatory: narrower, it may read "equal within ±x %"
    ("faster", 1.072, 1.030, 1.110, False),  # an estimate above the margin stays "faster" with more pairs
    ("faster", 1.200, 1.160, 1.240, False),  # clearly faster
    ("slower", 0.975, 0.956, 0.995, True),   # run U's explanatory
    ("slower", 0.940, 0.920, 0.960, False),  # an estimate below the margin stays "slower"
    ("slower", 0.960, 0.930, 0.949, False),  # the whole interval below it
    ("equal", 1.010, 0.990, 1.030, False),
])
def test_only_a_faster_or_slower_inside_the_margin_reaches_into_it(verdict, ratio, low, high, unsettled):
    from specgate.decide.follow_up import reaches_into_margin

    details = {"verdict": verdict, "ratio": ratio, "ci_low": low, "ci_high": high}
    assert reaches_into_margin(details, 0.05) is unsettled


def test_the_ab_gate_decides_at_its_own_tolerance():
    # ab_tolerance sets the A/B gate's threshold (0.97 on the cpu rig); the stored-ratio and level
    # gates keep throughput_tolerance (0.96); without ab_tolerance the A/B gate uses that too.
    from specgate.decide.gates import ab_throughput

    rig = load_rig("cpu-smollm2", ROOT / "fixtures")
    m = run_k_window("explanatory", 0.5)
    m = dataclasses.replace(m, partner=dataclasses.replace(m.partner, role="partner", ab_side="reference", mode=m.mode))
    assert (rig.gates.ab_tolerance, rig.gates.throughput_tolerance) == (0.03, 0.04)
    assert ab_throughput(gate_settings(rig, m), m).details["threshold"] == pytest.approx(0.97)
    unset = rig.model_copy(update={"gates": rig.gates.model_copy(update={"ab_tolerance": None})})
    assert ab_throughput(gate_settings(unset, m), m).details["threshold"] == pytest.approx(0.96)
    per_class = rig.model_copy(update={"gates": rig.gates.model_copy(update={
        "classes": {"explanatory": ClassGate(ab_tolerance=0.10)}})})
    assert ab_throughput(gate_settings(per_class, m), m).details["threshold"] == pytest.approx(0.90)


def test_a_window_whose_ttft_is_undecided_follows_up_when_its_ttft_gate_is_selected():
    # Issue 52: TTFT decides like speed. Run B's coding window: its backfire verdict is settled at the
    # first look, its TTFT (ngram against no speculation, 12 pairs: 1.161x, 0.843-1.601) is not; the
    # rounds go to a gate the session decides, so a selection without the TTFT gate takes none for it.
    from specgate.decide.follow_up import follow_up_reason
    from specgate.decide.gates import check_ttft

    rig = load_rig("cpu-smollm2", ROOT / "fixtures")
    m = as_first_look(real_windows("b")["coding"])
    assert speed_follow_up_reason(gate_settings(rig, m), m) is None
    assert check_ttft(gate_settings(rig, m), m, m.partner).outcome.value == "undecided"
    reason = follow_up_text(follow_up_reason(gate_settings(rig, m), m, {"backfire", "ttft"}))
    assert reason is not None and reason.startswith("the ttft gate is undecided after the first look: ngram on coding")
    assert follow_up_reason(gate_settings(rig, m), m, {"backfire", "throughput"}) is None


def test_a_ttft_pass_needs_12_pairs():
    from specgate.decide.gates import TTFT_MIN_PAIRS_TO_PASS, check_ttft
    from specgate.decide.outcome import Outcome

    rig = load_rig("cpu-smollm2", ROOT / "fixtures")
    m = real_windows("c")["coding"]
    # an A/A: the same requests on both sides
    same = dataclasses.replace(m.partner, mode=m.mode, role="partner", ab_side="reference")
    window = dataclasses.replace(same, role="subject", ab_side="candidate", partner=same)
    assert check_ttft(gate_settings(rig, window), window, same).outcome is Outcome.PASS  # 12 pairs, equal
    short = dataclasses.replace(window, records=window.records[:TTFT_MIN_PAIRS_TO_PASS - 2])
    result = check_ttft(gate_settings(rig, short), short, same)
    assert result.outcome is Outcome.UNDECIDED and "a pass needs 12 pairs and this window has 10" in said(result)
