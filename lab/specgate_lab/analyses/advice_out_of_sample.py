"""The config advice checked out of sample (issue 62, build item 5): on the kept session that served one
drafter at k = 1..5, each in a duet with no speculation (rig cpu-smollm2-advice), the step cost
c(k) = c0 + s k is fitted on two served k and every other k below the larger one is predicted, for
every such split, and compared with that k's own measured ratio.

    python -m specgate_lab.analyses.advice_out_of_sample docs/evidence/calibration/cpu-2026-12-04c/advice \\
        --clustering docs/evidence/advice/cpu-2026-12-06-schedule/advise-report.json.gz

The unit is the distinct draft sequence: the session ran each prompt twice at temperature 0, and greedy
repeats draft identically (the clustering report's per-request counts show it prompt by prompt), so every
window's counters are divided by the repeats. The prediction for k from the split (a, b), a < b, k < b:

    ratio(k) = AL_b(k) / c(k),  c(k) = c_a (b - k) / (b - a) + c_b (k - a) / (b - a),  c_j = AL_j(j) / R_j

AL from each window's own per-position counters, R_j the window's backfire ratio. The interval is for the
measured ratio at k, simultaneous over its five sources (Bonferroni, each at 1 - alpha / 5): R_a, R_b and
the measured R_k (the gate's log-t intervals re-taken at that level, same df), and the per-position shares
of window a and of window b (Wilson over distinct drafts, each position at 1 - alpha / (5 K)). Every
vertex of that box is evaluated: the ratio is monotone in each R and linear-fractional in the shares, so
its range over the box is taken at a vertex, and then widened by R_k's own noise. When all five hold
(probability >= 1 - alpha whatever their dependence), the measured ratio lies inside.

Also shown: the interval the product gives today (specgate.advise.advice on the report cut to the two
served modes: its fitted cost, every draft of both repeats counted, ends of 95 % intervals), and, as a
sensitivity, the interval with each window's Wilson trials divided further by the prompts' design effect
at the distinct-draft unit, read from the clustering report (another session on the same prompts and
model, ngram at k = 3, with vLLM's per-request counts; the advice session itself kept none)."""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scipy.stats import beta, binomtest
from scipy.stats import chi2 as chi2_dist
from scipy.stats import t as student_t

from specgate.advise.advice import FITTED, advise_report, design_effect, fit_step_cost
from specgate.advise.spans import Span
from specgate.decide.stats import wilson_interval

ALPHA = 0.05
SOURCES = 5  # R_a, R_b, R_k, window a's shares, window b's shares


def _load(path: Path) -> dict[str, Any]:
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def _report(path: Path) -> dict[str, Any]:
    return _load(path / "report.json.gz" if path.is_dir() else path)


@dataclass(frozen=True)
class Window:
    """One served k of one class: distinct drafts and accepted counts per position, the measured ratio
    with its log-scale standard error and degrees of freedom (the backfire gate's t interval)."""

    mode: str
    prompt_class: str
    k: int
    drafts: float
    accepted: tuple[float, ...]
    ratio: Span
    log_se: float
    df: int

    def al(self, k: int, shares: tuple[float, ...] | None = None) -> float:
        return 1.0 + math.fsum((shares or self.shares)[:k])

    @property
    def shares(self) -> tuple[float, ...]:
        return tuple(a / self.drafts for a in self.accepted)

    def share_bounds(self, level: float, effect: float = 1.0) -> tuple[tuple[float, float], ...]:
        """Each position's Wilson interval, all K together at ``level`` (Bonferroni), over distinct
        drafts / ``effect`` trials."""
        each = 1 - (1 - level) / self.k
        return tuple(wilson_interval(a / effect, self.drafts / effect, each) for a in self.accepted)

    def ratio_factor(self, level: float) -> float:
        """F with the true ratio in measured / F .. measured x F at ``level`` (the gate's log-t interval)."""
        return math.exp(student_t.ppf(0.5 + level / 2, self.df) * self.log_se)


def windows(report: dict[str, Any]) -> dict[str, dict[int, Window]]:
    """Per class, the speculative windows by served k, counters divided by the greedy repeats."""
    protocol = report["rig"]["protocol"]
    repeats = int(protocol["repeats"]) if float(protocol.get("temperature", 1)) == 0 else 1
    gates = {(g["mode"], g["prompt_class"]): g["details"] for g in [*report["gates"], *report["undecided"]]
             if g["gate"] == "backfire" and (g.get("details") or {}).get("ci_low")}
    out: dict[str, dict[int, Window]] = {}
    for m in report["measurements"]:
        acc = m.get("acceptance") or {}
        if not acc.get("accepted_per_position") or (m["mode"], m["prompt_class"]) not in gates:
            continue
        counts = [acc["drafts"], *acc["accepted_per_position"]]
        if any(c % repeats for c in counts):
            raise ValueError(f"{m['mode']} / {m['prompt_class']}: counts {counts} do not split into {repeats} "
                             "identical greedy repeats")
        d = gates[(m["mode"], m["prompt_class"])]
        df = int(re.search(r"(\d+) df", d["quantile_name"]).group(1))
        k = len(acc["accepted_per_position"])
        out.setdefault(m["prompt_class"], {})[k] = Window(
            m["mode"], m["prompt_class"], k, acc["drafts"] / repeats,
            tuple(a / repeats for a in acc["accepted_per_position"]), Span(d["ratio"], d["ci_low"], d["ci_high"]),
            math.log(d["ci_high"] / d["ci_low"]) / (2 * d["quantile"]), df)
    return out


def _ratio(k: int, wa: Window, wb: Window, ra: float, rb: float, sa: tuple[float, ...], sb: tuple[float, ...]
           ) -> float:
    ca, cb = wa.al(wa.k, sa) / ra, wb.al(wb.k, sb) / rb
    cost = (ca * (wb.k - k) + cb * (k - wa.k)) / (wb.k - wa.k)
    return wb.al(k, sb) / cost if cost > 0 else math.inf


def predict(k: int, wa: Window, wb: Window, target: Window, effect: dict[int, float] | None = None,
            alpha: float = ALPHA) -> Span:
    """The point prediction of ratio(k) from the split (wa, wb) and the simultaneous interval at
    1 - alpha for the measured ratio at k (module docstring). ``effect``: a design effect per window's k."""
    level = 1 - alpha / SOURCES
    effect = effect or {}
    fa, fb = wa.ratio_factor(level), wb.ratio_factor(level)
    ends_a = wa.share_bounds(level, effect.get(wa.k, 1.0))
    ends_b = wb.share_bounds(level, effect.get(wb.k, 1.0))
    values = [_ratio(k, wa, wb, ra, rb, sa, sb)
              for ra in (wa.ratio.value / fa, wa.ratio.value * fa)
              for rb in (wb.ratio.value / fb, wb.ratio.value * fb)
              for sa in itertools.product(*ends_a)
              for sb in itertools.product(*ends_b)]
    point = _ratio(k, wa, wb, wa.ratio.value, wb.ratio.value, wa.shares, wb.shares)
    noise = target.ratio_factor(level)
    return Span(point, min(values) / noise, max(values) * noise)


def _shipped(report: dict[str, Any], wa: Window, wb: Window, k: int) -> Span | None:
    """The product's own fitted prediction of k from the report cut to the two served modes."""
    modes = {wa.mode, wb.mode, report["rig"]["reference_mode"]}
    rig = {**report["rig"], "modes": {m: c for m, c in report["rig"]["modes"].items() if m in modes}}
    cut = {**report, "rig": rig, "measurements": [m for m in report["measurements"] if m["mode"] in modes],
           "gates": [g for g in report["gates"] if g["mode"] in modes],
           "undecided": [g for g in report["undecided"] if g["mode"] in modes]}
    for w in advise_report(cut).windows:
        if w.mode == wb.mode and w.prompt_class == wb.prompt_class:
            row = next(r for r in w.rows if r.k == k)
            return row.predictions[FITTED].ratio if FITTED in row.predictions else None
    return None


def clustering(report: dict[str, Any]) -> tuple[dict[str, float], int, int]:
    """From a report with vLLM's per-request counts: per class, the prompts' design effect at the
    distinct-draft unit (one request per prompt; the largest over the windows of that class), and how many
    prompts' greedy repeats counted identically, of how many."""
    from specgate.measure.per_request import accepted_per_position

    effects: dict[str, float] = {}
    same = total = 0
    for m in report["measurements"]:
        records = m.get("records") or []
        found = accepted_per_position([r.get("spec_decode") for r in records]) if m.get("acceptance") else None
        if found is None:
            continue
        by_prompt: dict[str, list[tuple[float, tuple[float, ...]]]] = {}
        for r, steps, positions in zip(records, *found, strict=True):
            by_prompt.setdefault(str(r["prompt_id"]), []).append((steps, tuple(positions)))
        total += len(by_prompt)
        same += sum(len(set(v)) == 1 for v in by_prompt.values())
        effect = design_effect([(v[0][0], list(v[0][1])) for v in by_prompt.values()])
        effects[m["prompt_class"]] = max(effects.get(m["prompt_class"], 1.0), effect)
    return effects, same, total


def fit_check(ws: dict[int, Window]) -> tuple[float, int]:
    """The linear cost model's misfit in sample: the chi-square of the fit over every served k (weights
    from each c's interval, as the product fits) and its degrees of freedom."""
    points = [(w.mode, k, Span(w.al(k) / w.ratio.value, w.al(k) / w.ratio.high, w.al(k) / w.ratio.low))
              for k, w in sorted(ws.items())]
    fit = fit_step_cost(points, 0.95)
    chi2 = math.fsum(((c.value - fit.c0 - fit.slope * k) / ((c.high - c.low) / (2 * fit.z))) ** 2
                     for _, k, c in points)
    return chi2, len(points) - 2


def rows(report: dict[str, Any], effects: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """One row per class, split (a, b) and predicted k < b, k != a."""
    out = []
    for prompt_class, ws in sorted(windows(report).items()):
        for a, b in itertools.combinations(sorted(ws), 2):
            for k in (k for k in range(1, b) if k != a and k in ws):
                wa, wb, target = ws[a], ws[b], ws[k]
                lab = predict(k, wa, wb, target)
                shipped = _shipped(report, wa, wb, k)
                measured = target.ratio.value
                row = {"class": prompt_class, "fit": (a, b), "k": k, "lab": lab, "shipped": shipped,
                       "measured": target.ratio, "error": lab.value - measured,
                       "inside": lab.low <= measured <= lab.high,
                       "inside_shipped": shipped is not None and shipped.low <= measured <= shipped.high}
                if effects and prompt_class in effects:
                    e = effects[prompt_class]
                    wide = predict(k, wa, wb, target, {a: e, b: e})
                    row["inside_clustered"] = wide.low <= measured <= wide.high
                out.append(row)
    return out


def clopper_pearson(hits: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    tail = (1 - confidence) / 2
    low = beta.ppf(tail, hits, n - hits + 1) if hits > 0 else 0.0
    high = beta.ppf(1 - tail, hits + 1, n - hits) if hits < n else 1.0
    return float(low), float(high)


def _coverage(hits: int, n: int) -> str:
    low, high = clopper_pearson(hits, n)
    return f"{hits} of {n} ({hits / n * 100:.1f} %; exact 95 % CI {low * 100:.1f}-{high * 100:.1f} %)"


def table(found: list[dict[str, Any]]) -> str:
    lines = ["| class | fit on k | k | predicted, 95 % simultaneous interval for the measured ratio | product's fitted "
             "interval (as shipped) | measured (95 % CI) | predicted - measured | inside: lab / product |",
             "|---|---|---|---|---|---|---|---|"]
    for r in found:
        shipped = r["shipped"].text(3) if r["shipped"] else "-"
        rel = r["error"] / r["measured"].value * 100
        lines.append(f"| {r['class']} | {r['fit'][0]}, {r['fit'][1]} | {r['k']} | {r['lab'].text(3)} | {shipped} | "
                     f"{r['measured'].text(3)} | {r['error']:+.3f} ({rel:+.1f} %) | "
                     f"{'yes' if r['inside'] else 'no'} / {'yes' if r['inside_shipped'] else 'no'} |")
    return "\n".join(lines)


def summary(report: dict[str, Any], found: list[dict[str, Any]], effects: dict[str, float] | None = None,
            identical: tuple[int, int] | None = None) -> list[str]:
    n = len(found)
    above = sum(r["error"] > 0 for r in found)
    below = sum(r["error"] < 0 for r in found)
    rel = sorted(r["error"] / r["measured"].value * 100 for r in found)
    median = (rel[(n - 1) // 2] + rel[n // 2]) / 2
    sign_p = binomtest(above, above + below, 0.5).pvalue
    classes = sorted({r["class"] for r in found})
    per_class = ", ".join(f"{c} {sum(r['class'] == c for r in found)}" for c in classes)
    lines = [f"predictions: {n} ({per_class}), every split of two served k, every other k below the larger one",
             f"coverage, lab interval (95 % simultaneous): {_coverage(sum(r['inside'] for r in found), n)}",
             "coverage, product's fitted interval (as shipped): "
             + _coverage(sum(r["inside_shipped"] for r in found), n)]
    if effects and all("inside_clustered" in r for r in found):
        lines.append("coverage, lab interval with the prompts' design effect ("
                     + ", ".join(f"{c} {e:.2f}" for c, e in sorted(effects.items()))
                     + f"): {_coverage(sum(r['inside_clustered'] for r in found), n)}")
    lines.append(f"signed errors (predicted - measured): {above} above, {below} below; median {median:+.1f} %, "
                 f"range {rel[0]:+.1f} % to {rel[-1]:+.1f} %; sign test (two-sided, binomial 1/2): p = {sign_p:.2g}")
    for prompt_class in classes:
        mine = [r for r in found if r["class"] == prompt_class]
        ups, downs = sum(r["error"] > 0 for r in mine), sum(r["error"] < 0 for r in mine)
        lines.append(f"  {prompt_class}: {ups} of {len(mine)} above (sign test p = "
                     f"{binomtest(ups, ups + downs, 0.5).pvalue:.2g}), inside {sum(r['inside'] for r in mine)} of "
                     f"{len(mine)} (lab), {sum(r['inside_shipped'] for r in mine)} of {len(mine)} (product)")
    for name, part in (("interpolated (a < k < b)", [r for r in found if r["fit"][0] < r["k"]]),
                       ("extrapolated (k < a < b)", [r for r in found if r["k"] < r["fit"][0]])):
        errs = sorted(r["error"] / r["measured"].value * 100 for r in part)
        lines.append(f"  {name}: {len(part)}, {sum(e > 0 for e in errs)} above, median "
                     f"{(errs[(len(errs) - 1) // 2] + errs[len(errs) // 2]) / 2:+.1f} %, range {errs[0]:+.1f} % to "
                     f"{errs[-1]:+.1f} %, inside {sum(r['inside'] for r in part)} (lab), "
                     f"{sum(r['inside_shipped'] for r in part)} (product)")
    finite = sorted(r["lab"].high / r["lab"].low for r in found if math.isfinite(r["lab"].high))
    shipped = sorted(r["shipped"].high / r["shipped"].low for r in found if r["shipped"])
    lines.append(f"width (high / low): lab median {finite[(len(finite) - 1) // 2]:.2f}x over the {len(finite)} "
                 f"bounded, {n - len(finite)} unbounded above; product median {shipped[(len(shipped) - 1) // 2]:.2f}x")
    lines.append("intervals wholly above 1 (the advice would say faster; every measured ratio here is above 1): "
                 f"lab {sum(r['lab'].low > 1 for r in found)} of {n}, "
                 f"product {sum(bool(r['shipped']) and r['shipped'].low > 1 for r in found)} of {n}")
    for prompt_class, ws in sorted(windows(report).items()):
        chi2, df = fit_check(ws)
        lines.append(f"linear cost, in sample over k = {min(ws)}..{max(ws)}, {prompt_class}: chi-square {chi2:.1f} on "
                     f"{df} df (p = {chi2_dist.sf(chi2, df):.2g})")
    if identical:
        lines.append(f"greedy repeats drafting identically (clustering report): {identical[0]} of {identical[1]} "
                     "prompt windows")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path, help="the kept advice session: its folder or report.json.gz")
    parser.add_argument("--clustering", type=Path, default=None,
                        help="a report with vLLM's per-request counts on the same prompts (the design effect)")
    args = parser.parse_args(argv)
    report = _report(args.data)
    effects, identical = None, None
    if args.clustering:
        effects, same, total = clustering(_load(args.clustering))
        identical = (same, total)
    found = rows(report, effects)
    print(table(found))
    print()
    print("\n".join(summary(report, found, effects, identical)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
