"""``python -m specgate_lab calibrate``: each gate's false-alarm rate and detection power, measured on
real servers with real injected regressions.

Two servers of the same mode run side by side: the reference side as the rig has it, the
candidate side with specgate's slowdown injector (specgate_lab.inject) following a file, so one
candidate server serves every slowdown level. Each round measures one duet window per level and
prompt class (the levels in a seeded, shuffled order, so drift hits every level alike), with the
rig's own protocol, and decides it with the rig's own gate code:

- duet design: the candidate's window against the reference side of the same window (the A/B
  throughput gate, ``gates.ratio_result``). On a rig with ``follow_up_repeats`` a window is
  looked at twice as the gate does: its first look decides a threshold unless the gate would call
  it undecided there, and a window undecided at any of the table's thresholds gets the follow-up
  rounds, so every column is still the gate's own rule at that threshold (repeated intervals);
- sequential design: the candidate's window against the reference server's window of the same
  class from the next round: another server and another time, as a stored figure would be,
  with the rig's start noise added as the gate does.

Level 0 is the A/A (nothing changed): its failures are false alarms. Every window is written to
``windows.jsonl`` as it finishes (an interrupted calibration keeps what it measured); the end
writes ``calibration.md`` (the table, per design and threshold: false alarms and detection rate
with exact binomial intervals, and the injector's own measured effect on vLLM's server-side time
per output token, and at the rig's shipped tolerance a normal model's rate with its exact
one-sided bound) and ``power.png``. A thresholds' column is exact for any threshold: a window fails iff its
deciding interval's upper end is below it, and the interval does not depend on it.

By default both servers start once and every window shares that start; ``fresh_servers`` starts
them again for every round, so the windows sample start offsets as separate runs do (what a
false-alarm rate across runs needs). Interrupted (Ctrl-C, or SIGTERM through the CLI), it stops the
servers and still writes the tables from the windows measured (``CalibrationStopped``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import gzip
import json
import math
import os
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specgate.config.rig import Rig, Side
from specgate.decide.gates import window_confidence
from specgate.decide.matching import match_samples
from specgate.decide.paired import paired_ratio, start_spread
from specgate.decide.settings import window_settings
from specgate.measure.protocol import ClassMeasurement, Duet, Measurer
from specgate.measure.telemetry import window_sampler
from specgate_lab.inject import ENV_FILE, ENV_GPU_FILE

DEFAULT_LEVELS = (0.0, 0.02, 0.05, 0.10, 0.20)
DEFAULT_TOLERANCES = (0.02, 0.03, 0.05, 0.10)


@dataclass(frozen=True)
class WindowResult:
    round: int
    level: float
    prompt_class: str
    design: str  # "duet" | "alternation" (two live servers in one window) | "sequential"
    ratio: float
    ci_low: float | None
    ci_high: float | None
    n: int
    server_tpot_ratio: float | None  # candidate / reference server-side time per output token
    started: str
    # two looks (the rig's follow_up_repeats): the first look's interval; ci_low/ci_high are the
    # last look's (the same when no follow-up ran)
    first_ci_low: float | None = None
    first_ci_high: float | None = None
    start: int = 0  # which start of the two servers measured it (--fresh-servers: one per round)

    def deciding_high(self, tolerance: float, margin: float = 0.05) -> float | None:
        """The upper end of the interval that decides the gate at ``1 - tolerance``: the first
        look's unless the gate called that undecided there, then the last look's."""
        if self.first_ci_high is not None and self.first_ci_low is not None and \
                not first_look_undecided(self.first_ci_low, self.first_ci_high, 1.0 - tolerance, margin):
            return self.first_ci_high
        return self.ci_high

    def fails(self, tolerance: float, margin: float = 0.05) -> bool:
        """The gate fails at ``1 - tolerance`` when the deciding interval lies wholly below it."""
        high = self.deciding_high(tolerance, margin)
        return high is not None and high < 1.0 - tolerance


def first_look_undecided(lo: float, hi: float, threshold: float, margin: float) -> bool:
    """The gate's "undecided" (specgate.decide.paired._decide) for a same-mode comparison at ``threshold``: the
    interval holds the threshold, whatever the equivalence margin says (issue 36; ``margin`` is kept
    for the callers, it no longer decides)."""
    return lo < threshold <= hi


def decide(candidate: ClassMeasurement, reference: ClassMeasurement, *, extra_log_spread: float = 0.0,
           confidence: float = 0.95) -> tuple[float, float | None, float | None, int]:
    """The A/B throughput statistic (paired ratio and interval) of one window, as the gate takes it
    (on a window that may be looked at twice, with the repeated intervals' coverage)."""
    samples = match_samples(candidate, list(reference.timed_samples), list(reference.timed_samples.values()))
    r = paired_ratio(samples.measured, samples.reference, threshold=1.0,
                     confidence=window_confidence(confidence, candidate), extra_log_spread=extra_log_spread)
    return r.ratio, r.ci_low, r.ci_high, r.n


def server_tpot_ratio(candidate: ClassMeasurement, reference: ClassMeasurement) -> float | None:
    """vLLM's own time per output token, candidate over reference (the injector's effect)."""
    a, b = candidate.server_decode_tokens_per_s, reference.server_decode_tokens_per_s
    return b / a if a and b else None


def binomial_interval(k: int, n: int) -> tuple[float, float]:
    if n == 0:
        return (0.0, 1.0)
    from scipy import stats as scipy_stats  # only the calibration report needs it

    ci = scipy_stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    return float(ci.low), float(ci.high)


def normal_model_rate(group: Sequence[WindowResult], tolerance: float, margin: float = 0.05,
                      confidence: float = 0.95) -> tuple[float, float] | None:
    """The gate's failure rate at ``1 - tolerance`` under a normal model of the deciding upper end
    (log scale) across windows: (estimate, exact one-sided bound). Zero failures in n windows can
    only show a rate below ~3/n; the model extrapolates from how far the windows' upper ends sat from
    the threshold, in units of their spread (k = |mean - threshold| / SD). The bound is the exact
    confidence bound on a normal tail probability (Owen 1963; the one-sided normal tolerance bound):
    sqrt(n) k follows a noncentral t with n - 1 degrees of freedom and noncentrality sqrt(n) z, so
    the z whose upper tail leaves sqrt(n) k with probability 1 - ``confidence`` is the bound on the
    true distance, and Phi(-z) the bound on the rate: for an A/A an upper bound on false alarms, for
    a real slowdown a lower bound on detection. (An earlier bound took the mean and the SD
    each at its own one-sided bound, more conservative than its stated confidence: 7.6 % where this
    gives 4.9 % for ten fresh-start A/A windows; docs/journal/calibration/cpu-2026-12-02b.md) It
    holds only as far as the windows are independent
    (one server start each: --fresh-servers) and their tails normal; a hiccup-heavy window is the
    risk it does not see."""
    from scipy import optimize
    from scipy import stats as scipy_stats

    highs = [math.log(h) for r in group if (h := r.deciding_high(tolerance, margin))]
    if len(highs) < 5:
        return None
    n, threshold = len(highs), math.log(1.0 - tolerance)
    mean, sd = statistics.fmean(highs), statistics.stdev(highs)
    if sd == 0:
        rate = float(mean < threshold)
        return rate, rate
    estimate = float(scipy_stats.norm.cdf((threshold - mean) / sd))
    # The distance from the line in SDs, on whichever side the windows sit: above it (an A/A) or below.
    above = mean > threshold
    observed = math.sqrt(n) * abs(mean - threshold) / sd

    def excess(z: float) -> float:
        return float(scipy_stats.nct.sf(observed, n - 1, math.sqrt(n) * z)) - (1.0 - confidence)

    # The smallest true distance consistent with the windows (its lower confidence bound, in SDs).
    # Windows far enough from the line put it past 40, the bracket's end: an observed distance above
    # ~55 SDs at n = 20 (the H200 duet's A/A windows: ~60). 40 is then a conservative stand-in, whose
    # tail Phi(-40) is already 0 to double precision.
    z_low = optimize.brentq(excess, -40.0, 40.0) if excess(40.0) > 0 else 40.0
    tail = float(scipy_stats.norm.cdf(-z_low))  # probability of landing on the threshold's other side
    return estimate, (tail if above else 1.0 - tail)


def _rate(p: float) -> str:
    percent = p * 100
    if percent < 0.001:
        return "< 0.001 %"
    if percent > 99.999:
        return "> 99.999 %"
    # near 0 or 100 %, enough decimals that a bound of 99.996 % never reads "100 %"
    return f"{percent:.3f} %" if percent > 99.9 or percent < 0.1 else f"{percent:.4g} %"


def summarize(results: Sequence[WindowResult], tolerances: Sequence[float], margin: float = 0.05,
              shipped: float | None = None) -> list[dict[str, Any]]:
    rows = []
    for design in sorted({r.design for r in results}):
        for level in sorted({r.level for r in results if r.design == design}):
            group = [r for r in results if r.design == design and r.level == level]
            tpot = [r.server_tpot_ratio for r in group if r.server_tpot_ratio]
            row: dict[str, Any] = {
                "design": design, "injected slowdown": f"{level * 100:g} %", "windows": len(group),
                "median ratio": round(statistics.median(r.ratio for r in group), 3),
                "server TPOT x": (f"{statistics.median(tpot):.3f} ({min(tpot):.3f}-{max(tpot):.3f})" if tpot else "-"),
                "median CI high": round(statistics.median(r.ci_high for r in group if r.ci_high), 3)
                if any(r.ci_high for r in group) else "-",
                "server starts": len({r.start for r in group}) if design != "sequential" else "-",
            }
            if any(r.first_ci_high is not None for r in group):
                row["follow-ups"] = sum(r.first_ci_high is not None and (r.first_ci_low, r.first_ci_high) != (
                    r.ci_low, r.ci_high) for r in group)
            for tol in tolerances:
                k = sum(r.fails(tol, margin) for r in group)
                lo, hi = binomial_interval(k, len(group))
                row[f"fail @ tol {tol * 100:g} %"] = f"{k}/{len(group)} ({lo * 100:.0f}-{hi * 100:.0f} %)"
            if shipped is not None and design != "sequential" and level > 0:
                # The injector's effect on one start of the candidate is the level times that start's
                # offset from the reference's (A/A TPOT ratios 0.974-1.040 on the cpu rig): the
                # windows vLLM's own TPOT says were really slowed by the level or more.
                real = [r for r in group if r.server_tpot_ratio and r.server_tpot_ratio >= 1 + level]
                row[f"caught @ {shipped * 100:g} %, TPOT x >= {1 + level:g}"] = (
                    f"{sum(r.fails(shipped, margin) for r in real)}/{len(real)}")
            if shipped is not None and design != "sequential":
                model = normal_model_rate(group, shipped, margin)
                row[f"normal model @ {shipped * 100:g} %"] = "-" if model is None else (
                    f"{_rate(model[0])} (<= {_rate(model[1])})" if level == 0
                    else f"{_rate(model[0])} (>= {_rate(model[1])})")
            rows.append(row)
    return rows


# Per injector: the sentence that opens the table's legend, and what `server TPOT x` then measures.
INJECTOR_TEXT = {
    "cpu": ("Injected slowdown: specgate_lab.inject lengthens every engine step of the candidate server by that "
            "fraction of the step's own duration, waiting on the host. ", "what the injection really did"),
    "gpu": ("Injected slowdown: specgate_lab.inject enqueues GPU work of that fraction of each model step's own "
            "GPU time on the candidate's model-runner stream. ", "what the injection really did"),
    "none": ("No injector on either side: every window is an A/A of two identical servers. ",
             "the two servers' own difference"),
    "?": ("Injector: not recorded (a run that ended before writing its meta), or not the same in every run. ",
          "any injection's effect and the servers' own difference"),
}


def check_injector(injector: str, levels: Sequence[float]) -> None:
    """An injector calibrate knows, and levels it can serve ("none" serves the A/A only)."""
    if injector not in ("cpu", "gpu", "none"):
        raise ValueError(f"injector must be 'cpu', 'gpu' or 'none', got {injector!r}")
    if injector == "none" and any(levels):
        raise ValueError(f"--injector none measures the A/A only: give --levels 0 (got {list(levels)})")


def render_markdown(rig: Rig, rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    from tabulate import tabulate

    repeats = f"{meta['repeats']} repeat(s) x prompts per class" if meta.get("repeats") else "repeats not recorded"
    starts = "both servers started again for every round" if meta.get("fresh_servers") else "one start of both servers"
    injector_text, tpot_means = INJECTOR_TEXT.get(meta.get("injector", "?"), INJECTOR_TEXT["?"])
    head = (f"# Calibration of rig {rig.name}\n\n"
            f"{meta['started']} to {meta['finished']}; mode {meta['mode']}; classes {', '.join(meta['classes'])}; "
            f"{meta['rounds']} round(s); protocol: {repeats}, max_tokens {rig.protocol.max_tokens}, "
            f"concurrency {meta['concurrency']}; machine: {meta['machine']}; {starts}.\n\n"
            + injector_text +
            "`server TPOT x`: vLLM's own time per output token, candidate over reference, median (range) over "
            f"the windows: {tpot_means}. `fail @ tol t`: "
            "windows whose ratio interval lies wholly below 1 - t (at 0 % these are false alarms, otherwise "
            "detections), with the exact 95 % binomial interval of the rate. `normal model @ t`: at the rig's "
            "shipped tolerance, the rate a normal model of the windows' deciding upper ends (log scale) gives, "
            "with its exact one-sided 95 % bound (noncentral t on the upper ends' distance from the line in SDs; "
            "an upper bound on false alarms, a lower bound on detection; specgate_lab.calibrate.normal_model_rate): "
            "an extrapolation that is only as good as the windows are independent (`server starts`) and their "
            "tails normal.\n\n")
    return head + tabulate(rows, headers="keys", tablefmt="github") + "\n"


def plot_power(results: Sequence[WindowResult], tolerances: Sequence[float], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    paired = "alternation" if any(r.design == "alternation" for r in results) else "duet"
    for ax, design in zip(axes, (paired, "sequential")):
        for tol in tolerances:
            levels = sorted({r.level for r in results if r.design == design})
            rates, errs = [], [[], []]
            for level in levels:
                group = [r for r in results if r.design == design and r.level == level]
                k = sum(r.fails(tol) for r in group)
                lo, hi = binomial_interval(k, len(group))
                rate = k / len(group)
                rates.append(rate)
                errs[0].append(rate - lo)
                errs[1].append(hi - rate)
            if levels:
                ax.errorbar([lv * 100 for lv in levels], rates, yerr=errs, marker="o", capsize=3,
                            label=f"tolerance {tol * 100:g} %")
        ax.set_title(f"{design} design")
        ax.set_xlabel("injected slowdown (% of each engine step)")
        ax.axhline(0.95, color="grey", lw=0.8, ls="--")
        ax.axhline(0.01, color="grey", lw=0.8, ls=":")
    axes[0].set_ylabel("share of windows failing the gate")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run_calibration(rig: Rig, out: Path, *, mode_name: str | None = None, rounds: int = 3,
                    levels: Sequence[float] = DEFAULT_LEVELS, classes: Sequence[str] | None = None,
                    tolerances: Sequence[float] = DEFAULT_TOLERANCES, concurrency: int | None = None,
                    seed: int = 0, fresh_servers: bool = False, injector: str = "cpu",
                    progress: Callable[[str], None] = print) -> Path:
    """Start the two servers, measure every window, write the outputs; returns calibration.md.
    ``fresh_servers``: start both servers again for every round, so each round's windows sample a
    new start offset, as separate CI runs would (without it every window shares one start).
    ``injector``: "cpu" lengthens each engine step on the host (hidden by async scheduling on a GPU);
    "gpu" enqueues GPU work on the model runner's stream (specgate_lab.inject); "none" loads no injector
    on either side (a true A/A: only level 0). On a rig whose design is
    an alternation (specgate.config.arrangement) the two servers take turns by vLLM sleep mode, as the gates'."""
    from specgate.serve.server import VLLMServer, spec_for_mode
    from specgate.serve.sleep import SleepController, run, with_sleep_mode

    check_injector(injector, levels)
    alternate = rig.arrangement.name == "alternate"
    paired_design = "alternation" if alternate else "duet"

    out.mkdir(parents=True, exist_ok=True)
    for kept in ("windows.jsonl", "measurements.jsonl.gz"):
        if (out / kept).exists() and (out / kept).stat().st_size:
            # appending would mix two calibrations' windows in one file (the tables are per run)
            raise ValueError(f"{out / kept} already holds another calibration's windows: give a new --out "
                             "(or render that one again with --render)")
    mode = rig.mode(mode_name or rig.reference_mode)
    prompt_classes = [c for c in rig.prompt_classes if classes is None or c.name in classes]
    if not prompt_classes:
        raise ValueError(f"none of the classes {list(classes or [])} is in rig {rig.name}")
    level_file = out / "slowdown"
    level_file.write_text("0\n")
    concurrency = concurrency or rig.protocol.concurrency[0]
    # the gate settings the session would resolve for this mode (specgate.decide.settings), per class
    settings = {c.name: window_settings(rig, mode.name, c.name, concurrency) for c in prompt_classes}
    first_look: list[tuple[float | None, float | None]] = []  # the window being measured (one at a time)

    def follow_up(first: ClassMeasurement) -> str | None:
        """The follow-up rounds whenever the gate would want them at any of the table's thresholds."""
        window = settings[first.prompt_class]
        _, lo, hi, n = decide(first, first.partner, confidence=window.confidence)
        first_look[:] = [(lo, hi)]
        open_at = [t for t in tolerances if lo is not None and hi is not None
                   and first_look_undecided(lo, hi, 1.0 - t, window.thresholds.equivalence_margin)]
        return (f"undecided at the first look ({n} pairs, {lo:.3f}-{hi:.3f}) at tolerance "
                f"{', '.join(f'{t * 100:g} %' for t in open_at)}") if open_at else None

    measurer = Measurer(rig, progress=progress,
                        telemetry=window_sampler(rig.tier, os.environ.get("CUDA_VISIBLE_DEVICES")),
                        follow_up=follow_up if rig.protocol.follow_up_repeats else None)
    results: list[WindowResult] = []
    windows_path = out / "windows.jsonl"
    started = dt.datetime.now().isoformat(timespec="seconds")
    meta = {"started": started, "finished": "?", "mode": mode.name, "classes": [c.name for c in prompt_classes],
            "rounds": "?", "concurrency": concurrency, "repeats": rig.protocol.repeats, "machine": machine_line(),
            "fresh_servers": fresh_servers, "injector": injector, "design": rig.arrangement.label}
    (out / "meta.json").write_text(json.dumps(meta, indent=2))  # what a run that dies before its tables measured
    pending_sequential: dict[str, list[tuple[int, float, ClassMeasurement]]] = {}
    rng = random.Random(seed)

    level_env = {"gpu": ENV_GPU_FILE, "cpu": ENV_FILE}.get(injector)
    sleeper: list[Any] = [None]  # this start's SleepController on an alternation rig

    def start_pair(servers: contextlib.ExitStack, start: int) -> tuple[Any, Any]:
        """Both servers, one after the other; each start's logs kept (servers-2/, ...). On an
        alternation rig each starts with sleep mode, after the other went to sleep."""
        log_dir = out / f"servers-{start + 1}" if start else out
        specs = [spec_for_mode(rig, mode, log_dir=log_dir, side=side, side_name=name) for name, side in
                 (("reference", Side()),
                  ("candidate", Side(env={level_env: str(level_file)} if level_env else {})))]
        if not alternate:
            return tuple(servers.enter_context(VLLMServer(spec, progress=progress)) for spec in specs)
        controller = sleeper[0] = SleepController(rig, progress=progress, gpus=os.environ.get("CUDA_VISIBLE_DEVICES"))
        started = []
        for spec in specs:
            run(controller.make_room())
            server = servers.enter_context(VLLMServer(with_sleep_mode(spec), progress=progress))
            controller.add(server)
            started.append(server)
        return tuple(started)

    round_index, stopped = 0, None
    try:
        with contextlib.ExitStack() as servers:
            for round_index in range(rounds):
                start = round_index if fresh_servers else 0
                if round_index == 0 or fresh_servers:
                    servers.close()  # the previous pair stops before the next starts
                    if start:
                        progress(f"calibration round {round_index + 1}/{rounds}: starting both servers again "
                                 f"(start {start + 1})")
                    reference, candidate = start_pair(servers, start)
                order = list(levels)
                rng.shuffle(order)
                for level in order:
                    level_file.write_text(f"{level}\n")
                    for prompt_class in prompt_classes:
                        progress(f"calibration round {round_index + 1}/{rounds}: slowdown {level * 100:g} % "
                                 f"on {prompt_class.name}")
                        m = measurer.measure_duet(Duet(candidate, reference, mode, mode, ab=True), prompt_class,
                                                  concurrency, sleeper=sleeper[0])
                        assert m.partner is not None
                        ratio, lo, hi, n = decide(m, m.partner, confidence=settings[m.prompt_class].confidence)
                        now = dt.datetime.now().isoformat(timespec="seconds")
                        first_lo, first_hi = first_look.pop() if first_look else (None, None)
                        record = [WindowResult(round_index, level, prompt_class.name, paired_design, ratio, lo, hi, n,
                                               server_tpot_ratio(m, m.partner), now, first_lo, first_hi, start)]
                        # sequential: earlier candidate windows of this class against this round's reference side
                        for earlier_round, earlier_level, earlier in pending_sequential.pop(prompt_class.name, []):
                            s_ratio, s_lo, s_hi, s_n = decide(earlier, m.partner, extra_log_spread=start_spread(
                                settings[m.prompt_class].thresholds.start_noise))
                            record.append(WindowResult(earlier_round, earlier_level, prompt_class.name, "sequential",
                                                       s_ratio, s_lo, s_hi, s_n, None, now, start=start))
                        pending_sequential.setdefault(prompt_class.name, []).append((round_index, level, m))
                        with windows_path.open("a") as handle:
                            for r in record:
                                handle.write(window_line(r))
                        # Every request of the window, both sides, with its telemetry: what a false
                        # alarm or a missed slowdown looked like, request by request.
                        with gzip.open(out / "measurements.jsonl.gz", "at") as handle:
                            handle.write(json.dumps({"round": round_index, "level": level, **m.to_dict()}) + "\n")
                        results.extend(record)
                        progress(f"  ratio {ratio:.3f} (CI {lo if lo is None else round(lo, 3)}-"
                                 f"{hi if hi is None else round(hi, 3)}), server TPOT x {record[0].server_tpot_ratio}")
            level_file.write_text("0\n")
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM through the CLI: keep the tables of what was measured
        stopped = f"stopped during round {round_index + 1} of {rounds}"
        if not results:
            raise
    per_round = len(levels) * len(prompt_classes)
    complete = sum(sum(r.round == i and r.design == paired_design for r in results) == per_round for i in range(rounds))
    finished = dt.datetime.now().isoformat(timespec="seconds")
    if stopped:
        finished += f" ({stopped}; {complete} complete round(s))"
    path = write_outputs(rig, out, results, tolerances, {**meta, "finished": finished, "rounds": complete})
    if stopped:
        raise CalibrationStopped(path)
    return path


class CalibrationStopped(KeyboardInterrupt):
    """The calibration was interrupted; ``path`` is the calibration.md written from the windows measured."""

    def __init__(self, path: Path):
        super().__init__(str(path))
        self.path = path


def machine_line() -> str:
    import platform

    model = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores"


def load_windows(path: Path) -> list[WindowResult]:
    return [WindowResult(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def window_line(r: WindowResult) -> str:
    """One window as a line of windows.jsonl (load_windows reads it back)."""
    return json.dumps(r.__dict__) + "\n"


def save_windows(path: Path, results: Sequence[WindowResult]) -> None:
    """windows.jsonl as run_calibration writes it, one window a line."""
    path.write_text("".join(map(window_line, results)))


UNKNOWN_META = {"started": "?", "finished": "?", "mode": "?", "classes": [], "rounds": "?", "concurrency": "?",
                "machine": "?"}


def read_meta(folder: Path) -> dict[str, Any]:
    """A run's meta: from summary.json when its tables were written, else from meta.json (written
    when the run started, so a run that died before its tables still says what it measured)."""
    for name in ("summary.json", "meta.json"):
        if (folder / name).exists():
            data = json.loads((folder / name).read_text())
            return {**UNKNOWN_META, **(data["meta"] if name == "summary.json" else data)}
    return dict(UNKNOWN_META)


def _agreed(metas: Sequence[dict[str, Any]], key: str) -> dict[str, Any]:
    """``{key: value}`` when every run recorded the same value, else nothing (unknown)."""
    values = [m.get(key) for m in metas]
    return {key: values[0]} if None not in values and all(v == values[0] for v in values) else {}


def load_runs(dirs: Sequence[Path]) -> tuple[list[WindowResult], dict[str, Any]]:
    """The windows of one or more calibration runs (each a folder with windows.jsonl and, when it
    finished or was stopped, summary.json), as one set: each later run's rounds and server starts
    are renumbered after the earlier ones', so every start stays its own. The meta says which runs
    and machines they came from; runs of different modes or classes are refused by name, since
    their windows do not measure the same thing."""
    results: list[WindowResult] = []
    metas: list[dict[str, Any]] = []
    for folder in dirs:
        windows = folder / "windows.jsonl"
        if not windows.exists():
            raise FileNotFoundError(f"{windows} does not exist")
        meta = read_meta(folder)
        own = load_windows(windows)
        if results and own:
            first_round = max(r.round for r in results) + 1
            first_start = max(r.start for r in results) + 1
            own = [dataclasses.replace(r, round=r.round + first_round, start=r.start + first_start) for r in own]
        for earlier, other in zip(metas, dirs):
            for key in ("mode", "classes", "repeats", "injector"):
                unknown = UNKNOWN_META.get(key, "?")
                mine, theirs = meta.get(key, unknown), earlier.get(key, unknown)
                if unknown not in (mine, theirs) and mine != theirs:
                    raise ValueError(f"{folder} measured {key} {mine!r}, {other} {theirs!r}: "
                                     f"render them apart")
        results += own
        metas.append(meta)
    if len(metas) == 1:
        return results, metas[0]
    known = [m for m in metas if m["started"] != UNKNOWN_META["started"]]
    machines = sorted({str(m["machine"]) for m in metas})
    return results, {
        "started": min((m["started"] for m in known), default="?"),
        "finished": max((m["finished"] for m in known), default="?"),
        "mode": metas[0]["mode"], "classes": metas[0]["classes"],
        "rounds": len({r.round for r in results}), "concurrency": metas[0]["concurrency"],
        **_agreed(metas, "repeats"),
        "machine": "; ".join(machines) if len(machines) > 1 else machines[0],
        "fresh_servers": all(m.get("fresh_servers") for m in metas),
        **_agreed(metas, "injector"),
        "runs": [str(d) for d in dirs],
    }


def write_outputs(rig: Rig, out: Path, results: Sequence[WindowResult], tolerances: Sequence[float],
                  meta: dict[str, Any]) -> Path:
    rows = summarize(results, tolerances, rig.gates.equivalence_margin, shipped=rig.gates.ab_gate_tolerance)
    (out / "summary.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    plot_power(results, tolerances, out / "power.png")
    path = out / "calibration.md"
    path.write_text(render_markdown(rig, rows, meta))
    return path
