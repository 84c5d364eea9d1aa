"""A session's chance of going red with nothing changed (an A/A), before any server starts.

Each gate's chance of a FAIL, or of an outcome that fails the run, follows its own rule at its
confidence (:func:`gate_risk`); the session's bound is their sum (a union bound). ``gating = auto``
gates the smallest chances first while it stays at most AUTO_RED_BOUND (:func:`choose_auto`)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

import numpy as np

from specgate.decide.history import StartHistory
from specgate.decide.outcome import AUTO_FAMILY_FALSE_ALARM, Family, family
from specgate.decide.paired import repeated_coverage, spread_quantile

if TYPE_CHECKING:
    from specgate.decide.settings import WindowSettings

GateTest = tuple[str, str, str, int]  # gate, mode, prompt class, concurrency
AUTO_RED_BOUND = 0.05  # gating = auto keeps a red A/A at most this likely
HL_EFFICIENCY = 3 / math.pi  # HL's variance is the mean's / this (normal data)
SIMULATED = 4000  # A/A sessions a two-look A/B is simulated over (seeded)
_N = NormalDist()


@dataclass(frozen=True)
class GateRisk:
    """One gate test's chance in an A/A of a FAIL and of ending undecided (``undecided_outcome``
    says which outcome), and how it was had."""

    test: GateTest
    fail: float
    undecided: float
    how: str | dict[str, Any]  # a named case ("TTFT"), or the figures it was had from
    undecided_outcome: str = "undecided"  # the outcome policy key of the chance in ``undecided``
    modelled: bool = True  # False: only the interval's own FAIL level counted

    def red(self, gating: str | None, policy: Mapping[str, str]) -> float:
        """The chance it turns the run red under ``gating`` (None: the outcome policy)."""
        if gating == "report":
            return 0.0
        fails_run = (gating == "gate" and self.undecided_outcome == "undecided") or \
            policy.get(self.undecided_outcome, "skip") == "fail"
        return min(1.0, self.fail + (self.undecided if fails_run else 0.0))


@dataclass(frozen=True)
class RedRuns:
    """The session's gates, each with its chance of turning an A/A red, and the bound over them."""

    gates: tuple[tuple[GateRisk, str | None, float], ...]  # (risk, gating, its red chance)
    family: Family

    @property
    def bound(self) -> float:
        return min(1.0, sum(red for _, _, red in self.gates))

    @property
    def fail_bound(self) -> float:
        return min(1.0, sum(min(risk.fail, red) for risk, _, red in self.gates))

    def to_dict(self) -> dict[str, Any]:
        counted = sorted((g for g in self.gates if g[1] != "report"), key=lambda g: -g[2])
        return {"bound": self.bound, "fail_bound": self.fail_bound, "gates_counted": len(counted),
                "not_modelled": dict(Counter(str(r.how) for r, _, _ in counted if not r.modelled)),
                "confidence": self.family.confidence, "limit": AUTO_RED_BOUND,
                "largest": [{"gate": r.test[0], "mode": r.test[1], "prompt_class": r.test[2],
                             "concurrency": r.test[3], "red": red, "fail": r.fail, "how": r.how,
                             "gating": gating} for r, gating, red in counted[:5] if red > 0]}


def _t_cdf(x: float, dof: int) -> float:
    from scipy.special import stdtr  # here only: scipy stays off the plugin's import path

    return float(stdtr(dof, x))


def history_risk(test: GateTest, history: StartHistory, tolerance: float, confidence: float,
                 what: str) -> GateRisk:
    """A new start against a stored history's prediction interval: t probabilities."""
    q = spread_quantile(confidence, history.dof)
    half = history.half_width(confidence)
    how = {"kind": "history", "starts": history.starts, "what": what}
    if half <= 0:
        return GateRisk(test, 0.0, 0.0, {**how, "spread": 0.0})
    line = math.log1p(-tolerance) / (half / q)  # the threshold on the predictive scale
    fail, red = _t_cdf(line - q, history.dof), _t_cdf(line + q, history.dof)
    return GateRisk(test, fail, red - fail, {**how, "spread": history.log_sd, "half": half,
                                             "dof": history.dof, "q": q})


def normal_risk(test: GateTest, offset_sd: float, noise_se: float, half: float, line: float,
                how: dict[str, Any]) -> GateRisk:
    """An estimate N(0, offset_sd^2 + noise_se^2) decided against ``line`` (log units) with a
    half-width ``half``: FAIL below line - half, undecided up to line + half."""
    sd = math.hypot(offset_sd, noise_se)
    if sd <= 0:
        return GateRisk(test, 0.0, 0.0 if half < -line else 1.0, how)
    fail, red = _N.cdf((line - half) / sd), _N.cdf((line + half) / sd)
    return GateRisk(test, fail, red - fail, how)


@cache
def two_looks(offset_sd: float, pair_sd: float, first: int, extra: int, fold: float, line: float,
              confidence: float) -> tuple[float, float]:
    """(FAIL, undecided) of an A/B window looked at twice, by the gate's normal model (seeded)."""
    rng = np.random.default_rng(62)
    per_look = repeated_coverage(confidence, first / (first + extra))
    q = _N.inv_cdf(0.5 + per_look / 2) / math.sqrt(HL_EFFICIENCY)
    offset = rng.normal(0.0, offset_sd, SIMULATED)
    one = rng.normal(0.0, pair_sd / math.sqrt(first), SIMULATED)
    more = rng.normal(0.0, pair_sd / math.sqrt(extra), SIMULATED)
    e1, h1 = offset + one, q * pair_sd / math.sqrt(first) + fold
    e2 = offset + (first * one + extra * more) / (first + extra)
    h2 = q * pair_sd / math.sqrt(first + extra) + fold
    open1 = (e1 + h1 >= line) & (e1 - h1 <= line)
    fail = (e1 + h1 < line) | (open1 & (e2 + h2 < line))
    undecided = open1 & (e2 + h2 >= line) & (e2 - h2 <= line)
    return float(fail.mean()), float(undecided.mean())


def pair_spread(entry: Any) -> float | None:
    """The SD of one pair's log ratio from this entry's repeats; None without repeats."""
    keys = entry.sample_keys or []
    groups: dict[str, list[float]] = {}
    for key, value in zip(keys, entry.decode_tokens_per_s):
        if value > 0:
            groups.setdefault(key.rsplit("#", 1)[0], []).append(math.log(value))
    dof = sum(len(v) - 1 for v in groups.values())
    if dof < 2:
        return None
    squares = sum((x - sum(v) / len(v)) ** 2 for v in groups.values() for x in v)
    return math.sqrt(2 * squares / dof)


def ab_risk(test: GateTest, window: WindowSettings, stored: Any, pairs: int,
            extra: int) -> GateRisk:
    """A live A/B throughput gate; ``pairs`` at the first look, ``extra`` in its follow-up."""
    gates = window.thresholds
    offset = math.log1p(gates.start_pair_spread)
    confidence = window.confidence
    look = repeated_coverage(confidence, pairs / (pairs + extra)) if extra else confidence
    fold = spread_quantile(look, gates.start_pair_dof) * offset  # as the gate folds it in
    line = math.log1p(-window.ab_tolerance)
    noise = pair_spread(stored) if stored is not None else None
    how = {"kind": "ab", "spread": gates.start_pair_spread, "fold": fold, "noise": bool(noise)}
    if noise and extra:
        fail, undecided = two_looks(offset, noise, pairs, extra, fold, line, confidence)
        return GateRisk(test, fail, undecided, {**how, "looks": [pairs, extra]})
    se = (noise or 0.0) / math.sqrt(pairs * HL_EFFICIENCY)
    return normal_risk(test, offset, se, fold + spread_quantile(look) * se, line, how)


def gate_risk(test: GateTest, window: WindowSettings, store: Any, machine: str | None, *,
              pairs: int, extra: int) -> GateRisk:
    """One gate test's chance of a red A/A by its own rule, at ``window``'s confidence."""
    gate = test[0]
    if gate == "lossless" or (gate == "acceptance" and window.comparing == "ab"):
        return GateRisk(test, 0.0, 0.0, "identical builds: the same outputs and accepted tokens")
    if gate == "ttft":
        return _interval_only(test, window, "TTFT")
    if gate == "throughput" and window.comparing == "ab":
        return ab_risk(test, window, window.stored(store), pairs, extra)
    if gate == "backfire":
        return backfire_risk(test, window, store)
    entry = window.stored(store, machine)
    if entry is None:
        kind = "other_machine" if window.stored(store) is not None else "not_stored"
        return GateRisk(test, 0.0, 1.0, kind.replace("_", " "), undecided_outcome=kind)
    if gate == "acceptance":
        return _interval_only(test, window, "acceptance against stored counters")
    ratio, history, tolerance = window.stored_history(entry)
    if history.usable:
        return history_risk(test, history, tolerance, window.confidence,
                            "stored ratios" if ratio else "stored starts")
    noise = pair_spread(entry) or 0.0
    start = math.sqrt(2) * math.log1p(window.thresholds.start_noise)
    se = noise / math.sqrt(pairs * HL_EFFICIENCY)
    half = spread_quantile(window.confidence) * (se + start)
    return normal_risk(test, start, se, half, math.log1p(-tolerance),
                       {"kind": "start noise", "starts": history.starts,
                        "noise": window.thresholds.start_noise})


def _interval_only(test: GateTest, window: WindowSettings, what: str) -> GateRisk:
    """A gate whose undecided chance is unknown before the run: its FAIL level."""
    return GateRisk(test, (1 - window.confidence) / 2, 0.0, what, modelled=False)


def backfire_risk(test: GateTest, window: WindowSettings, store: Any) -> GateRisk:
    """The backfire gate from the stored ratio to no speculation and its interval."""
    if window.declared_backfire is not None:
        return GateRisk(test, 0.0, 0.0, "a declared backfire never fails the run")
    entry = window.stored(store)
    stored = entry.ratio_to_reference if entry is not None else None
    if stored is None or not stored.ci_low or not stored.ci_high:
        return _interval_only(test, window, "backfire with no stored ratio")
    se = math.log(stored.ci_high / stored.ci_low) / 2 / spread_quantile(0.95)
    half = spread_quantile(window.confidence) * se
    shifted = math.log(window.thresholds.min_speedup) - math.log(stored.ratio)
    return normal_risk(test, 0.0, se, half, shifted,
                       {"kind": "stored ratio", "ratio": stored.ratio})


@dataclass(frozen=True)
class Choice:
    """What ``gating = auto`` chose: each auto gate's gating and why, the family, the red runs."""

    gating: dict[GateTest, tuple[str, str]]
    red_runs: RedRuns


def choose_auto(tests: Sequence[GateTest], setting: Callable[[GateTest], str | None],
                risk_at: Callable[[GateTest, float], GateRisk], counts: Callable[[GateTest], bool],
                *, confidence: float, controlled: float | None, policy: Mapping[str, str],
                limit: float = AUTO_RED_BOUND) -> Choice:
    """The gating that keeps a red A/A at most ``limit``: fixed gates as set, then auto gates
    smallest chance first, as many as fit. ``counts``: the test is one of the family's."""
    auto = [t for t in tests if setting(t) == "auto"]
    counted_fixed = sum(1 for t in tests if setting(t) not in ("auto", "report") and counts(t))
    free = [t for t in auto if not counts(t)]  # lossless, a declared backfire: not in the family
    ranked = [t for t in auto  # those with something to compare on this machine
              if counts(t) and risk_at(t, confidence).undecided_outcome == "undecided"]

    def with_gates(k: int) -> Choice:
        fam = family(confidence, controlled, counted_fixed + k)
        risks = {t: risk_at(t, fam.confidence) for t in tests}
        chosen = set(sorted(ranked, key=lambda t: risks[t].red("gate", policy))[:k])
        chosen |= {t for t in free if risks[t].red("gate", policy) == 0}
        gating = {t: ("gate" if t in chosen else "report") for t in auto}
        rows = tuple((risks[t], g, risks[t].red(g, policy)) for t in tests
                     for g in [gating.get(t, setting(t) if setting(t) != "auto" else None)])
        return Choice({t: (gating[t], _why(risks[t], gating[t], fam)) for t in auto},
                      RedRuns(rows, fam))

    # the most auto gates that keep the bound within the limit (bisected)
    low, high, best = 0, len(ranked), with_gates(0)
    while low < high:
        middle = (low + high + 1) // 2
        tried = with_gates(middle)
        # the Bonferroni FAIL levels alone sum to the limit exactly
        if tried.red_runs.bound <= limit + 1e-12:
            low, best = middle, tried
        else:
            high = middle - 1
    return best


def _why(risk: GateRisk, gating: str, fam: Family) -> dict[str, Any]:
    """Why ``gating = "auto"`` chose ``gating`` for a gate test."""
    return {"why": "red run", "chance": risk.red("gate", {}), "confidence": fam.confidence,
            "how": risk.how, "reported": gating != "gate"}


def for_run(run: Any, tests: Sequence[GateTest]) -> Choice:
    """:func:`choose_auto` for a run's settings and its selected gate ``tests``."""
    rig = run.rig
    controlled = rig.gates.family_false_alarm
    if controlled is None and "auto" in run.gating.values():
        controlled = AUTO_FAMILY_FALSE_ALARM
    prompts = {c.name: len(c.prompts) for c in rig.prompt_classes}

    def risk_at(test: GateTest, confidence: float) -> GateRisk:
        _, mode, prompt_class, concurrency = test
        window = run.window(mode, prompt_class, concurrency).with_family(confidence)
        rounds = rig.follow_up_rounds(mode, prompt_class, backfire=window.comparing == "duet")
        n = prompts.get(prompt_class, 1)
        return gate_risk(test, window, run.store, run.machine, pairs=n * rig.protocol.repeats,
                         extra=n * rounds)

    def counts(test: GateTest) -> bool:  # one of the family: an interval that can fail the run
        return test[0] != "lossless" and not (test[0] == "backfire"
                                              and rig.declared_backfire_for(*test[1:3]))

    return choose_auto(list(dict.fromkeys(tests)), lambda t: run.gating.get(t[0]), risk_at, counts,
                       confidence=rig.gates.confidence, controlled=controlled,
                       policy=run.outcome_policy)
