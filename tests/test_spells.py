"""A slow spell on one side of a duet window (specgate.measure.spells), on real lab windows: visit 14's K1,
where 23 of the 1-layer draft's requests ran while its engine's own vCPU was 1.5x slower, and K2,
the same probe a few minutes later with nothing of the kind."""

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from specgate.measure.spells import slow_spell
from specgate.report.terminal import notice_lines, spell_lines

pytestmark = pytest.mark.fast

LAB14 = Path(__file__).resolve().parent / "data" / "lab" / "2026-12-02-h200-visit14"


def _report(session: str) -> dict:
    return json.loads(gzip.decompress((LAB14 / session / "report.json.gz").read_bytes()))


def _series(window: dict) -> tuple[list[float], list[float], list[str]]:
    timed = [r for r in window["records"] if r["decode_tokens_per_s"]]
    return [r["started_at"] for r in timed], [r["decode_tokens_per_s"] for r in timed], [r["prompt_id"] for r in timed]


def test_k1s_draft_window_has_its_spell_and_the_reference_has_none() -> None:
    draft = next(m for m in _report("K1")["measurements"] if m["mode"] == "draft1l_al30_async")
    spell = slow_spell(*_series(draft))
    assert spell is not None and spell.p_value == 0.001  # none of 999 orders as slow
    assert (spell.requests, spell.of) == (24, 48)
    assert [round(t) for t in spell.started_s] == [16, 38]
    assert round(-np.expm1(spell.mean_residual) * 100, 1) == 11.2
    reference = slow_spell(*_series(draft["partner"]))
    assert reference is None or reference.p_value > 0.01
    assert slow_spell(*_series(draft), seed=0) == spell  # seeded: the same window, the same verdict


def test_the_notice_names_the_window_side_and_span_only_where_there_is_one() -> None:
    lines = [line for line in notice_lines(_report("K1")) if line.startswith("SLOW SPELL")]
    assert len(lines) == 1 and lines[0].startswith(
        "SLOW SPELL [draft1l_al30_async-coding-c1]: 24 of draft1l_al30_async's 48 requests, 16-38 s into the "
        "window, ran 11.2 % under their prompts' other requests (no_spec's then: +0.0 %; a run this slow from "
        "the order alone: p = 0.001)")
    assert spell_lines(_report("K2")) == [] and spell_lines(_report("K3")) == []


def test_two_requests_per_prompt_cannot_show_a_spell() -> None:
    # 2 ** 6 orders at most: never below 1 %, so such a window (a 12-pair first look) is not judged.
    times = [float(i) for i in range(12)]
    rates = [100.0] * 6 + [80.0] * 6
    prompts = [f"p{i % 6}" for i in range(12)]
    assert slow_spell(times, rates, prompts) is None


def test_a_stretch_of_slow_requests_is_found_where_it_is() -> None:
    # A stand-in series: six prompts of different levels, five requests each, one stretch 20 % slow.
    rng = np.random.default_rng(7)
    prompts = [f"p{i % 6}" for i in range(30)]
    levels = {f"p{i}": 100.0 + 40 * i for i in range(6)}
    rates = [levels[p] * (1 + rng.normal(0, 0.01)) * (0.8 if 12 <= i < 20 else 1.0) for i, p in enumerate(prompts)]
    spell = slow_spell([float(i) for i in range(30)], rates, prompts)
    # the run starts where the stretch does and takes it whole (it may run on over neighbours whose
    # residuals net below zero: a maximum-subarray sum)
    assert spell is not None and spell.start == 12 and spell.stop >= 20 and spell.p_value <= 0.01
    flat = [levels[p] * (1 + rng.normal(0, 0.01)) for p in prompts]
    found = slow_spell([float(i) for i in range(30)], flat, prompts)
    assert found is None or found.p_value > 0.01 or found.mean_residual > -0.03
