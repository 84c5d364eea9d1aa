"""specgate.decide.gates: each gate function on small hand-made windows, its outcome and the figures behind
it (``details``). The statistics themselves are tested in test_paired.py, test_stats.py and
test_paired_acceptance.py; the gates on recorded windows in test_duet_window.py, test_ttft.py,
test_histories.py and test_follow_up.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from standins import gate_settings, window_side
from words import said

from specgate.config.rig import AB, DeclaredBackfire, Gates, load_rig
from specgate.decide.gates import (
    Comparison,
    Rule,
    ab_acceptance,
    ab_throughput,
    backfire_decision,
    bare_window,
    check_acceptance,
    check_backfire,
    check_lossless,
    check_throughput,
    check_ttft,
    ratio_result,
    stored_start_histories,
    window_confidence,
)
from specgate.decide.matching import Samples
from specgate.decide.outcome import Outcome
from specgate.decide.settings import window_settings
from specgate.measure.client import RequestRecord
from specgate.measure.metrics import AcceptanceStats
from specgate.measure.protocol import ClassMeasurement
from specgate.report.verdicts import change_text
from specgate.store.baselines import SCHEMA_VERSION, AcceptanceEntry, BaselineEntry, BaselineFile, StoredStart

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent
TOKENS = 64
# one prompt's decode rates, each a little off the last: a real interval, not a point
WOBBLE = [1.0, 1.012, 0.991, 1.006, 0.996, 1.009, 0.994, 1.003, 0.998, 1.011, 0.989, 1.001]


def _record(mode: str, key: str, rate: float | None, *, ttft: float = 0.2, text: str = "out") -> RequestRecord:
    """One request of ``mode`` on coding: ``rate`` decode tok/s (None: every token in one chunk)."""
    first = 1.0 + ttft
    last = first + (TOKENS - 1) / rate if rate else first
    return RequestRecord(request_id=f"{mode}/coding/{key}", mode=mode, prompt_class="coding",
                         prompt_id=key.split("#")[0], concurrency=1, started_at=1.0, first_token_at=first,
                         last_token_at=last, finished_at=last, chunk_times=[first, last], prompt_tokens=10,
                         completion_tokens=TOKENS, text=text, finish_reason="length")


def _window(mode: str, rates: list[float | None], *, side: str = "subject", prompts: int = 6,
            texts: list[str] | None = None, ttfts: list[float] | None = None) -> ClassMeasurement:
    """A coding window of ``mode``: request i is prompt p{i % prompts}, repeat i // prompts."""
    records = [_record(mode, f"p{i % prompts}#{i // prompts}", rate, text=texts[i] if texts else "out",
                       ttft=ttfts[i] if ttfts else 0.2) for i, rate in enumerate(rates)]
    return ClassMeasurement(rig="cpu-smollm2", mode=mode, prompt_class="coding", concurrency=1, records=records,
                            acceptance=None, server_decode_tokens_per_s=None, server_metric_source=None,
                            wall_s=1.0, arrangement="duet" if side != "subject" else "solo", **window_side(side))


def _rates(level: float, n: int = 12) -> list[float]:
    return [level * w for w in WOBBLE[:n]]


@pytest.fixture(scope="module")
def rig():
    """The cpu rig with [gates] at their defaults: no start noise, 5 % tolerances, min_speedup 1."""
    return load_rig("cpu-smollm2", ROOT / "fixtures").model_copy(update={"gates": Gates()})


def _with_gates(rig, **update):
    return rig.model_copy(update={"gates": rig.gates.model_copy(update=update)})


def _stored(level: float, n: int = 12) -> BaselineEntry:
    """Stored samples of a window of ``n`` requests, keyed as _window keys them."""
    samples = _rates(level, n)
    return BaselineEntry(decode_tokens_per_s=samples, sample_keys=[f"p{i % 6}#{i // 6}" for i in range(n)],
                         median=sorted(samples)[n // 2], mad=0.1, n=n)


# -- ratio_result: one paired comparison, one result ---------------------------------------------
def _comparison(m: ClassMeasurement, samples: Samples, **kw) -> Comparison:
    return Comparison(m, "throughput", samples, Rule(threshold=0.95, confidence=0.95, margin=0.05),
                      reference_label="stand-in reference", compared="hand-made", **kw)


def test_ratio_result_is_undecided_when_the_two_sides_have_different_counts():
    m = _window("ngram", _rates(30.0))
    result = ratio_result(_comparison(m, Samples(_rates(30.0, 12), _rates(30.0, 7), paired=False)))
    assert result.outcome is Outcome.UNDECIDED and not result.passed
    assert result.details["undecided"] and result.details["compared"] == "hand-made"
    assert "(12 vs 7 timed requests" in said(result)


def test_ratio_result_decides_on_the_rule_and_names_a_failure_by_its_change():
    m = _window("ngram", _rates(30.0))
    same = ratio_result(_comparison(m, Samples(_rates(30.0), _rates(30.0)[::-1], paired=True),
                                    head="history"))
    assert same.outcome is Outcome.PASS
    assert same.details["threshold"] == 0.95 and same.details["n"] == 12
    assert same.details["reference_label"] == "stand-in reference"
    assert said(same).startswith("ngram on coding (concurrency 1): ")  # the subject, not the fail phrase
    slower = ratio_result(_comparison(m, Samples(_rates(21.0), _rates(30.0)[::-1], paired=True),
                                      head="history"))
    assert slower.outcome is Outcome.FAIL
    assert slower.details["ratio"] == pytest.approx(0.7, abs=0.02) and slower.details["ci_high"] < 0.95
    assert said(slower).startswith(f"ngram is {change_text(slower.details['ratio'])} than its history on coding: ")
    # a stored ratio as the shift: 0.7x against a stored 0.7x is no change
    shifted = ratio_result(_comparison(m, Samples(_rates(21.0), _rates(30.0)[::-1], paired=True), shift=0.7))
    assert shifted.outcome is Outcome.PASS and shifted.details["ratio"] == pytest.approx(1.0, abs=0.02)


# -- throughput ------------------------------------------------------------------------------------
def test_check_throughput_against_an_ab_partner_is_the_ab_gate(rig):
    ab_rig = rig.model_copy(update={"ab": AB()})
    m = _window("ngram", _rates(28.0))
    m.partner = _window("ngram", _rates(30.0)[::-1], side="reference")
    stored_elsewhere = _stored(100.0)  # never read: an A/B compares its two live sides
    routed = check_throughput(gate_settings(ab_rig, m), m, stored_elsewhere)
    direct = ab_throughput(gate_settings(ab_rig, m), m)
    assert routed.to_dict() == direct.to_dict()
    assert "start_pair" in routed.details and routed.details["reference_label"] == "the reference side"


def test_check_throughput_against_stored_samples_decides_on_the_level(rig):
    m = _window("no_spec", _rates(30.0))
    same = check_throughput(gate_settings(rig, m), m, _stored(30.0))
    assert same.outcome is Outcome.PASS and same.gate == "throughput"
    assert same.details["reference_label"] == "stored level"
    assert same.details["threshold"] == pytest.approx(1 - rig.gates.level_gate_tolerance)
    slower = check_throughput(gate_settings(rig, m), m, _stored(40.0))
    assert slower.outcome is Outcome.FAIL and slower.details["ratio"] == pytest.approx(0.75, abs=0.02)


def test_ab_throughput_holds_the_ratio_against_the_ab_tolerance(rig):
    ab_rig = _with_gates(rig.model_copy(update={"ab": AB()}), throughput_tolerance=0.2, ab_tolerance=0.03)
    reference = _window("ngram", _rates(30.0)[::-1], side="reference")
    twin = _window("ngram", _rates(30.0))
    twin.partner = reference
    assert ab_throughput(gate_settings(ab_rig, twin), twin).outcome is Outcome.PASS
    slower = _window("ngram", _rates(27.0))  # 10 %: within throughput_tolerance, beyond ab_tolerance
    slower.partner = reference
    result = ab_throughput(gate_settings(ab_rig, slower), slower)
    assert result.outcome is Outcome.FAIL
    assert result.details["threshold"] == pytest.approx(0.97) and result.details["ratio"] == pytest.approx(0.9, 0.02)


def test_an_ab_gate_needs_the_reference_side_as_partner(rig):
    m = _window("ngram", _rates(30.0))
    with pytest.raises(AssertionError, match="reference side"):
        ab_throughput(gate_settings(rig, m), m)


# -- acceptance ------------------------------------------------------------------------------------
def _accepting(mode: str, drafts: float, per_position: list[float], *, side: str = "subject",
               chunks: list[int] | None = None, prompts: int = 6) -> ClassMeasurement:
    """A window of ``mode`` with vLLM's acceptance counters; ``chunks``: each request's stream chunks."""
    m = _window(mode, _rates(30.0, len(chunks) if chunks else 6), side=side, prompts=prompts)
    for record, c in zip(m.records, chunks or []):
        record.chunk_times = [1.2 + 0.01 * i for i in range(c)]
        record.first_token_at, record.last_token_at = record.chunk_times[0], record.chunk_times[-1]
    m.acceptance = AcceptanceStats(drafts=drafts, draft_tokens=drafts * len(per_position),
                                   accepted_tokens=sum(per_position), accepted_per_position=tuple(per_position))
    return m


def _stored_acceptance(drafts: float, per_position: list[float]) -> BaselineEntry:
    k = len(per_position)
    return _stored(30.0).model_copy(update={"acceptance": AcceptanceEntry(
        mean_acceptance_length=1 + sum(per_position) / drafts, acceptance_rate=sum(per_position) / (drafts * k),
        per_position_rates=[a / drafts for a in per_position], drafts=drafts, draft_tokens=drafts * k,
        accepted_per_position=list(per_position))})


def test_check_acceptance_is_one_decision_over_the_rate_and_each_position(rig):
    m = _accepting("ngram", 50_000, [40_000, 30_000, 20_000])
    same = check_acceptance(gate_settings(rig, m), m, _stored_acceptance(50_000, [40_000, 30_000, 20_000]))
    assert same.outcome is Outcome.PASS
    assert len(same.details["checks"]) == 4  # the overall rate and three positions
    assert same.details["check_confidence"] == pytest.approx(1 - 0.05 / 4)
    # position 2 accepts 20 % less than stored (the overall rate 7.7 % less): those two checks fail, and the gate
    dropped = check_acceptance(gate_settings(rig, m), m, _stored_acceptance(50_000, [40_000, 37_500, 20_000]))
    assert dropped.outcome is Outcome.FAIL
    assert [c["decided"] and not c["passed"] for c in dropped.details["checks"]] == [True, False, True, False]


def test_check_acceptance_fails_a_window_or_a_stored_entry_without_counters(rig):
    bare = _window("ngram", _rates(30.0, 6))
    assert check_acceptance(gate_settings(rig, bare), bare, _stored_acceptance(100, [60])).outcome is Outcome.FAIL
    m = _accepting("ngram", 100, [60])
    result = check_acceptance(gate_settings(rig, m), m, _stored(30.0), reference_label="reference side")
    assert result.outcome is Outcome.FAIL and "the reference side figures have no acceptance" in said(result)


def test_ab_acceptance_with_one_prompt_on_both_sides_falls_back_to_the_counters(rig):
    # three requests, all repeats of prompt p0: one cluster, too few to pair on; the streams agree with
    # the counters (64 tokens in 20, 24 and 18 chunks: 130 accepted tokens over 59 decode steps)
    chunks, per_position = [20, 24, 18], [40, 35, 25, 20, 10]
    m = _accepting("ngram", 59, per_position, chunks=chunks, prompts=1)
    m.partner = _accepting("ngram", 59, per_position, side="reference", chunks=chunks, prompts=1)
    result = ab_acceptance(gate_settings(rig, m), m)
    assert result.gate == "acceptance" and result.details["per_request"] is None
    assert "only 1 prompt(s) with decode steps on both sides" in said(result)
    assert len(result.details["checks"]) == 1 + len(per_position)  # the counters' decision


# -- backfire --------------------------------------------------------------------------------------
def test_check_backfire_on_a_duet_adds_no_start_noise_and_on_two_windows_does(rig):
    noisy = _with_gates(rig, start_noise=0.05)
    m = _window("ngram", _rates(45.0))
    reference = _window("no_spec", _rates(30.0)[::-1], side="partner")
    apart = check_backfire(gate_settings(noisy, m), m, reference)
    m.partner = reference
    duet = check_backfire(gate_settings(noisy, m), m, reference)
    assert duet.gate == apart.gate == "backfire"
    assert duet.outcome is apart.outcome is Outcome.PASS
    assert duet.details["ratio"] == pytest.approx(apart.details["ratio"]) == pytest.approx(1.5, abs=0.03)
    assert "duet with no speculation" in duet.details["compared"]
    assert apart.details["compared"] == {"how": "sequential", "start_noise": 0.05}
    assert "[windows one after the other; start noise 5 % added]" in said(apart)
    assert duet.details["ci_high"] - duet.details["ci_low"] < apart.details["ci_high"] - apart.details["ci_low"]


def test_check_backfire_leaves_out_untimed_requests_and_says_so(rig):
    m = _window("ngram", [*_rates(45.0)[:11], None])
    result = check_backfire(gate_settings(rig, m), m, _window("no_spec", _rates(30.0), side="partner"))
    assert result.details["n"] == 11
    assert "p5#1 (all 64 tokens arrived in one chunk)" in said(result)


def test_backfire_decision_holds_the_ratio_against_min_speedup(rig):
    faster = _with_gates(rig, min_speedup=1.2)
    settings = window_settings(faster, "ngram", "extraction")
    m = bare_window(settings)
    result = backfire_decision(settings, m, Samples(_rates(33.0), _rates(30.0)[::-1], paired=True))
    assert result.details["threshold"] == 1.2
    assert result.outcome is Outcome.FAIL and result.details["ratio"] == pytest.approx(1.1, abs=0.02)
    assert result.declared is None


def test_a_declared_backfire_turns_a_fail_into_a_declared_backfire_and_keeps_a_pass(rig):
    declared = rig.model_copy(update={"declared_backfire": (
        DeclaredBackfire(mode="ngram", classes=("coding",), reason="stand-in: known slow on coding"),)})
    settings = window_settings(declared, "ngram", "coding")
    slower = Samples(_rates(20.0), _rates(30.0)[::-1], paired=True)
    result = backfire_decision(settings, bare_window(settings), slower)
    assert result.outcome is Outcome.DECLARED_BACKFIRE and result.declared == "stand-in: known slow on coding"
    assert result.details["ratio"] == pytest.approx(2 / 3, abs=0.02)
    undeclared = window_settings(declared, "ngram", "extraction")
    assert backfire_decision(undeclared, bare_window(undeclared), slower).outcome is Outcome.FAIL
    faster = backfire_decision(settings, bare_window(settings),
                               Samples(_rates(40.0), _rates(30.0)[::-1], paired=True))
    assert faster.outcome is Outcome.PASS and faster.declared == "stand-in: known slow on coding"


def test_bare_window_takes_its_key_from_the_settings(rig):
    settings = window_settings(rig, "ngram", "math", 4)
    m = bare_window(settings)
    assert (m.rig, m.mode, m.prompt_class, m.concurrency) == ("cpu-smollm2", "ngram", "math", 4)
    assert m.records == [] and m.acceptance is None and m.partner is None and m.decode_tokens_per_s == []


MACHINE = "machine-id stand-in"


def _history(levels: list[float]) -> list[BaselineEntry]:
    return [BaselineEntry(decode_tokens_per_s=[levels[-1]], median=levels[-1], mad=0.0, n=1,
                          starts=[StoredStart(level=v, machine=MACHINE) for v in levels])]


def test_stored_start_histories_need_both_modes_histories_long_enough(rig):
    m = _window("ngram", _rates(30.0))
    settings = gate_settings(rig, m)

    def store(no_spec_levels):
        return BaselineFile(schema_version=SCHEMA_VERSION, rigs={"cpu-smollm2": {
            "ngram": {"coding": {"1": _history([20.0, 20.4, 19.8])}},
            "no_spec": {"coding": {"1": _history(no_spec_levels)}}}})

    pair = stored_start_histories(store([30.0, 30.3, 29.8, 30.1]), settings, m, MACHINE)
    assert pair is not None and [h.starts for h in pair] == [3, 4]
    assert stored_start_histories(store([30.0, 30.3]), settings, m, MACHINE) is None  # too few no_spec starts


# -- ttft ------------------------------------------------------------------------------------------
def _one_key_shared(rig):
    m = _window("ngram", _rates(30.0, 6), ttfts=[0.3] * 6)
    reference = _window("no_spec", _rates(30.0, 6), side="partner", ttfts=[0.3] * 6)
    for record in reference.records[1:]:
        record.request_id = record.request_id.replace("/p", "/q")  # other prompts: only p0#0 is shared
    return check_ttft(gate_settings(rig, m), m, reference)


def test_check_ttft_is_undecided_when_the_sides_share_too_few_requests(rig):
    result = _one_key_shared(rig)
    assert result.outcome is Outcome.UNDECIDED and result.gate == "ttft"
    assert result.details["undecided"] and result.details["verdict"] == "undecided"


def test_the_undecided_ttft_message_counts_the_requests_that_share_a_key(rig):
    assert "TTFT undecided: 1 request(s) with a first token on both sides share a key" in said(_one_key_shared(rig))


def test_check_ttft_reports_the_ttft_ratio_against_its_limit(rig):
    ttft_rig = _with_gates(rig, ttft_tolerance=0.2)
    ttfts = [0.3 * w for w in WOBBLE]
    m = _window("ngram", _rates(30.0), ttfts=[t * 1.5 for t in ttfts])
    m.partner = _window("no_spec", _rates(30.0), side="partner", ttfts=ttfts[::-1])
    result = check_ttft(gate_settings(ttft_rig, m), m, m.partner)
    assert result.outcome is Outcome.FAIL
    assert result.details["limit"] == pytest.approx(1.2) and result.details["ratio"] == pytest.approx(1.5, abs=0.03)
    assert result.details["median_ttft_ms"] > result.details["reference_median_ttft_ms"]


# -- lossless --------------------------------------------------------------------------------------
@pytest.mark.parametrize(("identical", "outcome"), [(6, Outcome.PASS), (3, Outcome.PASS), (2, Outcome.FAIL)])
def test_check_lossless_passes_at_the_identical_share_and_fails_below_it(rig, identical, outcome):
    reference = _window("no_spec", _rates(30.0, 6), side="partner", texts=[f"text {i}" for i in range(6)])
    texts = [f"text {i}" if i < identical else f"text {i} drifted" for i in range(6)]
    m = _window("ngram", _rates(30.0, 7), texts=[*texts, "a seventh request the reference never made"])
    result = check_lossless(gate_settings(rig, m), m, reference)
    assert result.outcome is outcome and result.gate == "lossless"
    assert result.details["identical_share"] == pytest.approx(identical / 6)  # the shared keys only
    divergence = result.details["first_divergence"]
    assert set(divergence) == {f"p{i}#0" for i in range(6)}
    assert [k for k, at in divergence.items() if at is not None] == [f"p{i}#0" for i in range(identical, 6)]


# -- the looks -------------------------------------------------------------------------------------
def test_a_window_looked_at_twice_gets_the_repeated_intervals_coverage():
    m = _window("ngram", _rates(30.0))
    assert window_confidence(0.95, m) == 0.95
    m.first_look_share = 0.2
    assert 0.95 < window_confidence(0.95, m) < 1
    assert not math.isclose(window_confidence(0.95, m), window_confidence(0.99, m))
