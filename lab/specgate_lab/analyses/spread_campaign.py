"""A start-spread campaign's figures from its kept raw data (issue 64, items 1 and 3):

- acceptance per fresh start: each ``acc-NN.report.json.gz`` is one session of a rig with
  speculative modes (one fresh server start per mode); per mode, class and start, the mean acceptance
  length from vLLM's counters, with two within-run 95 % intervals: the acceptance gate's (drafts as
  binomial trials, ``specgate.decide.gates.check_acceptance``) and a cluster-robust one from the streams
  (each prompt's requests one cluster, the delta method, Student's t at prompts - 1 df, as
  ``specgate.decide.stats.paired_acceptance``); then the spread between starts against those intervals
  (the SD between starts, Cochran's Q over the starts with each start's cluster interval), whether
  the generated texts were identical across starts, and the acceptance gate's verdict of each later
  start against the first (stored);
- an A/B over start pairs: each folder ``<arm>/pair-NN/report.json.gz`` is one session starting
  both sides afresh; the verdict combined over an arm's start pairs is ``specgate.decide.start_pairs``'
  own (``python -m specgate start-pairs --combine-only`` reads the same files).

    python -m specgate_lab.analyses.spread_campaign docs/evidence/lab/2026-12-06-h100-spread-pairs

The raw sessions are trimmed for keeping with ``--trim RUNS_DIR OUT_DIR`` (a campaign's
/root/runs/NAME as ``gpu-lab-collect.sh`` packs it): every report's keys but ``fingerprints``, each
window without its telemetry, and per request only its id, prompt, token and chunk counts, decode
rate and a hash of its text.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import shutil
import statistics
from collections import defaultdict
from pathlib import Path

from scipy.stats import chi2
from scipy.stats import t as student_t

RECORD_KEYS = ("request_id", "prompt_id", "completion_tokens", "decode_tokens_per_s", "finish_reason", "ttft_s")


# ---------------------------------------------------------------- trimming


def trim_record(record: dict) -> dict:
    out = {k: record.get(k) for k in RECORD_KEYS}
    out["chunks"] = len(record.get("chunk_times") or [])
    out["text_sha1"] = hashlib.sha1((record.get("text") or "").encode()).hexdigest()[:12]
    return out


def trim_window(window: dict) -> dict:
    out = {k: v for k, v in window.items() if k not in ("records", "partner", "telemetry")}
    out["records"] = [trim_record(r) for r in window.get("records") or []]
    if isinstance(window.get("partner"), dict):
        out["partner"] = trim_window(window["partner"])
    return out


def trim_report(report: dict) -> dict:
    out = {k: v for k, v in report.items() if k not in ("fingerprints", "measurements")}
    out["measurements"] = [trim_window(m) for m in report.get("measurements") or []]
    return out


def _write_gz(report: dict, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(gzip.compress(json.dumps(trim_report(report), separators=(",", ":")).encode(), 9, mtime=0))


def trim_campaign(runs: Path, out: Path) -> list[Path]:
    """``runs``' sessions trimmed into ``out``: acc-NN/report.json -> acc-NN.report.json.gz,
    ARM/pair-NN/report.json -> ARM/pair-NN/report.json.gz, and the campaign's log."""
    written = []
    for report in sorted(runs.glob("acc-*/report.json")):
        target = out / f"{report.parent.name}.report.json.gz"
        _write_gz(json.loads(report.read_text()), target)
        written.append(target)
    for report in sorted(runs.glob("*/pair-*/report.json")):
        target = out / report.parent.parent.name / report.parent.name / "report.json.gz"
        _write_gz(json.loads(report.read_text()), target)
        written.append(target)
    # a kept reference's sessions (issue 64, item 4: K1, K2; item 2: TAA, T15) and the advice session (item 5: ADV)
    for report in sorted([*runs.glob("K*/report.json"), *runs.glob("T*/report.json"), *runs.glob("ADV/report.json")]):
        target = out / f"{report.parent.name}.report.json.gz"
        _write_gz(json.loads(report.read_text()), target)
        written.append(target)
    for name in ("campaign.log", "lab-machine.txt", "K2-plan.txt", "spin-ms.txt"):
        if (runs / name).exists():
            shutil.copy(runs / name, out / name)
            written.append(out / name)
    return written


# ---------------------------------------------------------------- acceptance per start


def _report(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def request_counts(record: dict) -> tuple[int, int] | None:
    """(accepted draft tokens, decode steps) of one request from its stream, as
    ``specgate.measure.per_request.stream_acceptance``: each engine step sends one chunk (one verified token plus
    the drafts it accepted) after the prefill's, so accepted = tokens - chunks, steps = chunks - 1."""
    tokens, chunks = record.get("completion_tokens") or 0, record.get("chunks") or 0
    if chunks < 2 or tokens < chunks:
        return None
    return tokens - chunks, chunks - 1


def cluster_interval(clusters: list[tuple[float, float]], confidence: float = 0.95) -> tuple[float, float, float]:
    """Accepted per step R = sum(a) / sum(s) over clusters (prompts), its cluster-robust standard
    error (delta method: sqrt(n / (n - 1) * sum((a_j - R s_j)^2)) / sum(s)) and the t quantile's
    half-width at n - 1 df. Returns (R, se, half)."""
    n = len(clusters)
    a, s = sum(c[0] for c in clusters), sum(c[1] for c in clusters)
    r = a / s
    if n < 2:
        return r, math.nan, math.nan
    se = math.sqrt(n / (n - 1) * sum((aj - r * sj) ** 2 for aj, sj in clusters)) / s
    return r, se, float(student_t.ppf(0.5 + confidence / 2, n - 1)) * se


def window_figures(window: dict) -> dict:
    """One speculative window's acceptance: the counters' figures, the gate's (drafts as trials)
    and the streams' cluster-robust standard errors of the mean acceptance length, and the texts."""
    acc = window["acceptance"]
    drafts, accepted = acc["drafts"], acc["accepted_tokens"]
    k = round(acc["draft_tokens"] / drafts) if drafts else 0
    rate = acc["acceptance_rate"]
    length = acc["mean_acceptance_length"]
    gate_se = k * math.sqrt(rate * (1 - rate) / drafts) if drafts else math.nan
    per_prompt: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    stream_accepted = 0
    for record in window["records"]:
        counts = request_counts(record)
        if counts is None:
            continue
        per_prompt[record["prompt_id"]][0] += counts[0]
        per_prompt[record["prompt_id"]][1] += counts[1]
        stream_accepted += counts[0]
    per_step, cluster_se, half = cluster_interval([tuple(v) for v in per_prompt.values()])
    texts = defaultdict(list)
    for record in window["records"]:
        texts[record["prompt_id"]].append(record["text_sha1"])
    return {"k": k, "drafts": drafts, "accepted": accepted, "per_position": acc.get("accepted_per_position"),
            "length": length, "rate": rate, "gate_se": gate_se,
            "stream_length": 1 + per_step, "stream_accepted": stream_accepted, "cluster_se": cluster_se,
            "cluster_half": half, "prompts": len(per_prompt), "requests": len(window["records"]),
            "texts": dict(texts)}


def acceptance_windows(folder: Path) -> dict[tuple[str, str], list[tuple[str, dict]]]:
    """(mode, class) -> [(start name, window figures)] over the acc-NN sessions, in start order."""
    found: dict[tuple[str, str], list[tuple[str, dict]]] = defaultdict(list)
    for path in sorted(folder.glob("acc-*.report.json.gz")):
        start = path.name.split(".")[0]
        for window in _report(path)["measurements"]:
            if window.get("acceptance"):
                found[(window["mode"], window["prompt_class"])].append((start, window_figures(window)))
    return found


def _identical(starts: list[tuple[str, dict]]) -> str:
    first = starts[0][1]["texts"]
    same = total = 0
    for _, fig in starts[1:]:
        for prompt, hashes in fig["texts"].items():
            for i, h in enumerate(hashes):
                total += 1
                same += i < len(first.get(prompt, [])) and first[prompt][i] == h
    return f"{same}/{total}"


def gate_verdicts(folder: Path) -> list[str]:
    lines = []
    for path in sorted(folder.glob("acc-*.report.json.gz")):
        report = _report(path)
        for gate in [*report.get("gates", []), *report.get("undecided", [])]:
            if gate.get("gate") != "acceptance":
                continue
            first = (gate.get("details") or {}).get("checks") or [{}]
            c = first[0]
            interval = (f"{c['ratio']:.3f} ({c['ci_low']:.3f}-{c['ci_high']:.3f})"
                        if c.get("ratio") is not None and c.get("ci_low") is not None else "-")
            lines.append(f"| {path.name.split('.')[0]} | {gate['mode']} | {gate['prompt_class']} | "
                         f"{gate.get('outcome', 'undecided')} | {interval} |")
    return lines


def _same_counters(starts: list[tuple[str, dict]]) -> bool:
    def counters(f: dict) -> tuple:
        return f["drafts"], f["accepted"], f["per_position"]

    return all(counters(f) == counters(starts[0][1]) for _, f in starts)


def render_acceptance(folder: Path) -> list[str]:
    windows = acceptance_windows(folder)
    if not windows:
        return ["(no acceptance sessions)"]
    z = 1.959963984540054
    lines = ["## Acceptance per fresh start", "",
             "| mode | class | start | drafts | accepted | mean acceptance length | gate's 95 % (drafts as trials) | "
             "accepted per decode step, streams | its 95 % (prompts as clusters) | streams / counters, accepted |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    summary = ["", "| mode | class | starts | lengths | SD between starts | gate's SE (median) | SD / gate's SE | "
               "Cochran's Q (p) | counters as start 1's | texts as start 1's |",
               "|---|---|---|---|---|---|---|---|---|---|"]
    for (mode, klass), starts in sorted(windows.items()):
        for start, f in starts:
            per_step, half, length, gate_half = f["stream_length"] - 1, f["cluster_half"], f["length"], z * f["gate_se"]
            lines.append(f"| {mode} | {klass} | {start} | {f['drafts']:.0f} | {f['accepted']:.0f} | {length:.4f} | "
                         f"{length - gate_half:.4f}-{length + gate_half:.4f} | {per_step:.4f} | "
                         f"{per_step - half:.4f}-{per_step + half:.4f} | {f['stream_accepted']}/{f['accepted']:.0f} |")
        lengths = [f["length"] for _, f in starts]
        sd = statistics.stdev(lengths) if len(lengths) > 1 else math.nan
        ses = [f["gate_se"] for _, f in starts]
        gate_se = statistics.median(ses)
        if len(lengths) > 1 and all(se > 0 for se in ses):
            w = [1 / se**2 for se in ses]
            mean = sum(wi * x for wi, x in zip(w, lengths)) / sum(w)
            q = sum(wi * (x - mean) ** 2 for wi, x in zip(w, lengths))
            cochran = f"{q:.2f} ({chi2.sf(q, len(lengths) - 1):.3f})"
        else:
            cochran = "-"
        summary.append(f"| {mode} | {klass} | {len(lengths)} | {min(lengths):.4f}-{max(lengths):.4f} | {sd:.4f} | "
                       f"{gate_se:.4f} | {sd / gate_se:.2f} | {cochran} | "
                       f"{'identical' if _same_counters(starts) else 'differ'} | {_identical(starts)} |")
    names = [start for start, _ in max(windows.values(), key=len)]
    compact = ["", "Mean acceptance length per start (vLLM's counters):", "",
               "| mode | class | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for (mode, klass), starts in sorted(windows.items()):
        by_start = {start: f["length"] for start, f in starts}
        compact.append(f"| {mode} | {klass} | " + " | ".join(f"{by_start[n]:.4f}" if n in by_start else "-"
                                                            for n in names) + " |")
    ready = []
    for path in sorted(folder.glob("acc-*.report.json.gz")):
        servers = _report(path).get("servers") or {}
        ready.append(f"{path.name.split('.')[0]}: " + ", ".join(f"{name} {(s.get('ready_after_s') or 0):.0f} s"
                                                                for name, s in servers.items()))
    compact += ["", "Server starts (ready after): " + "; ".join(ready)]
    verdicts = gate_verdicts(folder)
    tail = ["", "The acceptance gate, each start against the first start stored "
            "(overall rate, measured / stored, at the gate's Bonferroni share):", "",
            "| start | mode | class | outcome | overall rate ratio (interval) |", "|---|---|---|---|---|", *verdicts] \
        if verdicts else []
    return lines + compact + summary + tail


# ---------------------------------------------------------------- A/B over start pairs


def render_start_pairs(folder: Path, rig_name: str) -> list[str]:
    from specgate.config.rig import load_rig
    from specgate.decide.start_pairs import combine_folder
    from specgate.report.verdicts import statement

    rig = load_rig(rig_name, Path(__file__).resolve().parents[3] / "fixtures")
    lines = []
    for arm in sorted(p for p in folder.iterdir() if p.is_dir() and any(p.glob("pair-*/report.json.gz"))):
        lines += ["", f"## A/B over start pairs: {arm.name}", ""]
        for pair in sorted(arm.glob("pair-*/report.json.gz")):
            report = _report(pair)
            first = next(iter(((report.get("start_order") or {}).get("first") or {}).values()), "?")
            for gate in [*report.get("gates", []), *report.get("undecided", [])]:
                if gate.get("gate") == "throughput":
                    d = gate.get("details") or {}
                    ratio = f"{d['ratio']:.4f}" if d.get("ratio") else "-"
                    interval = f"{d['ci_low']:.4f}-{d['ci_high']:.4f}" if d.get("ci_low") else "-"
                    lines.append(f"- {pair.parent.name}: {first} side first: {gate.get('outcome', 'undecided')} "
                                 f"{ratio} ({interval}, {d.get('n', '?')} pairs)")
        for combined in combine_folder(rig, arm):
            d = combined["details"]
            lines.append(f"- combined: {combined['outcome'].upper()} {d['ratio']:.4f} ({d['ci_low']:.4f}-"
                         f"{d['ci_high']:.4f}, {combined['start_pairs']} start pairs): {statement(combined)}")
    return lines


def render_kept(folder: Path) -> list[str]:
    """A kept reference's sessions (``K1``, ``K2``...): each server's start (0 s and the same address as the
    session before: the kept one, reused) and the throughput gates' verdicts."""
    sessions = sorted(folder.glob("K*.report.json.gz"))
    lines = ["", "## A kept reference: each session's servers and verdicts", ""] if sessions else []
    for path in sessions:
        report = _report(path)
        servers = "; ".join(f"{name} at {s.get('base_url')} ready after {(s.get('ready_after_s') or 0):.1f} s"
                            for name, s in (report.get("servers") or {}).items())
        lines.append(f"- {path.name.split('.')[0]}: {servers}")
        for gate in [*report.get("gates", []), *report.get("undecided", [])]:
            d = gate.get("details") or {}
            if gate.get("gate") == "throughput" and d.get("ratio"):
                lines.append(f"  - {gate['mode']}/{gate['prompt_class']}: {gate.get('outcome', 'undecided')} "
                             f"{d['ratio']:.4f} ({d['ci_low']:.4f}-{d['ci_high']:.4f}, {d.get('n', '?')} pairs)")
    return lines


def render(folder: Path, rig: str = "h200-wide15b-start-pairs") -> str:
    return "\n".join(render_acceptance(folder) + render_start_pairs(folder, rig) + render_kept(folder))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, nargs="?")
    parser.add_argument("--rig", default="h200-wide15b-start-pairs", help="the start pairs' rig")
    parser.add_argument("--trim", nargs=2, type=Path, metavar=("RUNS_DIR", "OUT_DIR"),
                        help="trim a campaign's sessions for keeping, then print nothing else")
    args = parser.parse_args(argv)
    if args.trim:
        for path in trim_campaign(*args.trim):
            print(path)
        return 0
    if args.folder is None:
        parser.error("give the kept campaign's folder (or --trim RUNS_DIR OUT_DIR)")
    print(render(args.folder, args.rig))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
