"""What the advice's numbers are: an estimate with its interval (:class:`Span`), the step-cost
models it is predicted under (docs/advice.md), and its tables."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from tabulate import tabulate

CONSTANT = "k-independent cost"
LINEAR = "cost linear from k=0"
FITTED = "fitted cost c0 + s*k"
BOUNDS = (CONSTANT, LINEAR)
SHORT = {CONSTANT: "const", LINEAR: "linear", FITTED: "fit"}  # the tables' column names


def simple_table(rows: list[list[str]], headers: list[str]) -> str:
    """``rows`` under ``headers`` as a plain-text table, cells as they are."""
    return tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)


@dataclass(frozen=True)
class Span:
    """An estimate with its interval; ``value`` None where only a range is known (the seed's)."""

    value: float | None
    low: float
    high: float

    def scaled(self, f: Callable[[float], float]) -> Span:
        """``f`` applied to every figure (f increasing)."""
        return Span(None if self.value is None else f(self.value), f(self.low), f(self.high))

    @property
    def verdict(self) -> str:
        """Against a ratio of 1: "faster" or "slower" when the whole interval is on one side."""
        return "faster" if self.low > 1 else "slower" if self.high < 1 else "undecided"

    def text(self, digits: int = 2, suffix: str = "") -> str:
        def num(v: float) -> str:
            return "inf" if math.isinf(v) else f"{v:.{digits}f}"

        low, high = num(self.low), num(self.high)
        span = low if low == high else f"{low}-{high}"
        if self.value is None:
            return f"{span}{suffix}"
        return f"{num(self.value)}{suffix}" + ("" if low == high else f" ({span})")
