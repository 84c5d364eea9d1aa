"""Issue 52: the acceptance stream check is tight. A real cpu window (ngram on coding, 249 decode steps,
vLLM counted 34 accepted tokens: the case whose old slack, 10 % plus a draft's tokens per request, let
one side's tokens per step be inflated 2.3x) agrees with vLLM's counters as recorded, and is flagged once
its streams are inflated by 10 % tokens per step (chunks merged, as a client reading late sees them)."""

import dataclasses
import gzip
import json
from pathlib import Path

import pytest

from specgate.decide.gates import request_acceptances, stream_count_mismatch
from specgate.measure.protocol import ClassMeasurement

pytestmark = pytest.mark.fast

REPORT = (Path(__file__).resolve().parent / "data" / "calibration" / "cpu-2026-12-04-acceptance"
          / "aa-48-report.json.gz")


def _window() -> ClassMeasurement:
    data = json.loads(gzip.decompress(REPORT.read_bytes()))
    return next(ClassMeasurement.from_dict(m) for m in data["measurements"]
                if m["mode"] == "ngram" and m["prompt_class"] == "coding")


def _merged(m: ClassMeasurement, every: int) -> ClassMeasurement:
    """Every ``every``-th decode chunk of each request merged into the one before it: the same tokens
    over fewer steps."""
    records = []
    for r in m.records:
        times = list(r.chunk_times)
        kept = times[:1] + [t for i, t in enumerate(times[1:], start=1) if i % every]
        records.append(dataclasses.replace(r, chunk_times=kept))
    return dataclasses.replace(m, records=records)


def _tokens_per_step(m: ClassMeasurement) -> float:
    counts = request_acceptances(m).values()
    steps = sum(s for _, s in counts)
    return (steps + sum(a for a, _ in counts)) / steps


def test_the_recorded_window_agrees_with_vllms_counters():
    m = _window()
    counts = request_acceptances(m)
    assert sum(s for _, s in counts.values()) == 249 and m.acceptance.accepted_tokens == 34
    assert stream_count_mismatch(m, counts) is None


def test_streams_inflated_by_10_percent_tokens_per_step_are_flagged():
    m = _window()
    inflated = _merged(m, every=11)  # one step in 11 merged: ~10 % more tokens per step
    assert 1.09 <= _tokens_per_step(inflated) / _tokens_per_step(m) <= 1.12
    why = stream_count_mismatch(inflated, request_acceptances(inflated))
    assert why is not None and "the client read steps merged into one chunk (late)" in why
    assert "where vLLM counted 34 over" in why
