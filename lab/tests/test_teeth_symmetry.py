"""The teeth-symmetry journal's re-derive command (docs/journal/calibration/
cpu-2026-12-05-teeth-symmetry.md), run on its kept raw data: each run's ratio and interval, the mean
and the shift it states must be what the command prints (the journal's numbers are parsed, not
copied here)."""

from __future__ import annotations

import re

import pytest
from journal_commands import re_derive

pytestmark = pytest.mark.fast


@pytest.fixture(scope="module")
def derived() -> tuple[str, str]:
    return re_derive("calibration/cpu-2026-12-05-teeth-symmetry.md", "teeth_symmetry")


def test_each_runs_ratio_and_interval_re_derive(derived) -> None:
    text, out = derived
    rows = re.findall(r"^\| (\d) \| (\w+) \| \**(\w+)\** (\d\.\d{3}x) \((\d\.\d{3})-(\d\.\d{3})\) \| (\d\.\d{3}x) \|",
                      text, re.M)
    assert len(rows) == 4
    for run, first, outcome, ratio, low, high, own in rows:
        assert (f"run {run}: A/A {outcome.lower()} {ratio} ({low}-{high}, 12 pairs), {first} started first; "
                "plugin: no hook on candidate/reference, hooked on no side") in out
        assert f"vLLM's own decode rate {own}" in out.splitlines()[int(run) - 1]


def test_the_mean_and_the_shift_re_derive(derived) -> None:
    text, out = derived
    mean, geometric = re.search(r"\*\*Mean ratio (\d\.\d{3})x\*\* \(geometric (\d\.\d{3})x\)", text).groups()
    assert f"mean ratio {mean}x (geometric {geometric}x) over 4 runs" in out
    before = re.search(r"against\s+\*\*(\d\.\d{3})x\*\* over the 10 A/A runs", text).group(1)
    assert f"mean ratio {before}x" in out.splitlines()[5]
    low, high = re.search(r"95 % Welch t interval (-\d\.\d{3}) to\s+(\+\d\.\d{3})", text).groups()
    shift = re.search(r"shift of the mean log ratio, after - before: ([+-]\d\.\d+) \(95 % Welch t interval "
                      r"([+-]\d\.\d+) to ([+-]\d\.\d+)\)", out).groups()
    assert [round(float(x), 3) for x in shift[1:]] == [float(low), float(high)]
