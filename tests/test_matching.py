"""specgate.decide.matching: a window's decode rates matched request by request with a reference's
(match_samples), every request left out named in the note, and the samples' prompts (the strata)."""

from __future__ import annotations

import pytest

from specgate.decide.matching import Samples, match_samples
from specgate.measure.client import RequestRecord
from specgate.measure.protocol import ClassMeasurement
from specgate.report.verdicts import left_out_text

pytestmark = pytest.mark.fast

TOKENS = 64


def _record(key: str, rate: float | None) -> RequestRecord:
    """``rate`` decode tok/s; None: every token arrived in one chunk (no decode rate)."""
    last = 1.0 + (TOKENS - 1) / rate if rate else 1.0
    return RequestRecord(request_id=f"ngram/coding/{key}", mode="ngram", prompt_class="coding",
                         prompt_id=key.split("#")[0], concurrency=1, started_at=0.5, first_token_at=1.0,
                         last_token_at=last, finished_at=last, chunk_times=[1.0, last], prompt_tokens=10,
                         completion_tokens=TOKENS, text="x", finish_reason="length")


def _window(rates: dict[str, float | None]) -> ClassMeasurement:
    return ClassMeasurement(rig="cpu-smollm2", mode="ngram", prompt_class="coding", concurrency=1,
                            records=[_record(k, r) for k, r in rates.items()], acceptance=None,
                            server_decode_tokens_per_s=None, server_metric_source=None, wall_s=1.0)


KEYS = [f"p{i}#{r}" for r in range(2) for i in range(3)]  # p0#0 p1#0 p2#0 p0#1 p1#1 p2#1
RATES = dict(zip(KEYS, [20.0, 21.0, 22.0, 23.0, 24.0, 25.0]))


def test_the_two_sides_are_paired_by_key_whatever_their_order():
    m = _window(RATES)
    keys = KEYS[::-1]
    samples = match_samples(m, keys, [RATES[k] * 1.5 for k in keys])
    assert samples.paired and samples.left_out is None
    assert samples.keys == keys  # in the reference's order
    assert samples.measured == pytest.approx([RATES[k] for k in keys])
    assert samples.reference == pytest.approx([RATES[k] * 1.5 for k in keys])
    assert samples.prompts == [k.split("#")[0] for k in keys]


def test_a_request_without_a_decode_rate_drops_out_and_the_note_says_why():
    m = _window({**RATES, "p2#1": None})
    samples = match_samples(m, KEYS, [30.0] * 6)
    assert samples.paired and "p2#1" not in samples.keys and len(samples.measured) == len(samples.reference) == 5
    assert "without a decode rate: p2#1 (all 64 tokens arrived in one chunk)" in left_out_text(samples.left_out)
    assert "left out (timed on one side only): p2#1" in left_out_text(samples.left_out)


def test_the_references_untimed_requests_are_named_with_its_label():
    m = _window(RATES)
    timed = KEYS[:5]
    samples = match_samples(m, timed, [30.0] * 5, ref_untimed={"p2#1": "1 token(s) generated"},
                            ref_label="no speculation")
    assert samples.keys == timed
    assert "p2#1 (no speculation) (1 token(s) generated)" in left_out_text(samples.left_out)
    assert "paired on 5 requests" in left_out_text(samples.left_out)


def test_reference_samples_without_keys_are_kept_whole_and_unpaired():
    m = _window(RATES)
    for keys in (None, KEYS[:2]):  # none stored, or not one per sample
        samples = match_samples(m, keys, [30.0, 31.0, 32.0])
        assert not samples.paired and samples.keys is None and samples.prompts is None
        assert samples.measured == pytest.approx(list(RATES.values())) and samples.reference == [30.0, 31.0, 32.0]
        assert samples.left_out is None


def test_other_prompts_share_too_few_keys_to_pair_on():
    m = _window(RATES)
    samples = match_samples(m, ["q0#0", "q1#0", "p0#0"], [30.0, 31.0, 32.0])
    assert not samples.paired and (len(samples.measured), len(samples.reference)) == (6, 3)


def test_prompts_are_the_keys_without_their_repeat():
    assert Samples([1.0, 2.0], [1.0, 2.0], True, keys=["a#b#0", "c#1"]).prompts == ["a#b", "c"]
