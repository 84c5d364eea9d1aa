"""Validation of the throughput gate's statistics on recorded real runs.

    python benchmarks/stats_validation.py REPORT.json [REPORT.json ...]
        [--tolerance 0.15] [--confidence 0.95] [--trials 2000] [--write-docs]

The gate under test is ``specgate.stats.compare_ratio`` as ``specgate.gates.check_throughput``
calls it: threshold = 1 - tolerance, paired by request key (prompt id and repeat) when both sides
have the same keys, FAIL iff ratio < threshold AND the CI's upper end < max(threshold, 1).

From the ``measurements[*].records[*].decode_tokens_per_s`` of complete specgate reports (one
rig at a time; reports of several rigs are validated rig by rig) it computes:

- false alarms (A/A): the real run-vs-run comparisons (every window present in two reports,
  both orientations) and synthetic A/A pairs resampled from the recorded samples;
- power: uniform slowdowns injected into the measured side (samples x (1 - s)), the detection
  rate per slowdown and the smallest slowdown detected in >= 95 % of the trials, for the
  configured tolerance and for 0.05 and 0.10;
- what would meet the project's goals (<= 1 % false alarms; detect 10 % on the CPU tier, 5 % on
  the GPU lab): more repeats (n = 12 by resampling), a same-session reference, other tolerances.

Every trial is decided by one real ``compare_ratio`` call. Its decision for any other slowdown s
and threshold t follows from that call's ratio and CI because the statistic and its bootstrap
interval scale with the measured side (the bootstrap is seeded, so the same resamples are drawn):
FAIL(s, t) iff ratio (1 - s) < t and ci_high (1 - s) < max(t, 1). The first ``--check-trials``
trials of every setting are also decided by direct ``compare_ratio`` calls at every tolerance and
slowdown of the tables, and the disagreements are counted and printed (expected: 0).

The Markdown report goes to stdout and, with ``--write-docs``, to docs/statistics.md.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from scipy import stats as scipy_stats

from specgate.stats import compare_ratio, match_by_key

ROOT = Path(__file__).resolve().parents[1]
DOCS_PATH = ROOT / "docs" / "statistics.md"
# The rig's [gates] start_noise, passed to every compare_ratio call (set by --start-noise).
START_NOISE = 0.0

GATE_RESAMPLES = 2000  # compare_ratio's default, which the gates use
SLOWDOWNS = (0.02, 0.05, 0.10, 0.15, 0.20, 0.30)
EXTRA_TOLERANCES = (0.05, 0.10)
MAX_FALSE_ALARM = 0.01  # the project's goal
DETECTION_LEVEL = 0.95  # "detected 95 % of the time"
GOAL_SLOWDOWN = {"cpu": 0.10, "gpu": 0.05}  # smallest regression to detect, per tier
FINE_SLOWDOWNS = np.round(np.arange(0.005, 0.6001, 0.005), 3)  # for the smallest detected slowdown
SWEEP_TOLERANCES = np.round(np.arange(0.0, 0.3001, 0.005), 3)
# A slowdown within TIE of a comparison's critical slowdown lands exactly on the threshold (ties happen
# when resampled sides share values): the rule says pass, compare_ratio's rounding may say either.
TIE = 1e-9


class WindowKey(NamedTuple):
    """One measurement window: the throughput gate compares windows with the same key."""

    mode: str
    prompt_class: str
    concurrency: str


@dataclass(frozen=True)
class Run:
    """One complete specgate run (one report) of one rig: window -> {request key: decode tok/s}."""

    label: str
    windows: Mapping[WindowKey, Mapping[str, float]]
    rig: str = "rig"
    tier: str = "cpu"
    repeats: int = 1
    written_at: str | None = None
    machine: str | None = None
    path: str | None = None

    @property
    def n_samples(self) -> int:
        return sum(len(w) for w in self.windows.values())


# ------------------------------------------------------------------------------------ loading


def _machine(report: Mapping[str, Any]) -> str | None:
    for fp in (report.get("fingerprints") or {}).values():
        if not fp:
            continue
        name, count = fp.get("accelerator"), fp.get("accelerator_count")
        if name is None:
            continue
        tier = (report.get("rig") or {}).get("tier")
        unit = "cores" if tier == "cpu" else "GPUs"
        return f"{name}, {count} {unit}" if count else str(name)
    return None


def load_report(path: str | Path) -> Run:
    """Read a specgate report (JSON) into a Run. Records without decode tok/s are skipped."""
    path = Path(path)
    report = json.loads(path.read_text())
    if "measurements" not in report:
        raise ValueError(f"{path}: not a specgate report (no 'measurements')")
    if report.get("complete") is False:
        print(f"warning: {path} is an incomplete run; using the windows it has", file=sys.stderr)
    rig = report.get("rig") or {}
    windows: dict[WindowKey, dict[str, float]] = {}
    for m in report["measurements"]:
        key = WindowKey(str(m["mode"]), str(m["prompt_class"]), str(m["concurrency"]))
        seen: dict[str, int] = {}
        samples = windows.setdefault(key, {})
        for record in m["records"]:
            value = record.get("decode_tokens_per_s")
            request_id = record.get("request_id") or ""
            if "#" in request_id:
                sample_key = request_id.split("/", 2)[-1]  # as ClassMeasurement.sample_keys
            else:
                pid = str(record.get("prompt_id"))
                sample_key = f"{pid}#{seen.get(pid, 0)}"
                seen[pid] = seen.get(pid, 0) + 1
            if value is not None and math.isfinite(value) and value > 0:
                samples[sample_key] = float(value)
        if not samples:
            del windows[key]
    try:
        label = str(path.resolve().relative_to(ROOT))
    except ValueError:
        label = str(path)
    return Run(
        label=label,
        windows=windows,
        rig=str(rig.get("name", "rig")),
        tier=str(rig.get("tier", "cpu")),
        repeats=int((rig.get("protocol") or {}).get("repeats", 1)),
        written_at=report.get("written_at"),
        machine=_machine(report),
        path=str(path),
    )


# ------------------------------------------------------------------------------------ trials


@dataclass(frozen=True)
class Pair:
    """One comparison as the gate sees it: measured vs reference samples."""

    measured: np.ndarray
    reference: np.ndarray
    paired: bool
    group: str  # the mode (breakdowns)
    label: str = ""


@dataclass
class Setting:
    """A way of building comparisons, and what compare_ratio made of each."""

    key: str
    title: str
    description: str
    n_per_side: str
    ratio: np.ndarray = field(default_factory=lambda: np.empty(0))
    ci_high: np.ndarray = field(default_factory=lambda: np.empty(0))  # NaN: no CI (decided by threshold)
    groups: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=object))
    labels: list[str] = field(default_factory=list)
    checked: int = 0
    mismatches: int = 0
    ties: int = 0  # cross-checked decisions exactly on the threshold that rounding decided the other way
    what_if: bool = False

    @property
    def n(self) -> int:
        return int(self.ratio.size)

    def critical(self, tolerance: float, group: str | None = None) -> np.ndarray:
        """Per trial, the slowdown above which the gate fails (negative: fails with none)."""
        threshold = 1.0 - tolerance
        ratio, ci_high = self.ratio, self.ci_high
        if group is not None:
            mask = self.groups == group
            ratio, ci_high = ratio[mask], ci_high[mask]
        with np.errstate(divide="ignore"):
            by_ratio = np.where(ratio > 0, 1.0 - threshold / np.where(ratio > 0, ratio, 1.0), -np.inf)
            by_ci = np.where(
                np.isnan(ci_high),
                -np.inf,
                np.where(
                    ci_high > 0, 1.0 - max(threshold, 1.0) / np.where(ci_high > 0, ci_high, 1.0), -np.inf
                ),
            )
        return np.maximum(by_ratio, by_ci)

    def detection(self, tolerance: float, slowdown: float, group: str | None = None) -> float:
        crit = self.critical(tolerance, group)
        return float(np.mean(slowdown > crit + TIE)) if crit.size else float("nan")

    def false_alarms(self, tolerance: float, group: str | None = None) -> tuple[int, int]:
        crit = self.critical(tolerance, group)
        return int(np.sum(crit + TIE < 0)), int(crit.size)

    def smallest_detected(
        self, tolerance: float, group: str | None = None, level: float = DETECTION_LEVEL
    ) -> float | None:
        crit = self.critical(tolerance, group)
        if not crit.size:
            return None
        for s in FINE_SLOWDOWNS:
            if np.mean(s > crit + TIE) >= level:
                return float(s)
        return None


def gate(pair: Pair, tolerance: float, slowdown: float, confidence: float, n_resamples: int):
    """The throughput gate (as specgate.gates runs it) on one pair, measured side slowed down."""
    return compare_ratio(
        pair.measured * (1.0 - slowdown),
        pair.reference,
        threshold=1.0 - tolerance,
        gate="throughput",
        subject="validation",
        reference_label="baseline",
        paired=pair.paired,
        confidence=confidence,
        n_resamples=n_resamples,
        start_noise=START_NOISE,
    )


def decide(pair: Pair, tolerance: float, slowdown: float, confidence: float, n_resamples: int) -> bool:
    """True = the gate FAILS this pair."""
    return not gate(pair, tolerance, slowdown, confidence, n_resamples).passed


def _align(
    measured: Mapping[str, float], reference: Mapping[str, float]
) -> tuple[np.ndarray, np.ndarray, bool]:
    """As the gates pair them (stats.match_by_key)."""
    matched = match_by_key(measured, reference)
    return np.array(matched.measured), np.array(matched.reference), matched.paired


def real_pairs(runs: Sequence[Run]) -> Iterator[Pair]:
    """Every window present in two runs, run vs run, in both orientations (either may be the baseline)."""
    for i, ref_run in enumerate(runs):
        for j, meas_run in enumerate(runs):
            if i == j:
                continue
            for key, reference in ref_run.windows.items():
                measured = meas_run.windows.get(key)
                if measured is None:
                    continue
                m, r, paired = _align(measured, reference)
                yield Pair(
                    m,
                    r,
                    paired,
                    key.mode,
                    f"{key.mode}/{key.prompt_class}: {meas_run.label} vs {ref_run.label}",
                )


def pool_pairs(runs: Sequence[Run], trials: int, rng: np.random.Generator) -> Iterator[Pair]:
    """Both sides drawn with replacement from one pool: all recorded samples of the window, all runs.
    Drawn samples have no request keys, so the gate compares them unpaired (ratio of medians)."""
    pools: dict[WindowKey, tuple[np.ndarray, int]] = {}
    for run in runs:
        for key, window in run.windows.items():
            values, n = pools.get(key, (np.empty(0), 0))
            pools[key] = (np.concatenate([values, list(window.values())]), max(n, len(window)))
    keys = sorted(pools)
    for t in range(trials):
        key = keys[t % len(keys)]
        values, n = pools[key]
        yield Pair(
            rng.choice(values, n), rng.choice(values, n), False, key.mode, f"{key.mode}/{key.prompt_class}"
        )


@dataclass(frozen=True)
class NoiseModel:
    """Run-to-run noise of paired requests, from the recorded runs, per mode.

    For every window in two runs: d_k = log(measured_k / reference_k) per request key; the window's
    shift is median(d), the residuals d - shift. Both are pooled per mode with both signs (A/A is
    symmetric: either run could have been the baseline).
    """

    shifts: Mapping[str, np.ndarray]
    residuals: Mapping[str, np.ndarray]
    windows: Mapping[str, list[np.ndarray]]  # recorded reference windows per mode

    @classmethod
    def from_runs(cls, runs: Sequence[Run]) -> NoiseModel:
        shifts: dict[str, list[float]] = {}
        residuals: dict[str, list[float]] = {}
        windows: dict[str, list[np.ndarray]] = {}
        for i, a in enumerate(runs):
            for key, window in a.windows.items():
                windows.setdefault(key.mode, []).append(np.array(list(window.values())))
                for b in runs[i + 1 :]:
                    other = b.windows.get(key)
                    if other is None:
                        continue
                    common = [k for k in window if k in other]
                    if len(common) < 2:
                        continue
                    d = np.log([other[k] / window[k] for k in common])
                    shift = float(np.median(d))
                    shifts.setdefault(key.mode, []).extend([shift, -shift])
                    residuals.setdefault(key.mode, []).extend(list(d - shift) + list(shift - d))
        modes = sorted(shifts)
        return cls(
            {m: np.array(shifts[m]) for m in modes},
            {m: np.array(residuals[m]) for m in modes},
            {m: windows[m] for m in modes},
        )

    @property
    def modes(self) -> list[str]:
        return list(self.shifts)

    def pairs(
        self, trials: int, rng: np.random.Generator, *, repeats: int = 1, shift_scale: float = 1.0
    ) -> Iterator[Pair]:
        """A recorded window as the baseline (its prompts ``repeats`` times), the measured side that
        window times exp(shift + residual) per request: one run-level shift per window (times
        shift_scale), one residual per request. Paired, as the gate is when both runs have the same keys."""
        modes = self.modes
        for t in range(trials):
            mode = modes[t % len(modes)]
            windows = self.windows[mode]
            reference = np.tile(windows[rng.integers(len(windows))], repeats)
            shift = rng.choice(self.shifts[mode]) * shift_scale
            noise = rng.choice(self.residuals[mode], reference.size)
            yield Pair(reference * np.exp(shift + noise), reference, True, mode)


# ------------------------------------------------------------------------------------ validation


@dataclass
class Validation:
    rig: str
    tier: str
    runs: list[Run]
    tolerance: float  # as configured
    tolerances: tuple[float, ...]
    slowdowns: tuple[float, ...]
    confidence: float
    trials: int
    n_resamples: int
    check_trials: int
    seed: int
    settings: list[Setting]
    real_windows: list[tuple[WindowKey, str, str, Any]]  # key, measured run, baseline run, Comparison
    noise: NoiseModel | None = None
    ci_by_order_statistics: int = 0  # real windows whose CI is (mean of 2 lowest, mean of 2 highest) ratios
    seconds: float = 0.0

    @property
    def goal_slowdown(self) -> float:
        return GOAL_SLOWDOWN.get(self.tier, GOAL_SLOWDOWN["cpu"])

    def setting(self, key: str) -> Setting | None:
        return next((s for s in self.settings if s.key == key), None)

    @property
    def mismatches(self) -> int:
        return sum(s.mismatches for s in self.settings)

    def figures(self) -> dict[str, Any]:
        """The headline figures as plain numbers (for pytest-benchmark's extra_info, JSON)."""
        out: dict[str, Any] = {
            "rig": self.rig,
            "trials": self.trials,
            "n_resamples": self.n_resamples,
            "cross_check_mismatches": self.mismatches,
            "seconds": round(self.seconds, 2),
        }
        settings: dict[str, Any] = {}
        for s in self.settings:
            per_tolerance: dict[str, Any] = {}
            for tol in self.tolerances:
                k, n = s.false_alarms(tol)
                per_tolerance[f"{tol:g}"] = {
                    "false_alarm_rate": k / n if n else None,
                    "false_alarms": k,
                    "comparisons": n,
                    "smallest_detected_95": s.smallest_detected(tol),
                    "detection": {f"{sd:g}": s.detection(tol, sd) for sd in self.slowdowns},
                }
            settings[s.key] = {"title": s.title, "n_per_side": s.n_per_side, "tolerance": per_tolerance}
        out["settings"] = settings
        return out


def _evaluate(
    setting: Setting,
    pairs: Iterator[Pair],
    *,
    tolerances: Sequence[float],
    slowdowns: Sequence[float],
    confidence: float,
    n_resamples: int,
    check_trials: int,
) -> Setting:
    ratios: list[float] = []
    highs: list[float] = []
    groups: list[str] = []
    checks: list[Pair] = []
    for pair in pairs:
        c = gate(pair, tolerances[-1], 0.0, confidence, n_resamples)
        ratios.append(c.ratio)
        highs.append(math.nan if c.ci_high is None else c.ci_high)
        groups.append(pair.group)
        setting.labels.append(pair.label)
        if len(checks) < check_trials:
            checks.append(pair)
    setting.ratio = np.array(ratios, dtype=float)
    setting.ci_high = np.array(highs, dtype=float)
    setting.groups = np.array(groups, dtype=object)
    # Cross-check: the derived decisions against direct compare_ratio calls.
    for index, pair in enumerate(checks):
        for tol in tolerances:
            crit = _single(setting, index, tol)
            for sd in (0.0, *slowdowns):
                setting.checked += 1
                if decide(pair, tol, sd, confidence, n_resamples) != bool(sd > crit + TIE):
                    if abs(sd - crit) <= TIE:
                        setting.ties += 1
                    else:
                        setting.mismatches += 1
    return setting


def _single(setting: Setting, index: int, tolerance: float) -> float:
    one = Setting(
        "",
        "",
        "",
        "",
        ratio=setting.ratio[index : index + 1],
        ci_high=setting.ci_high[index : index + 1],
        groups=setting.groups[index : index + 1],
    )
    return float(one.critical(tolerance)[0])


def validate(
    runs: Sequence[Run],
    *,
    tolerance: float = 0.15,
    extra_tolerances: Sequence[float] = EXTRA_TOLERANCES,
    confidence: float = 0.95,
    trials: int = 2000,
    slowdowns: Sequence[float] = SLOWDOWNS,
    n_resamples: int = GATE_RESAMPLES,
    check_trials: int = 200,
    seed: int = 1,
) -> Validation:
    """The false-alarm and power figures of the throughput gate on the given runs of one rig."""
    if not runs:
        raise ValueError("no runs to validate")
    rigs = {r.rig for r in runs}
    if len(rigs) > 1:
        raise ValueError(f"validate one rig at a time, got {sorted(rigs)}")
    start = time.perf_counter()
    tolerances = tuple(sorted({round(t, 6) for t in (*extra_tolerances, tolerance)}))
    rng = np.random.default_rng(seed)
    n_base = int(np.median([len(w) for r in runs for w in r.windows.values()]))
    recorded_repeats = max(r.repeats for r in runs)
    common = dict(
        tolerances=tolerances,
        slowdowns=tuple(slowdowns),
        confidence=confidence,
        n_resamples=n_resamples,
        check_trials=check_trials,
    )
    settings: list[Setting] = []

    real = list(real_pairs(runs))
    if real:
        n_real = sorted({p.measured.size for p in real})
        settings.append(
            _evaluate(
                Setting(
                    "real",
                    "real A/A: run vs run",
                    "every window recorded in two runs, one run as the baseline of the other, "
                    "both orientations; paired by request key",
                    "/".join(map(str, n_real)),
                ),
                iter(real),
                **{**common, "check_trials": len(real)},
            )
        )
    settings.append(
        _evaluate(
            Setting(
                "pool",
                "resampled A/A: one pool, unpaired",
                "both sides drawn with replacement from all recorded samples of the window (all runs); "
                "the drawn samples have no request keys, so the gate compares them unpaired",
                str(n_base),
            ),
            pool_pairs(runs, trials, rng),
            **common,
        )
    )

    model = NoiseModel.from_runs(runs)
    if model.modes:
        variants = [
            (
                "model",
                f"resampled A/A: paired noise model, repeats {recorded_repeats} (as recorded)",
                1,
                1.0,
                False,
            ),
            ("model-r2", f"what-if: repeats {2 * recorded_repeats} (n = {2 * n_base})", 2, 1.0, True),
            ("half-r2", f"what-if: run-level shift halved, repeats {2 * recorded_repeats}", 2, 0.5, True),
            ("noshift", "what-if: no run-level shift", 1, 0.0, True),
            ("noshift-r2", f"what-if: no run-level shift, repeats {2 * recorded_repeats}", 2, 0.0, True),
        ]
        for key, title, repeats, shift_scale, what_if in variants:
            if key == "model":
                description = (
                    "a recorded window as the baseline; measured = baseline x exp(shift + residual), one "
                    "run-level shift per window and one residual per request, both drawn from the recorded "
                    "run-to-run log ratios of that mode (both signs); paired"
                )
            else:
                parts = [f"every prompt measured {repeats} times as often"] if repeats > 1 else []
                if shift_scale == 0:
                    parts.append(
                        "only the per-request noise, as if the baseline had been measured back to back "
                        "with the change on a quiet machine (an optimistic bound)"
                    )
                elif shift_scale != 1:
                    parts.append(
                        f"run-level shifts x {shift_scale:g} (a quieter machine, a baseline from "
                        "several runs)"
                    )
                description = "the noise model with " + "; ".join(parts)
            settings.append(
                _evaluate(
                    Setting(key, title, description, str(n_base * repeats), what_if=what_if),
                    model.pairs(trials, rng, repeats=repeats, shift_scale=shift_scale),
                    **common,
                )
            )

    real_windows = []
    by_order = 0
    if len(runs) >= 2:
        base, other = runs[0], runs[1]
        for key, reference in base.windows.items():
            measured = other.windows.get(key)
            if measured is None:
                continue
            m, r, paired = _align(measured, reference)
            c = compare_ratio(
                m,
                r,
                threshold=1.0 - tolerance,
                gate="throughput",
                subject="validation",
                reference_label="baseline",
                paired=paired,
                confidence=confidence,
                n_resamples=n_resamples,
                start_noise=START_NOISE,
            )
            real_windows.append((key, other.label, base.label, c))
            ratios = np.sort(m / r)
            if (
                paired
                and c.ci_low is not None
                and ratios.size >= 4
                and np.allclose(
                    [c.ci_low, c.ci_high], [ratios[:2].mean(), ratios[-2:].mean()], rtol=1e-9, atol=0
                )
            ):
                by_order += 1

    return Validation(
        rig=runs[0].rig,
        tier=runs[0].tier,
        runs=list(runs),
        tolerance=tolerance,
        tolerances=tolerances,
        slowdowns=tuple(slowdowns),
        confidence=confidence,
        trials=trials,
        n_resamples=n_resamples,
        check_trials=check_trials,
        seed=seed,
        settings=settings,
        real_windows=real_windows,
        noise=model if model.modes else None,
        ci_by_order_statistics=by_order,
        seconds=time.perf_counter() - start,
    )


# ------------------------------------------------------------------------------------ report


def _pct(x: float | None, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    value = x * 100
    if value == 0 or value == 100:
        return f"{value:.0f} %"
    return f"{value:.{digits}f} %"


def _upper(k: int, n: int, level: float = 0.95) -> float:
    """One-sided upper confidence bound of a rate (Clopper-Pearson)."""
    return 1.0 if k >= n else float(scipy_stats.beta.ppf(level, k + 1, n - k))


def _smallest(s: Setting, tol: float, group: str | None = None) -> str:
    value = s.smallest_detected(tol, group)
    return f"> {FINE_SLOWDOWNS[-1] * 100:.0f} %" if value is None else _pct(value)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str | None = None) -> list[str]:
    align = align or "l" + "r" * (len(header) - 1)
    sep = ["---:" if a == "r" else "---" for a in align]
    return [
        "| " + " | ".join(header) + " |",
        "| " + " | ".join(sep) + " |",
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def _feasible(s: Setting, goal: float) -> list[float]:
    """Tolerances (0.5 % grid) at which the setting meets both goals."""
    out = []
    for tol in SWEEP_TOLERANCES:
        k, n = s.false_alarms(float(tol))
        if n and k / n <= MAX_FALSE_ALARM and s.detection(float(tol), goal) >= DETECTION_LEVEL:
            out.append(float(tol))
    return out


def _lowest_safe_tolerance(s: Setting) -> float | None:
    for tol in SWEEP_TOLERANCES:
        k, n = s.false_alarms(float(tol))
        if n and k / n <= MAX_FALSE_ALARM:
            return float(tol)
    return None


def _met_text(feasible: Sequence[float]) -> str:
    return "met only at the edge (tolerance " + _range(feasible) + ")" if len(feasible) == 1 else "met"


def _range(values: Sequence[float]) -> str:
    if not values:
        return "none"
    return f"{values[0]:.3f}" if len(values) == 1 else f"{values[0]:.3f}-{values[-1]:.3f}"


def _resamples_text(n: int) -> str:
    if n == GATE_RESAMPLES:
        return f"{n} resamples, as in the gate"
    return f"{n} resamples here, the gate uses {GATE_RESAMPLES}"


def render(results: Sequence[Validation], command: str, notes: Sequence[str] = ()) -> str:
    lines = [
        "# Validation of the throughput gate's statistics",
        "",
        "Generated by `benchmarks/stats_validation.py`; do not edit by hand, rerun:",
        "",
        f"    {command}",
        "",
    ]
    first = results[0]
    ties = sum(s.ties for r in results for s in r.settings)
    seconds = sum(r.seconds for r in results)
    lines += [
        "## The decision rule",
        "",
        "The throughput gate (`specgate.gates.check_throughput` -> `specgate.stats.compare_ratio`) compares "
        "the decode tok/s of a window (one mode x prompt class x concurrency, one sample per request) with "
        "the stored baseline of that window. When both sides have the same request keys (prompt id and "
        "repeat) the samples are paired and the statistic is the median of the per-request ratios "
        "measured / baseline; otherwise it is the ratio of the two medians. A seeded percentile bootstrap "
        f"({_resamples_text(first.n_resamples)}) gives its {first.confidence * 100:g} % confidence "
        "interval. The window **fails** when the ratio is below 1 - tolerance **and** the upper end of the "
        "interval is below 1: slower than the baseline by more than the tolerance, and significantly "
        "slower (in code: FAIL iff ratio < threshold and ci_high < max(threshold, 1), threshold = "
        "1 - `throughput_tolerance`). A slowdown smaller than the tolerance therefore never fails on its "
        "own; it is caught only when noise adds to it. A side with a single value, or with no spread, is "
        "decided by the ratio alone.",
        "",
        "A false alarm is a failing A/A comparison (no change between the two sides). The power for a "
        "slowdown s is the share of comparisons that fail when the measured samples are multiplied by "
        "1 - s. Every comparison is one real `compare_ratio` call; the decisions for the other slowdowns "
        "and tolerances follow from that call's ratio and interval, which scale with the measured side "
        "(seeded bootstrap). The first "
        f"{first.check_trials} comparisons of every setting (all of the real ones) were also decided by "
        "direct calls at every tolerance and slowdown of the tables: "
        f"{sum(s.checked for r in results for s in r.settings)} decisions, "
        f"{sum(r.mismatches for r in results)} disagreements"
        + (f" ({ties} more exactly on the threshold, where rounding decides)" if ties else "")
        + f". The whole validation took {seconds:.0f} s.",
        "",
    ]
    for v in results:
        lines += _render_rig(v, multiple=len(results) > 1, notes=notes)
    missing = [tier for tier in GOAL_SLOWDOWN if tier not in {r.tier for r in results}]
    if missing:
        lines += ["## Not assessed", ""]
        lines += [
            f"- {tier} tier (goal: detect {GOAL_SLOWDOWN[tier] * 100:g} %): no {tier}-tier reports were "
            "given; rerun this script on recorded reports of that tier."
            for tier in missing
        ]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _mc(rate: float, n: int) -> str:
    """Half-width (percentage points) of a 95 % interval of a rate estimated from n comparisons."""
    return f"{1.96 * math.sqrt(rate * (1 - rate) / n) * 100:.2g}" if n else "-"


def _render_rig(v: Validation, *, multiple: bool, notes: Sequence[str] = ()) -> list[str]:
    h = "##" if not multiple else "###"
    lines = [f"## Rig {v.rig} ({v.tier} tier)", ""] if multiple else []
    machines = sorted({r.machine for r in v.runs if r.machine})
    rows = [
        [
            f"`{r.label}`",
            r.written_at or "-",
            r.machine or "-",
            str(r.repeats),
            str(len(r.windows)),
            str(r.n_samples),
        ]
        for r in v.runs
    ]
    lines += [
        f"{h} Data",
        "",
        f"Rig `{v.rig}` ({v.tier} tier) on {', '.join(machines) or 'an unrecorded machine'}: "
        f"{len(v.runs)} complete runs, each from its own server starts, samples = decode tok/s of "
        "single requests (`measurements[*].records[*].decode_tokens_per_s`).",
        "",
        *_table(["report", "written", "machine", "repeats", "windows", "samples"], rows, "llllrr"),
        "",
        *(f"Note: {note}" for note in notes),
        *([""] if notes else []),
    ]
    if v.real_windows:
        tols = v.tolerances
        rows = []
        for key, _m, _b, c in v.real_windows:
            ci = "-" if c.ci_low is None else f"{c.ci_low:.3f}-{c.ci_high:.3f}"
            verdicts = []
            for tol in tols:
                fails = c.ratio < 1 - tol and (c.ci_high is None or c.ci_high < max(1 - tol, 1.0))
                verdicts.append("FAIL" if fails else "pass")
            rows.append([key.mode, key.prompt_class, str(c.n_measured), f"{c.ratio:.3f}", ci, *verdicts])
        lines += [
            f"{h} Real run vs run",
            "",
            f"`{v.real_windows[0][1]}` measured against `{v.real_windows[0][2]}` as the baseline, window "
            "by window (paired by request key):",
            "",
            *_table(
                [
                    "mode",
                    "class",
                    "n",
                    "ratio",
                    f"{v.confidence * 100:g} % CI",
                    *(f"tol {t:g}" for t in tols),
                ],
                rows,
                "llrrr" + "l" * len(tols),
            ),
            "",
        ]
        if v.ci_by_order_statistics:
            n_sizes = sorted({c.n_measured for *_, c in v.real_windows})
            lines += [
                f"In {v.ci_by_order_statistics} of these {len(v.real_windows)} windows (n = "
                f"{'/'.join(map(str, n_sizes))}) the bootstrap interval is exactly from the mean of the two "
                "lowest to the mean of the two highest per-request ratios. With so few requests, one "
                "request much faster than its baseline lifts the upper end halfway towards it, and a real "
                "slowdown of the window then passes as not significant.",
                "",
            ]
    if v.noise is not None:
        rows = []
        for mode in v.noise.modes:
            shifts = np.exp(v.noise.shifts[mode][::2])
            res = np.exp(v.noise.residuals[mode])
            lo, hi = np.quantile(res, [0.025, 0.975])
            rows.append(
                [
                    mode,
                    str(shifts.size),
                    f"{shifts.min():.3f}-{shifts.max():.3f}",
                    f"{lo:.3f}-{hi:.3f}",
                    f"{res.min():.3f}-{res.max():.3f}",
                ]
            )
        lines += [
            f"{h} Recorded run-to-run noise",
            "",
            "Per window in two runs: the run-level shift (median of the per-request ratios of one run to "
            "the other) and the per-request residuals around it (as ratios, both signs pooled per mode). "
            "This is what the paired noise model resamples.",
            "",
            *_table(
                ["mode", "window pairs", "shifts (min-max)", "residuals (2.5-97.5 %)", "residuals (min-max)"],
                rows,
            ),
            "",
        ]
    lines += [f"{h} Settings", ""]
    for s in v.settings:
        lines.append(f"- **{s.title}** ({s.n} comparisons, n = {s.n_per_side} per side): {s.description}.")
    lines += [
        "",
        f"Resampled settings: {v.trials} comparisons each, modes in turn; seed {v.seed}. Their rates carry "
        f"a Monte Carlo error of about +-{_mc(0.01, v.trials)} points near 1 % and "
        f"+-{_mc(DETECTION_LEVEL, v.trials)} points near {DETECTION_LEVEL * 100:g} % (95 %). "
        "`what-if` rows are not measurements of the gate as configured but of a changed protocol, "
        "modelled from the same recordings.",
        "",
    ]

    # False alarms
    rows = []
    for s in v.settings:
        cells = []
        for tol in v.tolerances:
            k, n = s.false_alarms(tol)
            cells.append(f"{_pct(k / n if n else None, 2)} ({k}/{n}; <= {_pct(_upper(k, n))})")
        rows.append([s.title, *cells])
    lines += [
        f"{h} False alarms (A/A)",
        "",
        "Share of failing A/A comparisons; in brackets the count and the one-sided 95 % upper bound of "
        "the rate (Clopper-Pearson).",
        "",
        *_table(
            [
                "setting",
                *(f"tolerance {t:g}" + (" (configured)" if t == v.tolerance else "") for t in v.tolerances),
            ],
            rows,
        ),
        "",
    ]

    # Power
    rows = []
    for tol in v.tolerances:
        for s in v.settings:
            rows.append(
                [
                    f"{tol:g}" + (" (configured)" if tol == v.tolerance else ""),
                    s.title,
                    *(_pct(s.detection(tol, sd), 0) for sd in v.slowdowns),
                    _smallest(s, tol),
                ]
            )
    lines += [
        f"{h} Power: detection rate of injected slowdowns",
        "",
        "Share of comparisons that fail when the measured samples are slowed down by s; last column: the "
        f"smallest slowdown (0.5 % steps) detected in >= {DETECTION_LEVEL * 100:g} % of the comparisons.",
        "",
        *_table(
            [
                "tolerance",
                "setting",
                *(f"{sd * 100:g} %" for sd in v.slowdowns),
                f"detected {DETECTION_LEVEL * 100:g} %",
            ],
            rows,
            "ll" + "r" * (len(v.slowdowns) + 1),
        ),
        "",
    ]

    # Per mode
    model = v.setting("model")
    if model is not None and len(set(model.groups)) > 1:
        rows = []
        for mode in sorted(set(model.groups)):
            cells = []
            for tol in v.tolerances:
                k, n = model.false_alarms(tol, mode)
                cells += [_pct(k / n if n else None, 2), _smallest(model, tol, mode)]
            rows.append([mode, *cells])
        header = ["mode"]
        for tol in v.tolerances:
            header += [f"false alarms, tol {tol:g}", f"detected {DETECTION_LEVEL * 100:g} %, tol {tol:g}"]
        lines += [f"{h} Per mode (paired noise model, as recorded)", "", *_table(header, rows), ""]

    # Sweep
    goal = v.goal_slowdown
    rows = []
    for s in v.settings:
        safe = _lowest_safe_tolerance(s)
        feasible = _feasible(s, goal)
        rows.append(
            [
                s.title,
                "none" if safe is None else f"{safe:.3f}",
                "-" if safe is None else _smallest(s, safe),
                "-" if safe is None else _pct(s.detection(safe, goal), 0),
                _range(feasible),
            ]
        )
    lines += [
        f"{h} Which tolerance meets the goals?",
        "",
        f"Goals: at most {MAX_FALSE_ALARM * 100:g} % false alarms, and a {goal * 100:g} % slowdown "
        f"detected in >= {DETECTION_LEVEL * 100:g} % of the comparisons ({v.tier} tier). Tolerances "
        "swept from 0 to 0.30 in 0.005 steps; the same comparisons as above.",
        "",
        *_table(
            [
                "setting",
                "lowest tolerance with <= 1 % false alarms",
                "smallest slowdown detected 95 %",
                f"detection of {goal * 100:g} %",
                "tolerances meeting both goals",
            ],
            rows,
        ),
        "",
    ]
    lines += [f"{h} Verdict", "", *_verdict(v), ""]
    return lines


def _verdict(v: Validation) -> list[str]:
    goal = v.goal_slowdown
    tol = v.tolerance
    out: list[str] = []
    real, model = v.setting("real"), v.setting("model")
    primary = model or v.setting("pool")
    assert primary is not None
    k, n = primary.false_alarms(tol)
    fa_ok = n > 0 and k / n <= MAX_FALSE_ALARM
    det = primary.detection(tol, goal)
    det_ok = det >= DETECTION_LEVEL
    out.append(
        f"- **False alarms <= {MAX_FALSE_ALARM * 100:g} % at the configured tolerance {tol:g}: "
        f"{'met' if fa_ok else 'NOT met'}** by the model of the recorded noise "
        f"({_pct(k / n, 2)}, {k}/{n}, 95 % upper bound {_pct(_upper(k, n), 2)}; {primary.title})."
    )
    if real is not None:
        rk, rn = real.false_alarms(tol)
        out.append(
            f"  The real run-vs-run comparisons gave {rk} failures in {rn}: too few to show a rate of "
            f"{MAX_FALSE_ALARM * 100:g} % (their 95 % upper bound is {_pct(_upper(rk, rn))}); with no "
            f"failure, about {math.ceil(3 / MAX_FALSE_ALARM)} independent A/A windows would be needed, and "
            "the windows of one run share its server start, so more than "
            f"{math.ceil(3 / MAX_FALSE_ALARM / max(1, len(v.runs[0].windows)))} runs."
        )
    out.append(
        f"- **Detect a {goal * 100:g} % slowdown ({v.tier} tier) at the configured tolerance {tol:g}: "
        f"{'met' if det_ok else 'NOT met'}** ({_pct(det, 0)} detected; the smallest slowdown detected 95 % "
        f"of the time is {_smallest(primary, tol)})."
    )
    if not det_ok and tol >= goal:
        out.append(
            f"  By construction: a window fails only when its ratio is below 1 - tolerance = {1 - tol:.2f}, "
            f"so a {goal * 100:g} % slowdown is caught only when noise adds to it."
        )
    if fa_ok and det_ok:
        out.append("- Both goals are met as configured.")
        return out
    out.append("- **What would meet both goals** (from the sweep above):")
    any_ok = False
    for s in v.settings:
        feasible = _feasible(s, goal)
        if feasible:
            any_ok = True
            t = feasible[0]
            fk, fn = s.false_alarms(t)
            out.append(
                f"  - {s.title}: tolerance {_range(feasible)}; e.g. at {t:.3f}: {_pct(fk / fn, 2)} false "
                f"alarms, {_pct(s.detection(t, goal), 0)} of {goal * 100:g} % slowdowns detected"
                + (
                    " (a single step of the sweep: at the edge, within the Monte Carlo error)."
                    if len(feasible) == 1
                    else "."
                )
            )
        else:
            safe = _lowest_safe_tolerance(s)
            if safe is not None:
                out.append(
                    f"  - {s.title}: no tolerance; with <= {MAX_FALSE_ALARM * 100:g} % false alarms "
                    f"(tolerance >= {safe:.3f}) the smallest slowdown detected 95 % of the time is "
                    f"{_smallest(s, safe)}."
                )
            else:
                out.append(f"  - {s.title}: no tolerance keeps false alarms <= {MAX_FALSE_ALARM * 100:g} %.")
    if not any_ok:
        out.append(
            "  None of the modelled changes meets both goals on this data; the run-to-run noise must shrink "
            "(a quieter machine, a reference measured in the same session, more runs)."
        )
    model_r2, noshift, half = v.setting("model-r2"), v.setting("noshift"), v.setting("half-r2")
    if model is not None and model_r2 is not None and noshift is not None and v.noise is not None:
        low = min(v.tolerances)
        fa = {s.key: s.false_alarms(low) for s in (model, model_r2, noshift)}
        worst = max(float(1 - np.exp(-np.max(np.abs(x)))) for x in v.noise.shifts.values())
        out.append(
            f"- The run-level shift dominates: all requests of a window slower or faster together between "
            f"two runs (recorded: up to {worst * 100:.0f} %). At tolerance {low:g} the noise model gives "
            f"{_pct(fa['model'][0] / fa['model'][1], 1)} false alarms with the shift and "
            f"{_pct(fa['noshift'][0] / fa['noshift'][1], 1)} without; repeats 2 raise them to "
            f"{_pct(fa['model-r2'][0] / fa['model-r2'][1], 1)}, because repeats narrow the interval around "
            "the shift instead of removing it. More repeats help only once the shift is small"
            + (
                f": with shifts halved (up to about {worst * 50:.0f} %) and repeats 2 the goals are "
                + (_met_text(_feasible(half, goal)) if _feasible(half, goal) else "still not met")
                if half is not None
                else ""
            )
            + ". A baseline averaged over several runs, a machine with nothing else running, and pinned "
            "cores are the ways to get there; whether the server start itself shifts throughput cannot be "
            "told apart from machine load with these runs."
        )
    out.append(
        f"- Caveat: the noise model is estimated from {len(v.runs)} runs "
        f"({max(0, len(v.runs) * (len(v.runs) - 1) // 2)} run pairs); its shift pool has one value per "
        "window and run pair, so the tails (and a 1 % rate) rest on few real events. Add runs to "
        "`fixtures/recorded/<tier>/reports/` and rerun."
    )
    return out


# ------------------------------------------------------------------------------------ main


def _command(argv: Sequence[str]) -> str:
    return " ".join(["python", "benchmarks/stats_validation.py", *(shlex.quote(a) for a in argv)])


def main(argv: Sequence[str] | None = None, *, out: Callable[[str], Any] = print) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("reports", nargs="+", help="specgate report JSON files (complete runs)")
    parser.add_argument("--tolerance", type=float, default=0.15, help="the rig's throughput_tolerance (0.15)")
    parser.add_argument("--confidence", type=float, default=0.95, help="the rig's confidence (0.95)")
    parser.add_argument("--trials", type=int, default=2000, help="comparisons per resampled setting (2000)")
    parser.add_argument(
        "--n-resamples",
        type=int,
        default=2000,
        help="bootstrap resamples inside compare_ratio (2000, as the gate)",
    )
    parser.add_argument(
        "--check-trials",
        type=int,
        default=200,
        help="comparisons per setting also decided by direct calls at every cell (200)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--note", action="append", default=[], help="a line for the Data section (repeatable)"
    )
    parser.add_argument("--start-noise", type=float, default=0.0,
                        help="the rig's [gates] start_noise, as the gate uses it (0)")
    parser.add_argument("--write-docs", action="store_true", help=f"write the report to --docs ({DOCS_PATH})")
    parser.add_argument("--docs", type=Path, default=DOCS_PATH, help="where --write-docs writes")
    args = parser.parse_args(argv)
    global START_NOISE
    START_NOISE = args.start_noise
    argv = list(sys.argv[1:] if argv is None else argv)

    runs = [load_report(p) for p in args.reports]
    by_rig: dict[str, list[Run]] = {}
    for run in runs:
        by_rig.setdefault(run.rig, []).append(run)
    start = time.perf_counter()
    results = [
        validate(
            rig_runs,
            tolerance=args.tolerance,
            confidence=args.confidence,
            trials=args.trials,
            n_resamples=args.n_resamples,
            check_trials=args.check_trials,
            seed=args.seed,
        )
        for rig_runs in by_rig.values()
    ]
    text = render(results, _command(argv), args.note)
    out(text)
    print(f"{time.perf_counter() - start:.1f} s", file=sys.stderr)
    if args.write_docs:
        args.docs.parent.mkdir(parents=True, exist_ok=True)
        args.docs.write_text(text)
        print(f"wrote {args.docs}", file=sys.stderr)
    mismatches = sum(r.mismatches for r in results)
    if mismatches:
        print(f"error: {mismatches} derived decisions disagree with compare_ratio", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
