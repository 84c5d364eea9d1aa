"""Config advice (issue 54): from one run's report, the tok/s ratio against no speculation each
speculative mode would reach at every k from 1 to the k it served, per class and concurrency:
ratio(k) = AL(k) / c(k), c(k) a step's cost in plain decode steps between two bounds or fitted
(the model and its intervals: :data:`ASSUMPTIONS`, docs/advice.md).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from dataclasses import astuple, dataclass, field
from functools import partial
from pathlib import Path
from statistics import NormalDist
from typing import Any

from specgate.advise import schedule
from specgate.advise.plot import RatioPanel, RatioSeries, draw_ratio_panels
from specgate.advise.spans import BOUNDS, CONSTANT, FITTED, LINEAR, SHORT, Span, simple_table
from specgate.config.locations import writable_folder
from specgate.config.rig import load_rig
from specgate.decide.stats import wilson_interval
from specgate.errors import SpecgateError
from specgate.measure.client import RequestRecord
from specgate.measure.per_request import accepted_per_position, agreement
from specgate.report.plots import MODE_COLORS
from specgate.store.saved_report import read_saved_report

# Keys of a speculative config that change what a drafter proposes or how much of it is accepted,
# not what a step costs: modes differing only in these share one step-cost line c0 + s*k.
COST_NEUTRAL_KEYS = frozenset({"num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min",
                               "synthetic_acceptance_length"})
DEFAULT_CONFIDENCE = 0.95


class AdviceError(SpecgateError):
    """A report advice cannot be drawn from; the message names the file and the key."""


def _divide(numerator: Span, cost: Span) -> Span:
    """AL / c with ends propagated: the low end from the lowest AL and the highest cost."""
    def q(a: float, c: float) -> float:
        return a / c if c > 0 else math.inf

    value = (None if numerator.value is None or cost.value is None
             else q(numerator.value, cost.value))
    return Span(value, q(numerator.low, cost.high), q(numerator.high, cost.low))


# -- acceptance ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Acceptance:
    """One window's draft counters: drafts and accepted tokens per draft position 1..K."""

    drafts: float
    accepted_per_position: tuple[float, ...]
    confidence: float = DEFAULT_CONFIDENCE
    # each interval is over drafts / design_effect trials (:func:`design_effect`; 1: independent)
    design_effect: float = 1.0

    @property
    def served_k(self) -> int:
        return len(self.accepted_per_position)

    def acceptance_length(self, k: int) -> float:
        return 1.0 + math.fsum(a / self.drafts for a in self.accepted_per_position[:k])

    def acceptance_length_span(self, k: int) -> Span:
        """AL(k) with its interval: AL(K) x that of AL(k) / AL(K) = (1 + S) / (1 + S + T), S the
        shares of positions 1..k, T those of k+1..K, each position a Wilson interval at
        1 - (1 - confidence) / K (Bonferroni); the low end takes S lowest, T highest."""
        each, n = 1 - (1 - self.confidence) / self.served_k, self.design_effect
        bounds = [wilson_interval(a / n, self.drafts / n, each) for a in self.accepted_per_position]
        s_lo, s_hi = (math.fsum(b[j] for b in bounds[:k]) for j in (0, 1))
        t_lo, t_hi = (math.fsum(b[j] for b in bounds[k:]) for j in (0, 1))
        lo, hi = (1 + s_lo) / (1 + s_lo + t_hi), (1 + s_hi) / (1 + s_hi + t_lo)
        full = self.acceptance_length(self.served_k)
        # AL(k) >= 1 whatever the shares' ends say
        return Span(self.acceptance_length(k), max(1.0, full * lo), full * hi)

    def served_cost(self, ratio: Span) -> Span:
        """c(K) = AL(K) / R, ends propagated."""
        full = self.acceptance_length(self.served_k)
        return Span(full / ratio.value, full / ratio.high, full / ratio.low)


# -- step costs ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class CostFit:
    """c(k) = c0 + s k fitted by weighted least squares to the step costs measured at two or more k
    (one drafter, one class and concurrency), each weighted by its interval's width."""

    c0: float
    slope: float
    covariance: tuple[tuple[float, float], tuple[float, float]]
    z: float  # the normal quantile of the intervals it gives
    points: tuple[tuple[str, int, Span], ...]  # (mode, k, c(k) measured)

    def at(self, k: int) -> Span:
        (v00, v01), (_, v11) = self.covariance
        value = self.c0 + self.slope * k
        half = self.z * math.sqrt(max(0.0, v00 + 2 * k * v01 + k * k * v11))
        return Span(value, value - half, value + half)

    def describe(self) -> str:
        measured = ", ".join(f"c({k}) = {c.text()} ({mode})" for mode, k, c in self.points)
        return f"fitted c(k) = {self.c0:.2f} + {self.slope:.3f} k from {measured}"


def fit_step_cost(points: Sequence[tuple[str, int, Span]], confidence: float) -> CostFit | None:
    """The least-squares line through (k, c(k)) points, each weighted by 1 / sigma^2 (sigma: its
    interval's half-width over the normal quantile), the covariance scaled up by the residual
    chi-square per degree of freedom when above 1; None with fewer than two distinct k."""
    import numpy as np

    if len({k for _, k, _ in points}) < 2:
        return None
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    ks = np.array([float(k) for _, k, _ in points])
    cs = np.array([c.value for _, _, c in points], dtype=float)
    sigmas = np.array([max((c.high - c.low) / (2 * z), 1e-6 * abs(c.value or 1.0))
                       for _, _, c in points])
    w = 1 / sigmas**2
    x = np.column_stack([np.ones_like(ks), ks])
    normal = x.T @ (w[:, None] * x)
    beta = np.linalg.solve(normal, x.T @ (w * cs))
    covariance = np.linalg.inv(normal)
    if len(points) > 2:
        chi2 = float(np.sum(w * (cs - x @ beta) ** 2))
        covariance *= max(1.0, chi2 / (len(points) - 2))
    cov = tuple(tuple(row) for row in covariance.tolist())
    return CostFit(float(beta[0]), float(beta[1]), cov, z, tuple(points))


def step_cost_at(model: str, k: int, served_k: int, served_cost: Span,
                 fit: CostFit | None = None) -> Span:
    """c(k) under ``model`` from c(K) (and the fit, for FITTED)."""
    if model == CONSTANT:
        return served_cost
    if model == LINEAR:
        return served_cost.scaled(lambda c: 1 + (c - 1) * k / served_k)
    if fit is None:
        raise ValueError("the fitted model needs a fit")
    return fit.at(k)


# -- one window ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Prediction:
    cost: Span  # c(k): also the break-even AL, the AL that k needs for a ratio of 1
    ratio: Span


@dataclass(frozen=True)
class KRow:
    k: int
    acceptance_length: Span
    predictions: dict[str, Prediction]
    measured: bool  # the served k: the ratio is the run's, not a prediction


@dataclass(frozen=True)
class WindowAdvice:
    mode: str
    method: str
    prompt_class: str
    concurrency: int
    served_k: int
    drafts: float
    measured_ratio: Span
    confidence: float
    served_cost: Span  # c(K) = AL(K) / R
    models: tuple[str, ...]
    rows: tuple[KRow, ...]
    fit: CostFit | None = None
    notes: tuple[str, ...] = ()

    @property
    def window(self) -> str:
        return f"{self.mode} / {self.prompt_class} / concurrency {self.concurrency}"

    def best(self, model: str) -> KRow:
        """The k of the highest predicted ratio (the smaller k on a tie)."""
        return max(self.rows, key=lambda r: (_point(r.predictions[model].ratio), -r.k))

    def beating(self, model: str, *, sure: bool) -> list[int]:
        """The k predicted to beat no speculation: by the whole interval (sure), or the estimate."""
        return [r.k for r in self.rows if (r.predictions[model].ratio.low if sure
                                           else _point(r.predictions[model].ratio)) > 1]

    def flips(self) -> list[int]:
        """The k on one side of no speculation under one bound and on the other under the other:
        AL(k) lies between the two break-even ALs, so the assumed cost decides."""
        if self.models != BOUNDS:
            return []
        return [r.k for r in self.rows if not r.measured
                and (_point(r.predictions[CONSTANT].ratio) > 1)
                != (_point(r.predictions[LINEAR].ratio) > 1)]

    def ranking_ratio(self) -> float:
        """What modes are ranked by: the best ratio under the fit where there is one, else the
        measured ratio (the best under a k-independent cost, which never favours a smaller k)."""
        model = FITTED if FITTED in self.models else CONSTANT
        return _point(self.best(model).predictions[model].ratio)


def _point(span: Span) -> float:
    return span.value if span.value is not None else (span.low + span.high) / 2


def window_advice(mode: str, method: str, prompt_class: str, concurrency: int,
                  acceptance: Acceptance, measured_ratio: Span, *, fit: CostFit | None = None,
                  notes: Sequence[str] = ()) -> WindowAdvice:
    """The advice for one window from its counters and the backfire gate's ratio at the served k."""
    big_k = acceptance.served_k
    served_cost = acceptance.served_cost(measured_ratio)
    models = (FITTED,) if fit is not None else BOUNDS
    rows = []
    for k in range(1, big_k + 1):
        al = acceptance.acceptance_length_span(k)
        if k == big_k:  # measured: the run's ratio and the step cost it implies, under every model
            predictions = {m: Prediction(served_cost, measured_ratio) for m in models}
        else:
            costs = {m: step_cost_at(m, k, big_k, served_cost, fit) for m in models}
            predictions = {m: Prediction(c, _divide(al, c)) for m, c in costs.items()}
        rows.append(KRow(k, al, predictions, k == big_k))
    return WindowAdvice(mode, method, prompt_class, concurrency, big_k, acceptance.drafts,
                        measured_ratio, acceptance.confidence, served_cost, models, tuple(rows),
                        fit, tuple(notes))


# -- a report ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Advice:
    rig: str
    source: str
    reference_mode: str
    windows: tuple[WindowAdvice, ...]
    skipped: tuple[str, ...] = ()

    def ranking(self) -> dict[tuple[str, int], list[WindowAdvice]]:
        """Per (class, concurrency), the modes best first (:meth:`WindowAdvice.ranking_ratio`)."""
        out: dict[tuple[str, int], list[WindowAdvice]] = {}
        for w in self.windows:
            out.setdefault((w.prompt_class, w.concurrency), []).append(w)
        return {key: sorted(ws, key=lambda w: -w.ranking_ratio()) for key, ws in out.items()}


def _backfire(report: dict[str, Any], mode: str, prompt_class: str,
              concurrency: int) -> tuple[Span | None, float]:
    """The window's backfire gate (decided or undecided): its paired ratio with its interval (or
    None) and its confidence."""
    gates = [*report.get("gates", []), *report.get("undecided", [])]
    details = [g.get("details") or {} for g in gates
               if (g.get("gate"), g.get("mode"), g.get("prompt_class"), g.get("concurrency"))
               == ("backfire", mode, prompt_class, concurrency)]
    ratios = (Span(float(d["ratio"]), float(d["ci_low"]), float(d["ci_high"])) for d in details
              if all(isinstance(d.get(key), (int, float)) and d[key] > 0
                     for key in ("ratio", "ci_low", "ci_high")))
    confidences = (float(d["confidence"]) for d in details
                   if isinstance(d.get("confidence"), (int, float)) and 0.5 < d["confidence"] < 1)
    # reports before the confidence was kept said "95 % CI"
    return next(ratios, None), next(confidences, DEFAULT_CONFIDENCE)


def _family(config: dict[str, Any]) -> str:
    """What a step costs depends on: the speculative config less its cost-neutral keys."""
    return json.dumps({k: v for k, v in config.items() if k not in COST_NEUTRAL_KEYS},
                      sort_keys=True, default=str)


def _is_reference(m: dict[str, Any], reference: str) -> bool:
    """Whether window ``m`` measured the reference mode, itself or as its duet partner."""
    partner = m.get("partner")
    return m.get("mode") == reference or (isinstance(partner, dict)
                                          and partner.get("mode") == reference)


def _speculative_windows(report: dict[str, Any], configs: dict[str, Any],
                         source: str) -> list[dict[str, Any]]:
    """The report's speculative windows; AdviceError naming ``source`` and the key where advice
    cannot come from it (no speculative mode, no reference window, no per-position counters)."""
    rig = report.get("rig") or {}
    reference = rig.get("reference_mode")
    measurements = report.get("measurements") or []
    speculative = [m for m in measurements if m.get("mode") != reference
                   and isinstance(m.get("mode"), str)
                   and (m.get("mode") in configs or m.get("acceptance"))]
    if not configs or not speculative:
        raise AdviceError(f"{source}: rig.modes / measurements: no speculative mode was measured "
                          f"(modes {sorted(rig.get('modes') or {})}, measured "
                          f"{sorted({str(m.get('mode')) for m in measurements})})")
    if not any(_is_reference(m, reference) for m in measurements):
        raise AdviceError(f"{source}: measurements: no window of the reference mode {reference!r} "
                          "(rig.reference_mode): nothing to compare speculation with")
    if not any((m.get("acceptance") or {}).get("accepted_per_position") for m in speculative):
        raise AdviceError(f"{source}: measurements[].acceptance.accepted_per_position: no "
                          "speculative window has per-position counters (a vLLM without "
                          "vllm:spec_decode_num_accepted_tokens_per_pos, or a window without "
                          "drafts): AL(k) below the served k cannot be read")
    return speculative


def design_effect(clusters: Sequence[tuple[float, Sequence[float]]]) -> float:
    """How much a position share's variance exceeds that of independent drafts when drafts come in
    clusters (a prompt's): per position, the cluster-robust variance of accepted / drafts over the
    binomial one; the largest over the positions, never below 1."""
    total, n = math.fsum(d for d, _ in clusters), len(clusters)
    effect = 1.0
    for i in range(len(clusters[0][1]) if n > 1 and total > 0 else 0):
        p = math.fsum(a[i] for _, a in clusters) / total
        if 0 < p < 1:
            robust = n / (n - 1) * math.fsum((a[i] - p * d) ** 2 for d, a in clusters) / total**2
            effect = max(effect, robust / (p * (1 - p) / total))
    return effect


def _per_request_acceptance(m: dict[str, Any], counters: tuple[float, list[float]], notes: list[str]
                            ) -> tuple[float, list[float], float]:
    """(drafts, accepted per position, design effect): vLLM's per-request counts where every
    request has them (prompts as clusters), else the window's counters (independent drafts)."""
    records = [r for r in m.get("records") or [] if isinstance(r, dict)]
    found = accepted_per_position([r.get("spec_decode") for r in records])
    if found is None or len(found[1][0]) != len(counters[1]) or not sum(found[0]):
        return counters[0], counters[1], 1.0
    by_prompt: dict[str, list[Any]] = {}
    for r, steps, positions in zip(records, *found, strict=True):
        cluster = by_prompt.setdefault(str(r.get("prompt_id")), [0.0, [0.0] * len(positions)])
        cluster[0] += steps
        cluster[1] = [a + b for a, b in zip(cluster[1], positions, strict=True)]
    drafts = float(sum(found[0]))
    per_position = [float(sum(col)) for col in zip(*found[1], strict=True)]
    effect = design_effect([(d, a) for d, a in by_prompt.values()])
    streams = agreement([str(r.get("request_id")).split("/", 2)[-1] for r in records],
                        [RequestRecord.from_dict(r) for r in records])
    notes.append(f"acceptance from vLLM's per-request counts ({len(records)} requests, "
                 f"{len(by_prompt)} prompts as clusters: intervals {math.sqrt(effect):.2f}x as "
                 "wide as for independent drafts)"
                 + ("" if (drafts, per_position) == tuple(counters) else
                    f"; the window's counters say {counters[0]:g} drafts, {counters[1]}")
                 + (f"; {streams.text()}" if streams else ""))
    return drafts, per_position, effect


def _ready_window(report: dict[str, Any], m: dict[str, Any], configs: dict[str, Any], source: str
                  ) -> tuple[dict[str, Any], Acceptance, Span, list[str]] | str:
    """A speculative window advice can be drawn from, or why not (a line of "not advised")."""
    reference = (report.get("rig") or {}).get("reference_mode")
    mode, prompt_class, concurrency = m["mode"], m.get("prompt_class"), m.get("concurrency")
    where = f"{mode} / {prompt_class} / concurrency {concurrency}"
    acc = m.get("acceptance") or {}
    per_position = acc.get("accepted_per_position") or []
    drafts = acc.get("drafts")
    if not per_position or not isinstance(drafts, (int, float)) or drafts <= 0:
        return f"{where}: no per-position counters (acceptance.accepted_per_position, drafts)"
    if any(not isinstance(a, (int, float)) or not 0 <= a <= drafts for a in per_position):
        raise AdviceError(f"{source}: {where}: acceptance.accepted_per_position {per_position} "
                          f"must be counts between 0 and drafts ({drafts})")
    if not any(_is_reference(r, reference) for r in report.get("measurements", [])
               if (r.get("prompt_class"), r.get("concurrency")) == (prompt_class, concurrency)):
        return f"{where}: no {reference} window of this class and concurrency"
    ratio, confidence = _backfire(report, mode, prompt_class, concurrency)
    if ratio is None:
        return (f"{where}: no backfire gate with a ratio and an interval "
                "(gates[].details.ratio, ci_low, ci_high)")
    notes: list[str] = []
    accepted = acc.get("accepted_tokens")
    total = math.fsum(per_position)
    if isinstance(accepted, (int, float)) and abs(total - accepted) > 1e-6 * max(1, accepted):
        notes.append(f"the per-position counts sum to {total:g}, vLLM's accepted "
                     f"tokens to {accepted:g}: AL(K) is taken from the per-position counts")
    served = (configs.get(mode) or {}).get("num_speculative_tokens")
    if isinstance(served, int) and served != len(per_position):
        notes.append(f"rig.modes.{mode}.num_speculative_tokens is {served}, the counters have "
                     f"{len(per_position)} positions: k runs to {len(per_position)}")
    drafts, per_position, effect = _per_request_acceptance(
        m, (float(drafts), list(per_position)), notes)
    acceptance = Acceptance(drafts, tuple(float(a) for a in per_position), confidence, effect)
    return m, acceptance, ratio, notes


def advise_report(report: dict[str, Any], *, source: str = "report.json") -> Advice:
    """The advice for every speculative window of a run's report that has per-position counters,
    a no-speculation window of its class and concurrency and a backfire ratio with an interval;
    AdviceError naming ``source`` and the key when no window qualifies."""
    rig = report.get("rig") or {}
    configs = {name: cfg for name, cfg in (rig.get("modes") or {}).items() if isinstance(cfg, dict)}
    found = [_ready_window(report, m, configs, source)
             for m in _speculative_windows(report, configs, source)]
    skipped = [f for f in found if isinstance(f, str)]
    ready = [f for f in found if not isinstance(f, str)]
    if not ready:
        raise AdviceError(f"{source}: no speculative window can be advised on:\n  "
                          + "\n  ".join(skipped))
    # the step costs measured at each served k, per drafter family, class and concurrency
    costs: dict[tuple[str, str, int], list[tuple[str, int, Span]]] = {}
    for m, acceptance, ratio, _ in ready:
        key = (_family(configs.get(m["mode"]) or {"method": m["mode"]}), m["prompt_class"],
               m["concurrency"])
        costs.setdefault(key, []).append((m["mode"], acceptance.served_k,
                                          acceptance.served_cost(ratio)))
    windows = []
    for m, acceptance, ratio, notes in ready:
        config = configs.get(m["mode"]) or {"method": m["mode"]}
        fit = fit_step_cost(costs[(_family(config), m["prompt_class"], m["concurrency"])],
                            min(acceptance.confidence, DEFAULT_CONFIDENCE))
        if fit is not None and (fit.c0 < 1 or fit.slope < 0):
            notes.append(f"the fit has c0 = {fit.c0:.2f}, s = {fit.slope:.3f}: outside c0 >= 1, s "
                         ">= 0, what the two bounds assume")
        windows.append(window_advice(m["mode"], str(config.get("method", "?")), m["prompt_class"],
                                     m["concurrency"], acceptance, ratio, fit=fit, notes=notes))
    order = {name: i for i, name in enumerate(rig.get("modes") or {})}
    classes = list(dict.fromkeys(m.get("prompt_class") for m in report.get("measurements") or []))
    windows.sort(key=lambda w: (w.concurrency, classes.index(w.prompt_class),
                                order.get(w.mode, len(order)), w.mode))
    return Advice(str(rig.get("name", "?")), source, str(rig.get("reference_mode")),
                  tuple(windows), tuple(skipped))


def advise_file(path: Path | str, *, rig: str | None = None) -> Advice:
    """:func:`advise_report` on a saved report.json(.gz); AdviceError (or the reader's
    SpecgateError) naming the file. With ``rig``, the report must be that rig's."""
    report = read_saved_report(path)
    if rig is not None and report["rig"].get("name") != rig:
        raise AdviceError(f"{path}: rig.name is {report['rig'].get('name')!r}, not the rig asked "
                          f"for ({rig!r}): advice is drawn from a run of the rig it is for")
    return advise_report(report, source=str(path))


# -- text ----------------------------------------------------------------------------------------
ASSUMPTIONS = (
    "model: ratio(k) = AL(k) / c(k) against no speculation; AL(k) = 1 + sum_{i<=k} accepted at "
    "position i / drafts (vLLM counts position i only when all before it were accepted); c(K) = "
    "AL(K) / the measured ratio at the served k=K.",
    "assumed, not measured by one run: how c varies with k. For c(k) = c0 + s*k with c0 >= 1 and "
    f"s >= 0 it lies between two bounds: {CONSTANT}, c(k) = c(K) (pessimistic below K), and "
    f"{LINEAR}, c(k) = 1 + (c(K)-1)*k/K (optimistic below K). Where the report measures c at two "
    "or more k of one drafter, c0 and s are fitted.",
    f"columns: {', '.join(f'{short} = {name}' for name, short in SHORT.items())}; c(k) is also the "
    "break-even AL, the AL that k needs for a ratio of 1.",
    "intervals: the measured ratio's is the backfire gate's; AL(k)'s is AL(K) x the interval of "
    "AL(k)/AL(K), each position a Wilson interval at 1 - (1-confidence)/K over drafts as trials, "
    "widened by the prompts' clustering where vLLM counted each request (a note says by how "
    "much), else taken as independent (one prompt's drafts succeed together: the truth is wider); "
    "ends propagated (conservative).",
)


def _k_table(rows: list[list[str]], models: Sequence[str]) -> str:
    return simple_table(rows, ["k", "AL(k)", *(f"{v} {SHORT[m]}" for m in models
                                               for v in ("c(k)", "ratio")), ""])


def _ks(ks: Sequence[int]) -> str:
    return ", ".join(f"k={k}" for k in ks) if ks else "none"


def window_text(w: WindowAdvice) -> str:
    full = w.rows[-1].acceptance_length.value or 0.0
    head = (f"{w.window} ({w.method}, served k={w.served_k}): measured "
            f"{w.measured_ratio.text(3, 'x')} of no speculation ({w.confidence * 100:g} % "
            f"interval) with AL({w.served_k}) = {full:.2f} over {w.drafts:g} drafts: one step "
            f"costs c({w.served_k}) = {w.served_cost.text()} plain steps")
    flips = w.flips()
    rows = []
    for r in w.rows:
        row = [str(r.k), r.acceptance_length.text() + (" measured" if r.measured else "")]
        for m in w.models:
            p = r.predictions[m]
            verdict = "" if r.measured else f" {p.ratio.verdict}"
            row += [p.cost.text(), p.ratio.text(2, "x") + verdict]
        row.append("measured" if r.measured else "flips between the bounds" if r.k in flips else "")
        rows.append(row)
    lines = [head, _k_table(rows, w.models)]
    if w.fit is not None:
        lines.append(w.fit.describe())
    for m in w.models:
        best = w.best(m)
        ratio = best.predictions[m].ratio
        lines.append(f"under a {m}: best k={best.k}, {ratio.text(2, 'x')} "
                     f"({'measured' if best.measured else 'predicted'}); beats no speculation: "
                     f"{_ks(w.beating(m, sure=True))} with the whole interval above 1, "
                     f"{_ks(w.beating(m, sure=False))} by the estimate")
    if w.models == BOUNDS:
        flips_text = (f"{_ks(flips)}: AL(k) lies between the two break-even ALs, so the assumed "
                      "step cost decides; measuring c at a second k (a mode of the same drafter "
                      "at another k) settles it" if flips
                      else "none: both bounds put every k on the same side of no speculation")
        lines.append(f"flips between the bounds: {flips_text}")
    lines += [f"note: {n}" for n in w.notes]
    return "\n".join(lines)


def ranking_text(advice: Advice) -> list[str]:
    """Per class and concurrency with two or more modes: the modes best first."""
    lines = []
    for (prompt_class, concurrency), ws in advice.ranking().items():
        if len(ws) < 2:
            continue
        lines.append(f"ranking, {prompt_class} / concurrency {concurrency} (by the best ratio "
                     "under the fit, else the measured one, which a k-independent cost never "
                     "beats):")
        for i, w in enumerate(ws, 1):
            parts = []
            for m in w.models:
                best = w.best(m)
                what = "measured" if best.measured else "predicted"
                parts.append(f"{m}: k={best.k} {best.predictions[m].ratio.text(2, 'x')} {what}")
            lines.append(f"  {i}. {w.mode} ({w.method}, served k={w.served_k}): measured "
                         f"{w.measured_ratio.text(3, 'x')}; best {'; '.join(parts)}")
    return lines


def advice_text(advice: Advice) -> str:
    blocks = [f"advice for rig {advice.rig} from {advice.source} (ratio = tok/s against "
              f"{advice.reference_mode})",
              "\n".join(ASSUMPTIONS)]
    blocks += [window_text(w) for w in advice.windows]
    ranking = ranking_text(advice)
    if ranking:
        blocks.append("\n".join(ranking))
    if advice.skipped:
        blocks.append("not advised:\n" + "\n".join(f"  {s}" for s in advice.skipped))
    return "\n\n".join(blocks)


# -- the seed case -------------------------------------------------------------------------------
@dataclass(frozen=True)
class SeedFigures:
    """What the seed case published (docs/advice.md): a tok/s figure per class and side, and
    acceptance as ranges over every prompt."""

    k: int = 5
    prompt_lookup_max: int = 4
    tokens_per_s: dict[str, tuple[float, float]] = field(default_factory=lambda: {  # no spec, ngram
        "coding": (62.6, 46.4), "math": (78.0, 64.8), "structured_json": (76.1, 65.5),
        "explanatory": (79.5, 72.5)})
    acceptance_length: tuple[float, float] = (1.86, 2.55)
    first_position: tuple[float, float] = (0.40, 0.56)
    last_position: tuple[float, float] = (0.04, 0.13)
    acceptance_rate: tuple[float, float] = (0.17, 0.31)


@dataclass(frozen=True)
class SeedClass:
    prompt_class: str
    measured_ratio: float
    served_cost: Span  # c(K) over the published AL range
    acceptance_length: dict[int, Span]
    predictions: dict[tuple[str, int], Span]  # (bound, k) -> ratio range

    def flips(self) -> list[int]:
        """The k a bound puts wholly below 1 and the other not: the assumed cost decides."""
        p = self.predictions
        return [k for k in self.acceptance_length
                if (p[(CONSTANT, k)].high < 1) != (p[(LINEAR, k)].high < 1)]


@dataclass(frozen=True)
class SeedAdvice:
    figures: SeedFigures
    classes: tuple[SeedClass, ...]
    conclusion: tuple[str, ...]

    @property
    def decides_small_k(self) -> bool:
        """Whether the published figures settle if a k below the served one beats no speculation."""
        return not any(c.flips() for c in self.classes)


def _fractional_range(numerator: Sequence[float], n0: float, denominator: Sequence[float],
                      d0: float, a_ub: list[list[float]], b_ub: list[float],
                      bounds: Sequence[tuple[float, float]]) -> Span:
    """min to max of (n.x + n0) / (d.x + d0) over {A x <= b, bounds}, d.x + d0 > 0 there: two
    linear programs after the Charnes-Cooper change of variables (y = t x, t = 1 / (d.x + d0))."""
    import numpy as np
    from scipy.optimize import linprog

    size = len(bounds)
    rows = [[*row, -b] for row, b in zip(a_ub, b_ub, strict=True)]
    for i, (lo, hi) in enumerate(bounds):  # lo t <= y_i <= hi t
        unit = [float(j == i) for j in range(size)]
        rows += [[*(-u for u in unit), lo], [*unit, -hi]]
    a = np.array(rows)
    equality = np.array([[*denominator, d0]])
    out = []
    for sign in (1.0, -1.0):
        objective = sign * np.array([*numerator, n0])
        result = linprog(objective, A_ub=a, b_ub=np.zeros(len(rows)), A_eq=equality, b_eq=[1.0],
                         bounds=[(None, None)] * size + [(0, None)], method="highs")
        if not result.success:
            raise ValueError(f"the seed's figures are inconsistent: {result.message}")
        out.append(sign * result.fun)
    return Span(None, out[0], out[1])


def seed_advice(figures: SeedFigures | None = None) -> SeedAdvice:
    """What the advice can say from the seed's published figures alone: the per-position shares
    range over every non-increasing sequence with p_1, p_K and 1 + sum p in their published ranges
    (positions 2 to K-1 were not published); each class's ratio is its one figure per side (no
    interval). Every range is the exact min and max over those sequences."""
    f = figures or SeedFigures()
    big_k = f.k
    a_ub = [[-1.0 if j == i else float(j == i + 1) for j in range(big_k)]  # p_{i+1} <= p_i
            for i in range(big_k - 1)]
    a_ub += [[1.0] * big_k, [-1.0] * big_k]  # 1 + sum p within the published AL range
    b_ub = [0.0] * (big_k - 1) + [f.acceptance_length[1] - 1, -(f.acceptance_length[0] - 1)]
    bounds = [f.first_position] + [(0.0, 1.0)] * (big_k - 2) + [f.last_position]
    ranged = partial(_fractional_range, a_ub=a_ub, b_ub=b_ub, bounds=bounds)

    classes = []
    for prompt_class, (plain, spec) in f.tokens_per_s.items():
        r = spec / plain
        served_cost = Span(None, f.acceptance_length[0] / r, f.acceptance_length[1] / r)
        lengths: dict[int, Span] = {}
        predictions: dict[tuple[str, int], Span] = {}
        for k in range(1, big_k + 1):
            first_k = [1.0] * k + [0.0] * (big_k - k)
            slope = k / (big_k * r)
            lengths[k] = ranged(first_k, 1.0, [0.0] * big_k, 1.0)
            # k-independent: R (1 + S_k) / (1 + S_K); linear: (1 + S_k) / (1 + (c(K) - 1) k / K)
            predictions[(CONSTANT, k)] = ranged([r * v for v in first_k], r, [1.0] * big_k, 1.0)
            predictions[(LINEAR, k)] = ranged(first_k, 1.0, [slope] * big_k, 1 - k / big_k + slope)
        classes.append(SeedClass(prompt_class, r, served_cost, lengths, predictions))
    return SeedAdvice(f, tuple(classes), _seed_conclusion(f, classes))


def _seed_conclusion(f: SeedFigures, classes: Sequence[SeedClass]) -> tuple[str, ...]:
    big_k = f.k
    slower = all(c.measured_ratio < 1 for c in classes)
    low_cost = min(c.served_cost.low for c in classes)
    flips = {c.prompt_class: c.flips() for c in classes}
    linear_sure = {c.prompt_class: [k for k in range(1, big_k)
                                    if c.predictions[(LINEAR, k)].low > 1] for c in classes}
    constant_best = max(c.predictions[(CONSTANT, k)].high for c in classes for k in range(1, big_k))
    al = {k: Span(None, min(c.acceptance_length[k].low for c in classes),
                  max(c.acceptance_length[k].high for c in classes)) for k in range(1, big_k)}
    lines = [
        f"measured: at the served k={big_k} ngram is slower than no speculation on "
        f"{'every class' if slower else 'some classes'} (ratios "
        f"{', '.join(f'{c.prompt_class} {c.measured_ratio:.3f}' for c in classes)}; one figure per "
        "side, so no interval).",
        f"can conclude: one ngram step at k={big_k} costs c({big_k}) >= {low_cost:.2f} plain steps "
        f"on every class (AL({big_k}) >= {f.acceptance_length[0]} over the measured ratio); under "
        f"a {CONSTANT} no smaller k does better (AL only falls with k): every k=1..{big_k - 1} "
        f"stays below {constant_best:.2f}x.",
        "cannot conclude: whether a smaller k beats no speculation. Under a "
        f"{LINEAR} some do ("
        + "; ".join(f"{c}: {_ks(ks)} with the whole range above 1"
                    for c, ks in linear_sure.items() if ks)
        + "), under a k-independent one none does: the prediction flips for "
        + "; ".join(f"{c} at {_ks(ks)}" for c, ks in flips.items() if ks)
        + ", and one run at one k cannot tell which bound holds.",
        "cannot conclude either: AL(k) per class. The acceptance figures are ranges over every "
        f"prompt, none per class, and positions 2-{big_k - 1} were not published: AL(k) is only "
        "known to lie in "
        + ", ".join(f"AL({k}) {s.text()}" for k, s in al.items())
        + " for any class; per-position counts per class would narrow these, not the flip.",
        "one run on the rig would need: per class, the backfire ratio with an interval (6 pairs "
        "or more; the rig's 6 prompts x 3 repeats give 18) and the per-position counters "
        f"(specgate records them per window), for ngram at k={big_k} and at a second k with the "
        f"same prompt_lookup_max {f.prompt_lookup_max} (e.g. a mode ngram_k2 beside ngram in the "
        f"same session): c at two k fits c0 + s*k, and the advice then predicts every k=1..{big_k} "
        "per class with an interval.",
    ]
    return tuple(lines)


def seed_text(seed: SeedAdvice) -> str:
    f = seed.figures
    head = (f"the seed case (Kimi-K2.5 INT4, 8x RTX PRO 6000): ngram k={f.k}, prompt_lookup_max "
            f"{f.prompt_lookup_max}; published: AL({f.k}) "
            f"{f.acceptance_length[0]}-{f.acceptance_length[1]}, position 1 "
            f"{f.first_position[0]:.0%}-{f.first_position[1]:.0%}, position {f.k} "
            f"{f.last_position[0]:.0%}-{f.last_position[1]:.0%}, acceptance rate "
            f"{f.acceptance_rate[0]:.0%}-{f.acceptance_rate[1]:.0%} (over every prompt, none per "
            "class); one tok/s figure per class and side.\nEach range is the min and max over "
            "every non-increasing per-position sequence the published figures allow. Columns: "
            f"{', '.join(f'{short} = {name}' for name, short in SHORT.items() if name in BOUNDS)}; "
            "c(k) is the break-even AL.")
    blocks = [head]
    for c in seed.classes:
        rows = []
        for k, al in c.acceptance_length.items():
            row = [str(k), al.text()]
            for m in BOUNDS:
                ratio = c.predictions[(m, k)]
                row += [step_cost_at(m, k, f.k, c.served_cost).text(),  # the break-even AL
                        f"{c.measured_ratio:.3f}x measured" if k == f.k
                        else f"{ratio.text(2, 'x')} {ratio.verdict}"]
            rows.append([*row, "flips between the bounds" if k in c.flips() else ""])
        blocks.append(f"{c.prompt_class}: measured {c.measured_ratio:.3f}x at k={f.k}, c({f.k}) = "
                      f"{c.served_cost.text()} plain steps\n" + _k_table(rows, BOUNDS))
    blocks.append("\n".join(seed.conclusion))
    return "\n\n".join(blocks)


# -- the picture ---------------------------------------------------------------------------------
MODEL_STYLE = {CONSTANT: ("o", "-"), LINEAR: ("s", "--"), FITTED: ("D", "-")}  # (marker, line)


def plot_advice(advice: Advice, path: Path) -> Path | None:
    """The report's advice as a PNG at ``path`` (specgate.advise.plot); None without a window."""
    modes = list(dict.fromkeys(w.mode for w in advice.windows))
    color = {mode: MODE_COLORS[i % len(MODE_COLORS)] for i, mode in enumerate(modes)}
    panels: dict[tuple[str, int], tuple[list, list]] = {}
    for w in advice.windows:
        series, measured = panels.setdefault((w.prompt_class, w.concurrency), ([], []))
        predicted = [r for r in w.rows if not r.measured]  # the served k is the star
        for model in w.models:
            ratios = tuple(astuple(r.predictions[model].ratio) for r in predicted)
            series.append(RatioSeries(w.mode, model, color[w.mode], tuple(r.k for r in predicted),
                                      ratios, (w.served_k, w.measured_ratio.value or 0.0)))
        measured.append((w.served_k, astuple(w.measured_ratio), color[w.mode]))
    return draw_ratio_panels(
        [RatioPanel(f"{prompt_class} / concurrency {concurrency}", tuple(series), tuple(measured))
         for (prompt_class, concurrency), (series, measured) in panels.items()],
        styles=MODEL_STYLE, title=f"specgate advise: rig {advice.rig}",
        subtitle="predicted ratio = AL(k) / c(k), bars = intervals (ends propagated); star = "
        "measured at the served k",
        path=path)


def plot_seed(seed: SeedAdvice, path: Path) -> Path | None:
    """The seed case's advice as a PNG: ranges only (hollow markers at their middles)."""
    big_k = seed.figures.k
    below = tuple(range(1, big_k))  # the served k is the star
    panels = [RatioPanel(c.prompt_class,
                         tuple(RatioSeries(f"ngram k={big_k}", model, MODE_COLORS[0], below,
                                           tuple(astuple(c.predictions[(model, k)]) for k in below),
                                           (big_k, c.measured_ratio)) for model in BOUNDS),
                         # one figure per side: no interval
                         ((big_k, (c.measured_ratio, c.measured_ratio, c.measured_ratio),
                           MODE_COLORS[0]),))
              for c in seed.classes]
    return draw_ratio_panels(
        panels, styles=MODEL_STYLE,
        title=f"specgate advise --seed: Kimi-K2.5 INT4, ngram k={big_k} (published figures)",
        subtitle="bars = every ratio the published ranges allow under each step-cost bound; "
        "star = measured", path=path)


# -- the command ---------------------------------------------------------------------------------
SEED_RIG = "kimi-k25-int4-8x-rtx6000"


def advise_command(*, rig: str | None, report: Path | None, seed: bool, out: Path | None,
                   fixtures_dir: Path, root: Path) -> int:
    """``python -m specgate advise``: print the advice and write its PNG (``<out>/advice.png``,
    default ``.specgate/advice/<rig>``); 4 (a usage error) for an unknown rig, an unreadable report,
    or a report advice cannot be drawn from, the message naming the file and the key."""
    try:
        if seed:
            name = rig or SEED_RIG
            if name != SEED_RIG:
                raise AdviceError(f"--seed: the seed's figures are of rig {SEED_RIG}, not {name}")
            folder = writable_folder(out or root / ".specgate" / "advice" / name)
            figures = SeedFigures()
            config = load_rig(name, fixtures_dir).mode("ngram").speculative_config or {}
            if (config.get("num_speculative_tokens"), config.get("prompt_lookup_max")) != \
                    (figures.k, figures.prompt_lookup_max):
                raise AdviceError(f"rig {name}: modes.ngram is {config}, not the seed's ngram "
                                  f"k={figures.k}, prompt_lookup_max {figures.prompt_lookup_max}: "
                                  "its figures do not apply")
            result = seed_advice(figures)
            print(seed_text(result))
            path = plot_seed(result, folder / "advice-seed.png")
        else:
            assert rig is not None and report is not None  # the parser asks for both
            loaded = load_rig(rig, fixtures_dir)  # an unknown rig: exit 4 before the report is read
            folder = writable_folder(out or root / ".specgate" / "advice" / rig)
            advice = advise_file(report, rig=rig)
            print(advice_text(advice))
            path = plot_advice(advice, folder / "advice.png")
            _write_schedules(advice, loaded, folder)
    except SpecgateError as exc:
        print(f"specgate: {exc}", file=sys.stderr)
        return 4
    if path is not None:
        print(f"plot: {path}")
    return 0


def _write_schedules(advice: Advice, rig: Any, folder: Path) -> None:
    """Each speculative mode measured at two or more concurrencies: its schedule, printed and
    written for --specgate-advise-confirm."""
    argv = [*rig.argv_prefix, *(a for extra in rig.mode_extra_args.values() for a in extra)]
    seqs = argv[argv.index("--max-num-seqs") + 1] if "--max-num-seqs" in argv[:-1] else ""
    max_batch = int(seqs) if seqs.isdigit() else schedule.DEFAULT_MAX_BATCH
    configs = {m.name: m.speculative_config for m in rig.modes if m.speculative_config}
    for s in schedule.build_schedules(advice.windows, configs, rig=advice.rig, max_batch=max_batch):
        print(f"\n{schedule.schedule_text(s)}\nschedule: "
              f"{schedule.write_schedule(s, folder, source=advice.source)}")
