"""Tests for specgate.decide.stats: summaries, request pairing, the acceptance and output decisions and their
messages (the speed gates' paired ratio is tested in tests/test_paired.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from words import said

from specgate.decide.stats import (
    METHOD_ONE_SIDED,
    Observed,
    compare_acceptance,
    compare_outputs,
    match_by_key,
    summarize,
)

pytestmark = pytest.mark.fast


def test_summarize_is_robust() -> None:
    summary = summarize([10.0, 11.0, 12.0, 13.0, 1000.0])
    assert summary.median == 12.0
    assert summary.n == 5
    assert summary.iqr == pytest.approx(2.0)
    assert summary.mad == pytest.approx(1.4826, rel=1e-3)  # one unit, normal-scaled
    assert summary.samples == (10.0, 11.0, 12.0, 13.0, 1000.0)


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")], [float("inf")]])
def test_summarize_rejects_empty_and_non_finite(bad: list[float]) -> None:
    with pytest.raises(ValueError, match=r"empty|NaN or infinite"):
        summarize(bad)


def test_acceptance_is_one_sided() -> None:
    stored = Observed(2.6, label="stored")
    higher = compare_acceptance(
        Observed(3.1), stored, tolerance=0.1, subject="eagle on chat", metric="mean acceptance length"
    )
    assert higher.passed and higher.method == METHOD_ONE_SIDED
    lower = compare_acceptance(
        Observed(2.0), stored, tolerance=0.1, subject="eagle on chat", metric="mean acceptance length"
    )
    assert not lower.passed
    assert said(lower, "eagle on chat").startswith(
        "eagle on chat: mean acceptance length 2 vs 2.6 stored (ratio 0.769, 23 % lower"
    )
    # Exactly at the tolerance (values exact in binary floating point) passes.
    two = Observed(2.0, label="stored")
    assert compare_acceptance(Observed(1.5), two, tolerance=0.25, subject="s", metric="m").passed
    assert not compare_acceptance(
        Observed(float(np.nextafter(1.5, 0.0))), two, tolerance=0.25, subject="s", metric="m"
    ).passed


def test_compare_outputs_share_and_first_divergence() -> None:
    result = compare_outputs(
        [
            ("p1", "The answer is 42.", "The answer is 42."),
            ("p2", "def f(x): return x", "def f(y): return y"),
            ("p3", "short", "short and longer"),
            ("p4", "same", "same"),
        ],
        min_identical_share=1.0,
        subject="ngram on coding",
    )
    assert result.identical_share == 0.5
    assert result.first_divergence == {"p1": None, "p2": 6, "p3": 5, "p4": None}
    assert not result.passed
    assert "2/4 outputs identical" in said(result) and "p2 at char 6" in said(result)
    assert compare_outputs([("p1", "a", "a"), ("p2", "a", "b")], min_identical_share=0.5, subject="s").passed
    with pytest.raises(ValueError, match="no outputs to compare for s"):
        compare_outputs([], min_identical_share=1.0, subject="s")


# -- pairing by request key ----------------------------------------------------------------------
keyed = st.dictionaries(st.from_regex(r"p[0-9]{1,2}#[0-3]", fullmatch=True),
                        st.floats(min_value=1.0, max_value=1000.0), min_size=2, max_size=12)


@given(reference=keyed, data=st.data())
def test_pairs_line_up_by_key_and_only_one_sided_keys_are_left_out(reference, data) -> None:
    keys = list(reference)
    kept = data.draw(st.lists(st.sampled_from(keys), unique=True, min_size=1), label="measured keys")
    measured = {k: reference[k] * 1.5 for k in kept}
    matched = match_by_key(measured, reference)
    if matched.paired:
        # every pair is one request measured twice: the ratio is the same for each
        assert [m / r for m, r in zip(matched.measured, matched.reference)] == pytest.approx([1.5] * len(kept))
        assert sorted(matched.one_sided) == sorted(set(keys) - set(kept))
        assert len(kept) >= 2
    else:  # too few shared keys to pair: each side compared whole
        assert sorted(matched.measured) == sorted(measured.values())
        assert sorted(matched.reference) == sorted(reference.values())
        assert len(kept) < 2


@given(reference=keyed, data=st.data())
def test_partly_shared_keys_pair_only_when_they_cover_half_the_smaller_side(reference, data) -> None:
    keys = list(reference)
    shared = data.draw(st.lists(st.sampled_from(keys), unique=True), label="shared keys")
    extra = data.draw(st.integers(0, 12), label="keys only measured")
    measured = {**{k: reference[k] * 1.5 for k in shared}, **{f"x{i}#9": 7.0 for i in range(extra)}}
    matched = match_by_key(measured, reference)
    assert matched.paired == (len(shared) >= 2 and 2 * len(shared) >= min(len(measured), len(reference)))
    if matched.paired:
        assert sorted(matched.keys) == sorted(shared)


def test_one_request_missing_costs_one_pair_and_disjoint_keys_compare_unpaired() -> None:
    reference = {f"p{i}#0": 30.0 + i for i in range(6)}
    measured = {k: v for k, v in reference.items() if k != "p3#0"}
    matched = match_by_key(measured, reference)
    assert matched.paired and len(matched.measured) == 5 and matched.one_sided == ["p3#0"]
    other = match_by_key({f"q{i}#0": 1.0 for i in range(6)}, reference)
    assert not other.paired and len(other.measured) == len(other.reference) == 6


def test_a_window_with_follow_up_rounds_pairs_on_the_stored_keys() -> None:
    # Run L (fresh clone, 2026-12-01): the no-speculation level check of a 60-request follow-up
    # window against 12 stored requests was undecided ("share too few request keys to pair") while
    # every stored key was in the window.
    stored = {f"p{i}#{r}": 20.0 + i for i in range(6) for r in range(2)}
    window = {f"p{i}#{r}": 21.0 + i for i in range(6) for r in range(10)}
    matched = match_by_key(window, stored)
    assert matched.paired and matched.keys == list(stored) and len(matched.one_sided) == 48
