"""specgate.decide.entry: the stored form of a window (baseline_entry), one start of a history, and the
entries a kept report.json gives (entries_from_report)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from pydantic import ValidationError
from standins import window_side

from specgate.decide.entry import baseline_entry, entries_from_report
from specgate.measure.client import RequestRecord
from specgate.measure.metrics import AcceptanceStats
from specgate.measure.protocol import ClassMeasurement
from specgate.store.baselines import LEVEL_HISTORY, Build, Fingerprint, PromptDigest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent
# a lab session kept whole: three speculative modes each in a duet with no_spec, and no_spec's own window
KEPT = ROOT / "tests/data/lab/2026-12-01-h200-visit9/E1/report.json.gz"
TOKENS = 64
FINGERPRINT = Fingerprint(accelerator="stand-in GPU", accelerator_count=1, vllm_version="0.11.0", machine="host-a",
                          prompts={"coding": PromptDigest(sha256="c" * 64), "math": PromptDigest(sha256="m" * 64)},
                          date="2026-12-05")


def _record(mode: str, key: str, rate: float | None) -> RequestRecord:
    last = 1.0 + (TOKENS - 1) / rate if rate else 1.0
    return RequestRecord(request_id=f"{mode}/coding/{key}", mode=mode, prompt_class="coding",
                         prompt_id=key.split("#")[0], concurrency=1, started_at=0.5, first_token_at=1.0,
                         last_token_at=last, finished_at=last, chunk_times=[1.0, last], prompt_tokens=10,
                         completion_tokens=TOKENS, text="x", finish_reason="length")


def _window(mode: str, rates: list[float | None], *, side: str = "subject") -> ClassMeasurement:
    return ClassMeasurement(rig="cpu-smollm2", mode=mode, prompt_class="coding", concurrency=1,
                            records=[_record(mode, f"p{i % 6}#{i // 6}", r) for i, r in enumerate(rates)],
                            acceptance=None, server_decode_tokens_per_s=None, server_metric_source=None, wall_s=1.0,
                            **window_side(side))


RATES = [30.0, 31.0, 29.0, 30.5, 29.5, 30.2, 30.8, 29.7, 30.1, 29.9, 30.4, 29.6]


def test_the_entry_keeps_the_windows_samples_median_and_timed_keys():
    m = _window("no_spec", [*RATES[:11], None])  # the last request has no decode rate
    entry = baseline_entry(m, FINGERPRINT)
    assert entry.n == 11 and entry.decode_tokens_per_s == pytest.approx(RATES[:11])
    assert entry.median == pytest.approx(sorted(RATES[:11])[5])
    assert entry.sample_keys == [f"p{i % 6}#{i // 6}" for i in range(11)]  # p5#1 left out with its sample
    assert entry.acceptance is None and entry.ratio_to_reference is None  # no counters, no partner
    (start,) = entry.starts
    assert start.level == entry.median and start.ratio is None and start.machine == "host-a"
    assert start.date == "2026-12-05" and start.build == Build.of(entry.fingerprint)
    # the fingerprint narrowed to the window: its class's prompts only
    assert set(entry.fingerprint.prompts) == {"coding"} and entry.fingerprint.accelerator == "stand-in GPU"


def test_the_entry_keeps_the_windows_acceptance_counts():
    m = _window("ngram", RATES)
    m.acceptance = AcceptanceStats(drafts=400.0, draft_tokens=1200.0, accepted_tokens=540.0,
                                   accepted_per_position=(300.0, 160.0, 80.0))
    acceptance = baseline_entry(m, FINGERPRINT).acceptance
    assert acceptance is not None
    assert (acceptance.drafts, acceptance.draft_tokens, acceptance.accepted_per_position) == (400, 1200, [300, 160, 80])
    assert acceptance.per_position_rates == pytest.approx([0.75, 0.4, 0.2])
    assert acceptance.acceptance_rate == pytest.approx(540 / 1200)
    assert acceptance.mean_acceptance_length == pytest.approx(1 + 540 / 400)


def test_a_duet_with_no_speculation_stores_its_ratio_and_an_ab_partner_none():
    m = _window("ngram", [r * 1.5 for r in RATES])
    m.partner = _window("no_spec", RATES[::-1], side="partner")
    entry = baseline_entry(m, FINGERPRINT)
    ratio = entry.ratio_to_reference
    assert ratio is not None and ratio.reference_mode == "no_spec" and ratio.n == 12
    assert ratio.ratio == pytest.approx(1.5, abs=0.03) and ratio.ci_low < ratio.ratio < ratio.ci_high
    assert entry.starts[-1].ratio == ratio.ratio
    m.partner = _window("ngram", RATES, side="reference")  # an A/B's other side: not a ratio to no speculation
    assert baseline_entry(m, FINGERPRINT).ratio_to_reference is None


def test_a_start_extends_the_previous_history_of_its_machine_and_build_only():
    first = baseline_entry(_window("no_spec", RATES), FINGERPRINT)
    second = baseline_entry(_window("no_spec", [r * 1.02 for r in RATES]), FINGERPRINT, previous=first)
    assert second.level_history == pytest.approx([first.median, first.median * 1.02])
    other_machine = FINGERPRINT.model_copy(update={"machine": "host-b"})
    with pytest.raises(ValidationError, match="starts of several machines or builds"):
        baseline_entry(_window("no_spec", RATES), other_machine, previous=first)
    other_build = FINGERPRINT.model_copy(update={"vllm_version": "0.12.0"})
    with pytest.raises(ValidationError, match="starts of several machines or builds"):
        baseline_entry(_window("no_spec", RATES), other_build, previous=first)


def test_a_history_keeps_its_last_starts_only():
    entry = baseline_entry(_window("no_spec", RATES), FINGERPRINT)
    for i in range(LEVEL_HISTORY + 2):
        entry = baseline_entry(_window("no_spec", [r + i for r in RATES]), FINGERPRINT, previous=entry)
    assert len(entry.starts) == LEVEL_HISTORY
    assert entry.level_history[-1] == pytest.approx(entry.median)
    assert entry.level_history[0] == pytest.approx(baseline_entry(_window("no_spec", [r + 2 for r in RATES]),
                                                                  FINGERPRINT).median)


def test_a_ratio_to_another_reference_mode_drops_the_earlier_starts_ratios():
    ngram = _window("ngram", [r * 1.5 for r in RATES])
    ngram.partner = _window("no_spec", RATES, side="partner")
    first = baseline_entry(ngram, FINGERPRINT)
    ngram.partner = _window("baseline", RATES, side="partner")
    second = baseline_entry(ngram, FINGERPRINT, previous=first)
    assert second.ratio_to_reference.reference_mode == "baseline"
    assert [s.ratio is None for s in second.starts] == [True, False]
    assert second.level_history == pytest.approx([first.median, first.median])


@pytest.fixture(scope="module")
def kept() -> dict:
    return json.loads(gzip.decompress(KEPT.read_bytes()))


def test_a_kept_report_gives_one_entry_per_measured_window(kept):
    entries = entries_from_report(kept)
    rig = kept["measurements"][0]["rig"]
    assert set(entries) == {(rig, m["mode"], m["prompt_class"], m["concurrency"]) for m in kept["measurements"]}
    for m in kept["measurements"]:
        entry = entries[(rig, m["mode"], m["prompt_class"], m["concurrency"])]
        window = ClassMeasurement.from_dict(m)
        assert entry.n == len(window.decode_tokens_per_s) and len(entry.starts) == 1
        # each with the fingerprint its mode's server had
        assert entry.fingerprint.vllm_version == kept["fingerprints"][m["mode"]]["vllm_version"]
        assert entry.fingerprint.speculative_config == kept["fingerprints"][m["mode"]]["speculative_config"]
        # the duet windows' ratio to their live no-speculation partner, the acceptance of the speculative ones
        if m.get("partner"):
            assert entry.ratio_to_reference.reference_mode == m["partner"]["mode"] == "no_spec"
            assert entry.acceptance is not None
        else:
            assert entry.ratio_to_reference is None


def test_a_kept_report_gives_the_modes_asked_for(kept):
    entries = entries_from_report(kept, modes=["eagle3_al30", "no_spec"])
    assert sorted(mode for _, mode, _, _ in entries) == ["eagle3_al30", "no_spec"]


def test_a_window_without_a_decode_rate_gives_no_entry(kept):
    untimed = _window("ngram", [None] * 6)
    report = {"measurements": [*kept["measurements"][:1], untimed.to_dict()], "fingerprints": {}}
    entries = entries_from_report(report)
    assert [mode for _, mode, _, _ in entries] == [kept["measurements"][0]["mode"]]
    # no fingerprint kept for the mode: an unknown one, never gating
    assert next(iter(entries.values())).machine is None
