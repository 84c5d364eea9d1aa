"""A saved report read back for rendering (``--specgate-report-only``), plain or gzip-compressed:
:func:`read_saved_report` (or an error naming the file and what it lacks) and
:func:`missing_parts` (what an older or trimmed report does not hold, one phrase each).
"""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path
from typing import Any

from specgate.errors import SpecgateError
from specgate.redaction import redact
from specgate.store.figures import ab_side

GZIP_MAGIC = b"\x1f\x8b"
# Without these nothing can be rendered: the rig names the reference mode every table is built on.
REQUIRED = ("rig", "measurements", "gates")
REQUIRED_RIG = ("name", "reference_mode")


def read_saved_report(path: Path | str) -> dict[str, Any]:
    """The report at ``path`` (plain or gzip-compressed JSON, told apart by its first bytes); a
    SpecgateError naming the file and the reason when it cannot be rendered."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        if raw[:2] == GZIP_MAGIC:
            raw = gzip.decompress(raw)
        data = json.loads(raw.decode("utf-8"))
    except (OSError, EOFError, zlib.error, gzip.BadGzipFile, UnicodeDecodeError,
            json.JSONDecodeError) as exc:
        raise SpecgateError(f"{path}: cannot read the report: "
                            f"{type(exc).__name__}: {exc}") from None
    if not isinstance(data, dict) or data.get("specgate_report") != 1:
        raise SpecgateError(f"{path}: not a specgate report (no 'specgate_report': 1 key)")
    lacks = [key for key in REQUIRED if key not in data]
    rig = data.get("rig")
    if isinstance(rig, dict):
        lacks += [f"rig.{key}" for key in REQUIRED_RIG if key not in rig]
    elif "rig" not in lacks:
        lacks.append("rig (not an object)")
    if not (isinstance(data.get("measurements", []), list)
            and isinstance(data.get("gates", []), list)):
        lacks.append("measurements and gates as lists")
    if lacks:
        raise SpecgateError(f"{path}: a specgate report without {', '.join(lacks)}: nothing to "
                            "render it from")
    from specgate.store.readable_report import check_readable  # pydantic: not with the plugin

    check_readable(data, path)
    redact(data)  # an older specgate recorded inherited secrets: none reaches a rendering
    return data


def missing_parts(report: dict[str, Any]) -> list[str]:
    """What this report lacks that a report of today's specgate holds, and what is left out of the
    rendering for it; empty for a live run's report."""
    parts = []
    records = [r for m in report.get("measurements", []) for r in m.get("records") or []]
    if records and not any("started_at" in r for r in records):
        parts.append("request timestamps (trimmed records: no TTFT, engine CPU or slow-spell "
                     "check)")
    if "fingerprints" not in report:
        parts.append("the servers' fingerprints")
    ab = any(ab_side(m.get("partner")) == "reference" for m in report.get("measurements", []))
    if ab and "start_order" not in report:
        parts.append("the A/B's start order")
    if "outcome_policy" not in report:
        parts.append("the outcome policy")
    bare = [e for e in [*report.get("gates", []), *report.get("undecided", [])]
            if not e.get("details") and e.get("gate") != "lossless"]
    if bare:
        parts.append(f"the details of {len(bare)} gate(s) (read from their messages)")
    return parts


def missing_line(report: dict[str, Any]) -> list[str]:
    """The summary's one line for :func:`missing_parts`, or none."""
    parts = missing_parts(report)
    return [f"NOT IN THIS REPORT (older or trimmed): {'; '.join(parts)}"] if parts else []


def load_report(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SpecgateError(f"{path}: cannot read the report: {exc}") from None
    if not isinstance(data, dict) or data.get("specgate_report") != 1:
        raise SpecgateError(f"{path}: not a specgate report (no 'specgate_report': 1 key)")
    return data
