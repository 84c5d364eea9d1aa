"""The duet's request order (specgate.measure.duet.plan): balanced, seeded, whole rounds at concurrency N."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specgate.measure.duet import plan

pytestmark = pytest.mark.fast


def test_abba_by_prompt():
    turns = plan(["a1", "a2", "a3", "a4"], ["b1", "b2", "b3", "b4"], concurrency=1, seed=0)
    sides = [t.side[0] for t in turns]
    first = sides[0]
    assert sides in (list("spps" * 2), list("pssp" * 2))
    assert [t.items for t in turns if t.side == "subject"] == [("a1",), ("a2",), ("a3",), ("a4",)]
    assert plan(["a1", "a2"], ["b1", "b2"], concurrency=1, seed=0)[0].side[0] == first  # seeded


def test_whole_rounds_at_concurrency_n():
    turns = plan(list("abcdef"), list("ABCDEF"), concurrency=3, seed=1)
    assert [len(t.items) for t in turns] == [3, 3, 3, 3]
    assert {t.group for t in turns} == {0, 1}


@given(n=st.integers(1, 40), c=st.integers(1, 5), seed=st.integers(0, 1000))
def test_every_request_once_and_each_side_first_equally_often(n, c, seed):
    subject, partner = [f"s{i}" for i in range(n)], [f"p{i}" for i in range(n)]
    turns = plan(subject, partner, concurrency=c, seed=seed)
    assert [x for t in turns if t.side == "subject" for x in t.items] == subject
    assert [x for t in turns if t.side == "partner" for x in t.items] == partner
    firsts = [turns[i].side for i in range(0, len(turns), 2)]
    assert abs(firsts.count("subject") - firsts.count("partner")) <= 1
    # a pair's two turns are adjacent: never both sides generating at once, nothing in between
    assert all(turns[i].group == turns[i + 1].group for i in range(0, len(turns), 2))


def test_unequal_sides_are_refused():
    with pytest.raises(ValueError, match="same requests on both sides"):
        plan(["a"], ["b", "c"], concurrency=1, seed=0)
