"""Rendering a run from its JSON report (so a saved report renders like a live run):
:func:`render_text` (the terminal summary), :func:`render_markdown` (``summary.md``, the GitHub job
summary) and :func:`render_all` (``summary.md``, the plots and ``report.html`` into a folder).
"""

from __future__ import annotations

import math
import statistics
import textwrap
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

from tabulate import tabulate

from specgate.decide.breakeven import from_report
from specgate.decide.outcome import NOT_STORED, STORING, Outcome, outcome_of_kind, pytest_action
from specgate.measure.protocol import client_decode_rate
from specgate.measure.spells import slow_spell, span_mean_residual
from specgate.report import plots
from specgate.report.comparisons import gate_comparisons, undecided_kind
from specgate.report.html import write_html
from specgate.report.safe_text import markdown_without_html, without_control_chars
from specgate.report.verdicts import (
    LINE_WIDTH,
    breakeven_line,
    clip,
    gating_lines,
    grouped_lines,
    strongest_pair_text,
)
from specgate.store.figures import ab_side, change_percent, is_partner, median_rate
from specgate.store.saved_report import missing_line

# Formats whose cells are separated by "|": a "|" in a cell is escaped (or GitHub splits it).
PIPE_FORMATS = ("github", "pipe")
HTML_NAME = "report.html"  # the self-contained page beside report.json (specgate.report.html)
TABLE_WIDTH = 120  # a terminal table's columns at most; its legend is wrapped to it


def _table(rows: list[list[Any]], headers: list[str], fmt: str, title: str = "") -> str:
    """``title`` and the table: in the terminal at most TABLE_WIDTH columns (the widest cells
    wrapped at their spaces, the legend wrapped), in Markdown as wide as its cells."""
    if fmt in PIPE_FORMATS:
        rows = [[str(cell).replace("|", "\\|") for cell in row] for row in rows]
        headers = [h.replace("|", "\\|") for h in headers]
        head = title + "\n" if title else ""
        return head + tabulate(rows, headers=headers, tablefmt=fmt, disable_numparse=True)
    cells = [[str(cell) for cell in row] for row in rows]
    headers = [{"conc.": "c", "fails": "line"}.get(h, h) for h in headers]
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *cells)]
    # tabulate pads a header by 2
    floors = [max(len(h) + 2, min(w, 8)) for h, w in zip(headers, widths)]
    words = [any(" " in cell for cell in column) for column in zip(*cells)] if cells else []
    # the widest column of words gives a character at a time (tabulate wraps at spaces), then any
    for wrappable in ([i for i, w in enumerate(words) if w], range(len(widths))):
        while sum(map(max, widths, floors)) + 2 * (len(widths) - 1) > TABLE_WIDTH:
            widest = max(wrappable, key=lambda i: widths[i] - floors[i], default=None)
            if widest is None or widths[widest] <= floors[widest]:
                break
            widths[widest] -= 1
    table = tabulate(cells, headers=headers, tablefmt=fmt, disable_numparse=True,
                     maxcolwidths=widths)
    return "\n".join([*textwrap.wrap(title, TABLE_WIDTH), table]) if title else table


def _where(m: dict[str, Any]) -> str:
    """A window as the notice lines name it: 'ngram-coding-c1'."""
    return f"{m['mode']}-{m['prompt_class']}-c{m['concurrency']}"


UNDECIDED_TAGS = {NOT_STORED: "NOT STORED", STORING: "STORING", "too few drafts": "UNDECIDED"}


def _verdict_text(gates: list[dict[str, Any]]) -> str:
    """"pass", "FAIL throughput,backfire", "declared backfire", plus the gates that decided
    nothing ("throughput: no stored figures"); "-" when no gate ran."""
    decided = [g for g in gates if "kind" not in g]
    lost = [g for g in decided if not g["passed"]]
    declared = [g["gate"] for g in lost if g.get("declared")]
    failed = [g["gate"] for g in lost if not g.get("declared") and g.get("gating") != "report"]
    reported = [g["gate"] for g in lost if not g.get("declared") and g.get("gating") == "report"]
    parts = []
    if failed:
        parts.append("FAIL " + ",".join(failed))
    # specgate.decide.outcome: a gate that cannot decide on this rig never fails the run
    if reported:
        parts.append("failed, reported only: " + ",".join(reported))
    if not failed and not reported:
        if declared:
            parts.append("declared backfire")
        elif decided:
            parts.append("pass")
    parts += [f"{g['gate']}: {undecided_kind(g)}" for g in gates if "kind" in g]
    return ", ".join(parts) or "-"


VERDICT_TITLE = ("verdicts, one row per gate: ratio this run / reference (CI); the line it fails "
                 "past (TTFT: above); n: what it rests on")
VERDICT_HEADERS = ["mode", "class", "conc.", "gate", "against", "reference", "this run",
                   "ratio (CI)", "fails", "n", "outcome"]


def verdict_rows(report: dict[str, Any]) -> list[list[Any]]:
    """The verdict table's cells (:func:`verdict_table`), one row per gate entry of the report."""
    return [[c.mode, c.prompt_class, c.concurrency, c.gate_text, c.against, c.reference,
             c.measured, c.ratio_text, c.threshold_text, c.n, c.outcome_text]
            for c in gate_comparisons(report)]


def verdict_table(report: dict[str, Any], fmt: str = "simple") -> str:
    """Every gate: what it compared against, both sides' figures (not in the terminal), the ratio
    with its interval, the threshold, the pairs and the outcome; "" when no gate ran."""
    rows = verdict_rows(report)
    if not rows:
        return ""
    keep = [i for i, h in enumerate(VERDICT_HEADERS)
            if fmt in PIPE_FORMATS or h not in ("reference", "this run")]
    return _table([[row[i] for i in keep] for row in rows], [VERDICT_HEADERS[i] for i in keep], fmt,
                  VERDICT_TITLE)


def speed_table(report: dict[str, Any], fmt: str = "simple") -> str:
    """Per concurrency, class and mode: decode tok/s, its change and the window's verdict."""
    reference = report["rig"]["reference_mode"]
    measurements = report["measurements"]
    modes = [reference, *(m for m in report["rig"]["modes"] if m != reference)]
    verdicts: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    for gate in [*report["gates"], *report.get("undecided", [])]:
        verdicts[(gate["mode"], gate["prompt_class"], gate["concurrency"])].append(gate)
    tables = []
    for concurrency in sorted({m["concurrency"] for m in measurements}):
        by = {(m["mode"], m["prompt_class"]): m for m in measurements
              if m["concurrency"] == concurrency}
        rows = []
        for prompt_class in dict.fromkeys(cls for _, cls in by):
            ref = by.get((reference, prompt_class))
            ref_tps = median_rate(ref) if ref else None
            for mode in modes:
                m = by.get((mode, prompt_class))
                if m is None:
                    continue
                tps = median_rate(m)
                change = (change_percent(report, mode, prompt_class, concurrency, tps, ref_tps)
                          if tps and mode != reference else None)
                rows.append([prompt_class, mode, f"{tps:.1f}" if tps else "-",
                             f"{change:+.0f} %" if change is not None else "-",
                             _verdict_text(verdicts.get((mode, prompt_class, concurrency), []))])
        title = (f"decode tok/s, median per request, concurrency {concurrency}; change against "
                 f"{reference}: the backfire gate's ratio, else of medians")
        tables.append(_table(rows, ["class", "mode", "tok/s", "change", "verdict"], fmt, title))
    return "\n\n".join(tables)


def acceptance_table(report: dict[str, Any], fmt: str = "simple") -> str:
    rows = []
    for m in report["measurements"]:
        acc = m.get("acceptance")
        if not acc:
            continue
        positions = " ".join(f"{r * 100:.0f}" for r in acc.get("per_position_rates", []))
        rows.append([m["mode"], m["prompt_class"], m["concurrency"],
                     f"{acc['mean_acceptance_length']:.2f}",
                     f"{acc['acceptance_rate'] * 100:.1f} %", positions])
    if not rows:
        return ""
    return _table(rows, ["mode", "class", "conc.", "mean acc. length", "acc. rate",
                         "per-position rate %"], fmt,
                  "acceptance (from vLLM's spec-decode counters, this run's windows)")


def window_table(report: dict[str, Any], fmt: str = "simple") -> str:
    """Per measurement window: the median time to first token and, where the server exported its
    decode rate, client vs server decode tok/s and their difference (client / server - 1)."""
    measurements = report["measurements"]
    with_server = any(m.get("server_decode_tokens_per_s") for m in measurements)
    rows = []
    for m in measurements:
        ttfts = [r["ttft_s"] for r in m["records"] if r.get("ttft_s") is not None]
        ttft = statistics.median(ttfts) * 1000 if ttfts else None
        aggregate = m.get("aggregate_tokens_per_s")
        row: list[Any] = [m["mode"], m["prompt_class"], m["concurrency"],
                          f"{len(m['records'])}" + (
                              " (follow-up)" if m.get("follow_up") else
                              " (follow-up skipped)" if m.get("follow_up_skipped") else ""),
                          f"{ttft:.0f}" if ttft is not None else "-",
                          f"{aggregate:.1f}" if aggregate else "-"]
        if with_server:
            # a report from before records kept tpot_s: 1 / decode tok/s is the same interval
            client = client_decode_rate(
                r.get("tpot_s") or (1 / r["decode_tokens_per_s"] if r.get("decode_tokens_per_s")
                                    else None) for r in m["records"])
            server = m.get("server_decode_tokens_per_s")
            row += [f"{client:.1f}" if client else "-", f"{server:.1f}" if server else "-",
                    f"{round((client / server - 1) * 100, 2) + 0.0:+.2f} %"
                    if client and server else "-"]
        rows.append(row)
    if not rows:
        return ""
    # aggregate: every generated token of the window over its wall time, the figure that matters
    # at concurrency > 1 (per-request decode tok/s is in the speed table).
    headers = ["mode", "class", "conc.", "requests", "TTFT median ms", "aggregate tok/s"]
    title = ("per window: requests (with follow-up rounds where the first look left a gate "
             "unsettled), time to first token (median per request), aggregate tok/s (all tokens / "
             "wall time)")
    if with_server:
        headers += ["client tok/s", "server tok/s", "diff %"]
        sources = sorted({m["server_metric_source"] for m in measurements
                          if m.get("server_metric_source")})
        source = (f"vLLM's {', '.join(s.removeprefix('vllm:') for s in sources)} histogram"
                  if sources else "vLLM's /metrics")
        title += (", client vs server decode tok/s (client: 1 / mean time per output token of the "
                  f"requests; server: {source} over the same window; diff = client / server - 1)")
    return _table(rows, headers, fmt, title)


def breakeven_table(report: dict[str, Any], fmt: str = "simple") -> str:
    """Per speculative window: acceptance length, decode steps/s, the step-cost ratio c and the
    break-even line (``specgate.decide.breakeven``); "" when no window has what it needs."""
    rows = []
    for row in from_report(report):
        full = row.get("speedup_at_full_acceptance")
        rows.append([row["mode"], row["prompt_class"], row["concurrency"],
                     f"{row['acceptance_length'][0]:.2f}", f"{row['spec_steps_per_s'][0]:.1f}",
                     f"{row['step_cost'][1]:.2f}", row["verdict"],
                     f"{full[0]:.2f}x" if full else "-",
                     *([breakeven_line(row)] if fmt in PIPE_FORMATS else [])])
    headers = ["mode", "class", "conc.", "AL", "steps/s", "step cost c", "verdict", "at AL = k+1",
               "diagnosis"]
    return _table(rows, headers[:len(rows[0])] if rows else headers, fmt,
                  "break-even: step cost c = AL x no-spec tok/s / spec tok/s, in plain steps; "
                  "speculation pays iff AL > c") if rows else ""


# An engine core using this much CPU per second of its server's requests keeps a CPU busy: its speed
# is the host's as much as the accelerator's (vLLM's draft_model path reads 1.03-1.05 and follows
# the host's speed; EAGLE-3 reads 0.81-0.88).
HOST_BOUND_CPU_S_PER_S = 0.95
# A SLOW SPELL notice needs a run this unlikely from the order alone and this much slower than the
# partner's requests in the same span (log units): over 357 recorded windows these flag three draft
# windows only, two from one slow host.
SPELL_P = 0.01
SPELL_SIZE = 0.03


def engine_cpu_per_s(m: dict[str, Any]) -> float | None:
    """The window's engine-core CPU seconds per second of its own requests, from its telemetry;
    None without it. A duet's telemetry holds both servers (``proc.<label>.EngineCore-<pid>...``):
    this window's is the one of its mode that worked most during its requests."""
    telemetry = m.get("telemetry") or {}
    window = telemetry.get("window") or {}
    engines: dict[str, list[str]] = defaultdict(list)
    for key in window:
        parts = key.split(".")
        if (len(parts) == 4 and parts[0] == "proc" and parts[2].startswith("EngineCore")
                and parts[3] == "cpu_s" and parts[1].split("@")[0] == m["mode"]):
            engines[parts[1]].append(key)
    if not engines:
        return None
    requests = list((telemetry.get("requests") or {}).values())
    own = max(engines, key=lambda label: sum(r.get(k, 0.0) for r in requests
                                             for k in engines[label]))
    cpu_s = sum(window[k] for k in engines[own])
    # a trimmed report (the kept evidence) holds no timestamps: no busy time to divide by
    busy_s = sum(r["finished_at"] - r["started_at"] for r in m.get("records") or []
                 if r.get("finished_at") is not None and r.get("started_at") is not None)
    return cpu_s / busy_s if cpu_s and busy_s > 0 else None


def environment_table(report: dict[str, Any], fmt: str = "simple") -> str:
    """Per window, what the machine did meanwhile (its telemetry): the CPU canary (fastest and
    median, us), CPU busy and stolen shares, the engine core's CPU seconds per second, and on GPU
    rigs the SM clock range, the power and any throttle reason. "" when no window has telemetry."""
    rows = []
    for m in report["measurements"]:
        w = (m.get("telemetry") or {}).get("window")
        if not w:
            continue
        canary = (f"{w['cpu_canary_us'][0]:.1f} ({w['cpu_canary_us'][1]:.1f})"
                  if "cpu_canary_us" in w else "-")
        steal = f"{w['cpu_steal_pct'][2]:.1f}" if "cpu_steal_pct" in w else "-"
        engine = engine_cpu_per_s(m)
        sm = [w[k] for k in sorted(w) if k.endswith(".sm_clock_mhz")]
        power = [w[k][1] for k in sorted(w) if k.endswith(".power_w")]
        rows.append([m["mode"], m["prompt_class"], m["concurrency"], canary,
                     f"{w['cpu_busy_pct'][1]:.0f}" if "cpu_busy_pct" in w else "-", steal,
                     f"{engine:.2f}" if engine is not None else "-",
                     ", ".join(f"{lo:.0f}-{hi:.0f}" for lo, _, hi in sm) or "-",
                     ", ".join(f"{x:.0f}" for x in power) or "-",
                     ", ".join(w.get("throttle_reasons", [])) or "-"])
    return _table(rows, ["mode", "class", "conc.", "canary us", "CPU busy %", "steal %",
                         "engine CPU-s/s", "SM MHz", "power W", "throttle"], fmt,
                  "environment per window (telemetry): CPU canary us, fastest (median): a fixed "
                  "piece of Python work, slower when the host is (the fastest is the host's pace "
                  "the stored figures' check compares); CPU busy % (median) and stolen % (most); "
                  f"engine core CPU-s per s of its requests (>= {HOST_BOUND_CPU_S_PER_S:g}: "
                  "host-bound); GPU SM clock MHz, power W, throttle reasons"
                  ) if rows else ""


def host_bound_lines(report: dict[str, Any]) -> list[str]:
    """GPU windows whose engine core kept a CPU busy: their speed, and a ratio built on it, moves
    with the host's CPU, so a ratio stored in another session compares hosts too."""
    if (report.get("rig") or {}).get("tier") != "gpu":
        return []  # on a CPU rig every engine is host-bound by design
    lines = []
    for m in report["measurements"]:
        engine = engine_cpu_per_s(m)
        if engine is None or engine < HOST_BOUND_CPU_S_PER_S:
            continue
        canary = ((m.get("telemetry") or {}).get("window") or {}).get("cpu_canary_us")
        lines.append(f"HOST-BOUND [{_where(m)}]: its engine core used {engine:.2f} CPU-s per s "
                     "of its requests, so its speed follows the host CPU's"
                     + (f" (canary fastest {canary[0]:.1f} us this window)" if canary else "")
                     + "; a ratio from another session compares the two hosts' speed too (compare "
                     "the canary column of both sessions' environment tables)")
    return lines


def notice_lines(report: dict[str, Any]) -> list[str]:
    """Stored figures from another machine or setup, or stale, and a pair standing out of a
    window's ratio; one line per distinct reason, naming its windows."""
    by_reason: dict[tuple[str, str], list[str]] = defaultdict(list)
    for gate in report["gates"]:
        details = gate.get("details") or {}
        where = _where(gate)
        fit = details.get("baseline_fingerprint") or {}
        tags = {"other_machine": "OTHER MACHINE", "other_setup": "OTHER SETUP"}
        if tag := tags.get(fit.get("kind", "")):
            said = f"the stored figures were measured with {'; '.join(fit['differences'])}"
            by_reason[(tag, said)].append(where)
        if details.get("stale_baseline"):
            by_reason[("STALE FIGURES", details["stale_baseline"])].append(where)
        if pair := details.get("strongest_pair"):
            by_reason[(f"PAIR STANDS OUT in {gate['gate']}",
                       strongest_pair_text(pair))].append(where)
    return [f"{tag} [{', '.join(windows)}]: {text}" for (tag, text), windows in by_reason.items()
            ] + host_bound_lines(report) + spell_lines(report)


def _series(window: dict[str, Any]) -> tuple[list[float], list[float], list[str]]:
    timed = [r for r in window.get("records") or [] if r.get("decode_tokens_per_s")
             and r.get("started_at") is not None]
    return ([r["started_at"] for r in timed], [r["decode_tokens_per_s"] for r in timed],
            [r.get("prompt_id") or r.get("request_id", "").rsplit("#", 1)[0] for r in timed])


def spell_lines(report: dict[str, Any]) -> list[str]:
    """Duet windows where one side ran slow for a stretch and its partner did not
    (specgate.measure.spells): the pairs do not cancel such a spell."""
    lines = []
    for m in report.get("measurements", []):
        partner = m.get("partner")
        if is_partner(m) or not isinstance(partner, dict) or not partner.get("records"):
            continue
        ab = ab_side(partner) == "reference"
        subject = (m["mode"] + ("@candidate" if ab else ""), m)
        reference = (partner["mode"] + ("@reference" if ab else ""), partner)
        for (label, side), (other_label, other) in ((subject, reference), (reference, subject)):
            times, rates, prompts = _series(side)
            spell = slow_spell(times, rates, prompts)
            if spell is None or spell.p_value > SPELL_P:
                continue
            first = min(times)
            t0, t1 = first + spell.started_s[0], first + spell.started_s[1]
            then = round(span_mean_residual(*_series(other), t0, t1) or 0.0, 4) + 0.0  # no "-0.0 %"
            if spell.mean_residual - then > -SPELL_SIZE:
                continue
            lines.append(
                f"SLOW SPELL [{_where(m)}]: {spell.requests} of {label}'s {spell.of} requests, "
                f"{spell.started_s[0]:.0f}-{spell.started_s[1]:.0f} s into the window, ran "
                f"{-math.expm1(spell.mean_residual) * 100:.1f} % under their prompts' other "
                f"requests ({other_label}'s then: {math.expm1(then) * 100:+.1f} %; a run this slow "
                f"from the order alone: p = {spell.p_value:.3f}). The pairs do not cancel a spell "
                "on one side, so this window's ratio holds it: on a shared VM one vCPU running "
                "slower for a while under a host-bound engine core is such a spell")
    return lines


def failed_gate_lines(report: dict[str, Any], *, full: bool = False) -> list[str]:
    """A line per gate that failed or decided nothing, and per window not measured: the terminal's
    short line (three or more alike on one line), or with ``full`` the whole statement."""

    def gate_lines(tagged: list[tuple[str, dict[str, Any]]]) -> list[str]:
        if not full:
            return grouped_lines(tagged)
        return [f"{tag} {e['gate']} [{_where(e)}]: {e['message'].splitlines()[0]}"
                for tag, e in tagged]

    lines = gate_lines([("DECLARED" if gate.get("declared") else "FAILED (reported only)"
                         if gate.get("gating") == "report" else "FAILED", gate)
                        for gate in report["gates"] if not gate["passed"]])
    for failure in report.get("failures", []):
        text = f"NOT MEASURED [{_where(failure)}]: {failure['error'].splitlines()[0]}"
        lines.append(text if full else clip(text))
    undecided = report.get("undecided", [])
    others = [u for u in undecided if undecided_kind(u) != STORING]
    if others:
        lines.append(_decided_nothing_line(others, report.get("outcome_policy") or {}))
    if len(others) < len(undecided):
        lines.append(f"{UNDECIDED_TAGS[STORING]}: {len(undecided) - len(others)} gate(s) measured "
                     "to store their figures, not decided")
    return lines + gate_lines([(UNDECIDED_TAGS.get(undecided_kind(u), undecided_kind(u).upper()), u)
                               for u in others])


def _decided_nothing_line(entries: list[dict[str, Any]], policy: dict[str, Any]) -> str:
    """One line counting the gates that decided nothing, by outcome, and what the run's policy
    made of each (specgate.decide.outcome), whether skipped or failing the run."""
    counts: dict[tuple[Outcome, bool, str], int] = defaultdict(int)
    # a declared backfire never fails the run (specgate.decide.outcome.pytest_action)
    for u in entries:
        outcome = Outcome(u["outcome"]) if "outcome" in u else outcome_of_kind(undecided_kind(u))
        action = pytest_action(outcome, policy, declared="declared" in u, gating=u.get("gating"))
        counts[(outcome, "declared" in u, "FAILED" if action == "failed" else "skipped")] += 1
    parts = [f"{n} {outcome.value}" + (" of a declared backfire (skipped)" if declared
                                       else f" ({action})")
             for (outcome, declared, action), n in counts.items()]
    return (f"DECIDED NOTHING: {len(entries)} gate(s): {', '.join(parts)} ([gates] undecided and "
            "gating, or --specgate-undecided and --specgate-gating)")


def start_order_lines(report: dict[str, Any]) -> list[str]:
    """An A/B's start order: the side started first per mode, and the seed that chose it."""
    order = report.get("start_order")
    if not order or not order.get("first"):
        return []
    firsts = ", ".join(f"{mode}: {side}" for mode, side in sorted(order["first"].items()))
    return [f"START ORDER (side started first, seed {order['seed']}; --specgate-start-seed to "
            f"repeat it): {firsts}"]


def summary_lines(report: dict[str, Any], *, full: bool = False) -> list[str]:
    """The gate and notice lines under the tables: in the terminal a gate's short line and the
    notices wrapped; ``full``: the whole statements (summary.md, report.html)."""
    notices = _notices(report)
    return failed_gate_lines(report, full=full) + (notices if full else _wrapped(notices))


def _notices(report: dict[str, Any]) -> list[str]:
    return (gating_lines(report) + settings_lines(report) + start_order_lines(report)
            + notice_lines(report) + missing_line(report))


def _wrapped(lines: list[str]) -> list[str]:
    """Notice lines wrapped for the terminal, each line after a notice's first indented."""
    return [part for line in lines
            for part in textwrap.wrap(line, LINE_WIDTH, subsequent_indent="  ")]


def detail_tables(report: dict[str, Any], fmt: str = "simple", *, every: bool = False) -> list[str]:
    """The tables after the verdict table, those with something to show: speed, acceptance and
    break-even, and with ``every`` (summary.md, report.html) per window and the environment."""
    if not report["measurements"]:
        return []
    tables = [speed_table(report, fmt), acceptance_table(report, fmt), breakeven_table(report, fmt)]
    if every:
        tables[2:2] = [window_table(report, fmt), environment_table(report, fmt)]
    return [t for t in tables if t]


def render_text(report: dict[str, Any]) -> str:
    """The terminal summary, without control characters (an ANSI escape steers no terminal)."""
    if not report["measurements"]:
        # failures, gates that decided nothing (NOT RUN: the budget), and which of them gate the run
        lines = failed_gate_lines(report) + _wrapped(gating_lines(report))
        return without_control_chars("specgate: nothing was measured"
                                     + ("\n" + "\n".join(lines) if lines else ""))
    rig = report["rig"]
    head = (f"specgate: rig {rig['name']} ({rig.get('tier', '?')} tier, model "
            f"{rig.get('model', '?')})"
            + ("" if report.get("complete", True) else "  [PARTIAL: the run did not finish]"))
    parts = [head, verdict_table(report), *detail_tables(report), "\n".join(summary_lines(report))]
    return without_control_chars("\n\n".join(part for part in parts if part))


def settings_lines(report: dict[str, Any]) -> list[str]:
    """The figures the gates decided with (report.json's "settings"), windows alike on one line."""
    groups: dict[str, list[str]] = {}
    for w in report.get("settings") or []:
        ab = w.get("comparing") == "ab"
        parts = [f"confidence {w['confidence'] * 100:.4g} %",
                 "throughput fails below "
                 f"{1 - (w['ab_tolerance'] if ab else w['level_tolerance']):.3g}"
                 + (" (A/B)" if ab else " (stored level)"),
                 f"acceptance {w['acceptance_tolerance'] * 100:g} %",
                 f"TTFT +{w['ttft_tolerance'] * 100:g} %",
                 f"backfire below {w['min_speedup']:g}x", f"arrangement {w['arrangement']}"]
        if w.get("declared_backfire"):
            parts.append("declared backfire")
        where = f"{w['mode']}/{w['prompt_class']}/c{w['concurrency']}"
        groups.setdefault("; ".join(parts), []).append(where)
    return [f"GATE SETTINGS: {', '.join(windows)}: {figures}"
            for figures, windows in groups.items()]


def render_markdown(report: dict[str, Any]) -> str:
    """summary.md and the GitHub job summary: the verdict table, a link to report.html, the other
    tables and the lines; no name or message opens raw HTML there."""
    lines = failed_gate_lines(report, full=True)
    parts = [f"## specgate: rig `{report['rig']['name']}`"
             + ("" if report.get("complete", True) else " (partial run)"),
             verdict_table(report, "github"),
             "The full report, with the plots and the run's facts: "
             f"[{HTML_NAME}]({HTML_NAME}), beside this summary (in a CI run, in the run's "
             "artifact).",
             *detail_tables(report, "github", every=True),
             "\n".join(f"- {line}" for line in lines) if lines
             else "All gates passed." if report["gates"] else "No gate ran.",
             "\n".join(f"- {line}" for line in _notices(report))]
    return markdown_without_html("\n\n".join(part for part in parts if part) + "\n")


def render_all(report: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """Write ``summary.md``, the plots and ``report.html`` into ``out_dir``; return what was written
    by name (a plot with nothing to draw left out, a stale file of its name removed). A plot or page
    that cannot be drawn is a warning, not an error: the summary is written first."""

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = out_dir / "summary.md"
    summary.write_text(render_markdown(report))
    written: dict[str, Path] = {"summary": summary}
    for name, draw in (("forest", plots.plot_forest), ("throughput", plots.plot_throughput),
                       ("acceptance", plots.plot_acceptance)):
        target = out_dir / f"{name}.png"
        try:
            path = draw(report, target)
        except Exception as exc:  # a plot must never cost the run its report
            warnings.warn(f"specgate: could not draw {target}: {type(exc).__name__}: {exc}",
                          stacklevel=2)
            path = None
        if path is None:
            target.unlink(missing_ok=True)
        else:
            written[name] = Path(path)
    try:
        written["html"] = write_html(report, out_dir / HTML_NAME, written, headers=VERDICT_HEADERS,
                                     lines=summary_lines(report, full=True),
                                     tables="\n\n".join(detail_tables(report, every=True)))
    except Exception as exc:  # like a plot: never at the cost of the summary
        warnings.warn(f"specgate: could not write {out_dir / HTML_NAME}: "
                      f"{type(exc).__name__}: {exc}", stacklevel=2)
    return written
