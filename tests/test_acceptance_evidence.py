"""Issue 14, point 4: the acceptance gate's tolerance comes from the evidence. Each rate is
accepted / drafted with a Wilson interval; a window whose interval cannot tell a drop of the
tolerance from chance is undecided (recorded and skipped), never passed or failed."""

import json
import textwrap
from pathlib import Path

import pytest
from fixture_copy import copy_fixtures
from standins import gate_settings
from words import said

from specgate.config.rig import load_rig
from specgate.decide.entry import baseline_entry
from specgate.decide.gates import check_acceptance
from specgate.decide.outcome import Outcome
from specgate.decide.stats import METHOD_BINOMIAL, Observed, compare_acceptance, wilson_interval
from specgate.measure.client import RequestRecord
from specgate.measure.metrics import AcceptanceStats
from specgate.measure.protocol import ClassMeasurement
from specgate.store.baselines import AcceptanceEntry, BaselineEntry, Fingerprint

pytestmark = pytest.mark.fast
pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(("k", "n"), [(0, 13), (2, 13), (10, 13), (13, 13), (480, 1000)])
def test_wilson_interval_is_scipys(k, n):
    from scipy.stats import binomtest  # here, not at collection: 1.1 s that most fast-tier runs need only once

    expected = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
    assert wilson_interval(k, n, 0.95) == pytest.approx((expected.low, expected.high))


def test_a_clear_drop_fails_a_small_drop_in_a_small_window_is_undecided_no_drop_passes_on_its_interval():
    common = {"tolerance": 0.05, "subject": "ngram on coding", "metric": "position 1 rate"}
    failed = compare_acceptance(Observed(0.4, (400, 1000)), Observed(0.5, label="stored"), **common)
    assert failed.decided and not failed.passed and failed.method == METHOD_BINOMIAL
    assert "400 of 1000 drafts, 95 % interval 0.37-0.431" in said(failed)
    # the seed's complaint: 13 drafts, where a rate rests on a couple of accepted tokens
    open_ = compare_acceptance(Observed(2 / 13, (2, 13)), Observed(0.231, label="stored"), **common)
    assert not open_.decided
    assert "too few drafts to gate" in said(open_) and "spans the fail line 0.219" in said(open_)
    assert "about 5100 drafts would resolve a 5 % drop" in said(open_)
    # no drop on the point is no pass while the interval reaches below the fail line (issue 47)
    same = compare_acceptance(Observed(10 / 13, (10, 13)), Observed(10 / 13, label="stored"), **common)
    assert not same.decided and not same.passed
    clear = compare_acceptance(Observed(0.8, (800, 1000)), Observed(0.5, label="stored"), **common)
    assert clear.decided and clear.passed
    # without counts (old callers): the fixed tolerance, as before
    assert compare_acceptance(Observed(0.74), Observed(0.769, label="stored"), tolerance=0.05, subject="s",
                              metric="m").decided


def _record(i: int) -> RequestRecord:
    return RequestRecord(request_id=f"ngram/coding/p{i}#0", mode="ngram", prompt_class="coding", prompt_id=f"p{i}",
                         concurrency=1, started_at=0.0, first_token_at=0.1, last_token_at=2.2, finished_at=2.2,
                         chunk_times=[0.1, 2.2], prompt_tokens=10, completion_tokens=64, text="x",
                         finish_reason="length")


def _window(acceptance: AcceptanceStats) -> ClassMeasurement:
    return ClassMeasurement(rig="cpu-smollm2", mode="ngram", prompt_class="coding", concurrency=1,
                            records=[_record(i) for i in range(3)], acceptance=acceptance,
                            server_decode_tokens_per_s=None, server_metric_source=None, wall_s=1.0)


def _stats(drafts: float, per_position: list[float]) -> AcceptanceStats:
    return AcceptanceStats(drafts=drafts, draft_tokens=drafts * len(per_position),
                           accepted_tokens=sum(per_position), accepted_per_position=tuple(per_position))


# The committed cpu baseline of ngram on coding: 13 drafts, positions 10, 9, 7, 7, 3 accepted.
STORED = AcceptanceEntry(mean_acceptance_length=1 + 36 / 13, acceptance_rate=36 / 65,
                         per_position_rates=[10 / 13, 9 / 13, 7 / 13, 7 / 13, 3 / 13])


@pytest.fixture(scope="module")
def rig():
    return load_rig("cpu-smollm2", ROOT / "fixtures")


def _entry(acceptance: AcceptanceEntry) -> BaselineEntry:
    return BaselineEntry(decode_tokens_per_s=[30.0], median=30.0, mad=0.0, n=1, acceptance=acceptance)


def test_a_thirteen_draft_window_one_token_lower_is_undecided(rig):
    window = _window(_stats(13, [10, 9, 7, 7, 2]))
    result = check_acceptance(gate_settings(rig, window), window, _entry(STORED))
    assert result.details["undecided"] and not result.passed
    assert "ngram on coding: position 5 rate 0.154 (2 of 13 drafts" in said(result)
    assert [c["decided"] for c in result.details["checks"]].count(False) >= 1  # the words: the test above


def test_the_same_rates_in_a_small_window_are_undecided_a_large_one_passes_one_that_dropped_fails(rig):
    # 13 drafts at the stored rates: the interval still reaches below the fail line (issue 47)
    window = _window(_stats(13, [10, 9, 7, 7, 3]))
    same = check_acceptance(gate_settings(rig, window), window, _entry(STORED))
    assert same.outcome is Outcome.UNDECIDED and not same.passed
    window = _window(_stats(13000, [10000, 9000, 7000, 7000, 3000]))
    large = check_acceptance(gate_settings(rig, window), window, _entry(STORED))
    assert large.passed and not large.details["undecided"]
    window = _window(_stats(2000, [1200, 1000, 800, 700, 300]))
    dropped = check_acceptance(gate_settings(rig, window), window, _entry(STORED))
    assert not dropped.passed and not dropped.details["undecided"]
    assert "position 1 rate 0.6 (1200 of 2000 drafts" in said(dropped)
    assert "the whole interval is below the fail line" in said(dropped)


def test_an_ab_window_names_the_reference_side_not_stored_figures(rig):
    # The lab's A/B: synthetic acceptance 3.0 ([1, 1, 0]) on the reference side, 2.85 on the candidate.
    reference = baseline_entry(_window(_stats(516, [516, 516, 0])), Fingerprint())
    window = _window(_stats(544, [544, 449, 0]))
    result = check_acceptance(gate_settings(rig, window), window, reference, reference_label="reference side")
    assert result.outcome is Outcome.FAIL
    assert "position 2 rate 0.825 (449 of 544 drafts) vs 1 reference side (516 of 516): ratio 0.825" in said(result)
    assert "17 % lower" in said(result)
    assert "stored" not in said(result)


def test_baselines_keep_the_raw_counts_and_old_entries_load():
    fresh = _window(_stats(13, [10, 9, 7, 7, 3]))
    entry = baseline_entry(fresh, Fingerprint())
    assert (entry.acceptance.drafts, entry.acceptance.draft_tokens) == (13, 65)
    assert entry.acceptance.accepted_per_position == [10, 9, 7, 7, 3]
    again = BaselineEntry.model_validate(json.loads(entry.model_dump_json()))
    assert again.acceptance == entry.acceptance
    old = AcceptanceEntry.model_validate({"mean_acceptance_length": 3.77, "acceptance_rate": 0.55,
                                          "per_position_rates": [0.77]})
    assert old.drafts is None and old.accepted_per_position is None


GATE_TEST = textwrap.dedent('''
    from specgate.store.baselines import Fingerprint, merge_updates
    from specgate.measure.client import RequestRecord
    from specgate.decide.entry import baseline_entry
    from specgate.measure.protocol import ClassMeasurement
    from specgate.measure.metrics import AcceptanceStats


    def window(per_position):
        stats = AcceptanceStats(drafts=13, draft_tokens=65, accepted_tokens=sum(per_position),
                                accepted_per_position=tuple(per_position))
        record = RequestRecord(request_id="ngram/coding/p0#0", mode="ngram", prompt_class="coding",
                               prompt_id="p0", concurrency=1, started_at=0.0, first_token_at=0.1,
                               last_token_at=2.2, finished_at=2.2, chunk_times=[0.1, 2.2], prompt_tokens=10,
                               completion_tokens=64, text="x", finish_reason="length")
        return ClassMeasurement(rig="cpu-smollm2", mode="ngram", prompt_class="coding", concurrency=1,
                                records=[record], acceptance=stats, server_decode_tokens_per_s=None,
                                server_metric_source=None, wall_s=1.0)


    def test_acceptance(specgate_session, gatekeeper):
        merge_updates(specgate_session.options.baselines_path, {
            ("cpu-smollm2", "ngram", "coding", 1): baseline_entry(window([10, 9, 7, 7, 3]), Fingerprint())})
        specgate_session._settings = None  # resolved again: the baselines file written above is read
        m = window([10, 9, 7, 7, 2])
        specgate_session.measurements[("ngram", "coding", 1)] = m
        gatekeeper.acceptance(m)
''')


@pytest.mark.usefixtures("no_plots")
def test_an_undecided_acceptance_gate_is_skipped_and_listed(pytester):
    copy_fixtures(pytester.path / "fixtures")
    pytester.makepyfile(test_gate=GATE_TEST)
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:randomly", "-rs")
    result.assert_outcomes(skipped=1)
    out = result.stdout.str()
    assert "ngram coding c1 acceptance: 0.972x of stored figures (0.378-2.498) spans 0.95 line [13 drafts]" in out
    report = json.loads(next((pytester.path / ".specgate" / "runs").glob("*/report.json")).read_text())
    assert "position 5 rate 0.154 (2 of 13 drafts" in report["undecided"][0]["message"]
    assert [(u["gate"], u["kind"]) for u in report["undecided"]] == [("acceptance", "too few drafts")]
    assert report["gates"] == []  # neither passed nor failed
