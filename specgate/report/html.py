"""The run as one self-contained page, ``report.html`` beside ``report.json``: the verdict table,
the plots embedded as base64 PNG, every gate's whole message, and the run's facts. Nothing is
fetched when it is opened; jinja2 (autoescaping on, imported only here) renders it.
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from pathlib import Path
from typing import Any

from specgate.report.comparisons import GateComparison, gate_comparisons
from specgate.report.safe_text import without_control_chars

# plot names as render_all writes them, in the page's order; a missing one is left out
FIGURES = (("forest", "Every gate: the ratio with its interval against its threshold"),
           ("throughput", "Decode tok/s per request"),
           ("acceptance", "Per-position acceptance rate"))
FINGERPRINT_KEYS = ("vllm_version", "accelerator", "accelerator_count", "driver", "cuda_version",
                    "torch_version", "cpu_model", "model", "speculative_config", "server_args",
                    "env", "concurrent_servers", "commit", "date", "note")

TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ title }}</title>
<style>
body{font-family:system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;margin:1.5rem auto;
max-width:1500px;
padding:0 1rem;color:#1d1d1f;line-height:1.4;}
h1{font-size:1.45rem;margin-bottom:.2rem;}
h2{font-size:1.15rem;margin-top:2rem;border-bottom:1px solid #ddd;padding-bottom:.2rem;}
.sub{color:#555;margin-top:0;}
.counts span{display:inline-block;margin:.15rem .4rem .15rem 0;padding:.1rem .55rem;
border-radius:.8rem;
font-weight:600;font-size:.9rem;}
table{border-collapse:collapse;font-size:.86rem;margin:.5rem 0;}
th, td{border:1px solid #d0d0d0;padding:.25rem .5rem;text-align:left;vertical-align:top;}
th{background:#f3f3f3;position:sticky;top:0;}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap;}
tr.pass td.outcome, span.pass{background:#dff3e3;color:#17692a;}
tr.fail td.outcome, span.fail{background:#fadcdc;color:#a00000;}
tr.declared td.outcome, span.declared{background:#fdebd0;color:#8a5300;}
tr.undecided td.outcome, span.undecided{background:#e8e2f4;color:#4a3585;}
tr.nodecision td.outcome, span.nodecision{background:#ececec;color:#444;}
td.outcome{font-weight:600;white-space:nowrap;}
figure{margin:1rem 0 2rem;}
figure img{max-width:100%;height:auto;border:1px solid #e3e3e3;}
figcaption{color:#555;font-size:.9rem;}
pre{background:#f7f7f7;padding:.6rem;overflow-x:auto;font-size:.8rem;}
ul.lines li{margin:.2rem 0;}
.msg{white-space:pre-wrap;font-family:ui-monospace, monospace;font-size:.8rem;}
dl.facts{display:grid;grid-template-columns:max-content auto;gap:.2rem 1rem;font-size:.9rem;}
dl.facts dt{font-weight:600;} dl.facts dd{margin:0;}
</style>
</head>
<body>
<h1>{{ title }}</h1>
<p class="sub">{{ subtitle }}</p>
<p class="counts">{% for name, css, n in counts %}<span class="{{ css }}">{{ n }} {{ name }}</span>
{% endfor %}</p>

<h2 id="verdicts-title">Verdicts</h2>
{% if rows %}
<p>One row per gate, passing gates included: what it compared against, both sides' figures, the
ratio this run / reference with its interval, the line it fails past (TTFT fails above it, the
others below), what the ratio rests on, and the outcome.</p>
<table id="verdicts">
<thead><tr>{% for h in headers %}<th>{{ h }}</th>{% endfor %}</tr></thead>
<tbody>
{% for c in rows %}
<tr class="{{ css(c) }}" data-gate="{{ c.gate }}" data-where="{{ c.where }}">
<td>{{ c.mode }}</td><td>{{ c.prompt_class }}</td><td class="num">{{ c.concurrency }}</td>
<td>{{ c.gate_text }}</td>
<td>{{ c.against }}</td><td class="num">{{ c.reference }}</td><td class="num">{{ c.measured }}</td>
<td class="num">{{ c.ratio_text }}</td><td class="num">{{ c.threshold_text }}</td><td>{{ c.n }}</td>
<td class="outcome">{{ c.outcome_text }}</td>
</tr>
{% endfor %}
</tbody>
</table>
{% else %}
<p>No gate ran.</p>
{% endif %}
{% for name, caption, data in figures if name == "forest" %}
<figure id="figure-{{ name }}"><img alt="{{ caption }}" src="data:image/png;base64,{{ data }}">
<figcaption>{{ caption }} ({{ name }}.png)</figcaption></figure>
{% endfor %}
{% if lines %}
<ul class="lines">{% for line in lines %}<li>{{ line }}</li>{% endfor %}</ul>
{% endif %}

{% for name, caption, data in figures if name != "forest" %}
<figure id="figure-{{ name }}"><img alt="{{ caption }}" src="data:image/png;base64,{{ data }}">
<figcaption>{{ caption }} ({{ name }}.png)</figcaption></figure>
{% endfor %}

<h2>The run</h2>
<dl class="facts">
{% for key, value in facts %}<dt>{{ key }}</dt><dd>{{ value }}</dd>
{% endfor %}
</dl>
{% if servers %}
<h2>Servers</h2>
<table><thead><tr><th>server</th><th>side</th><th>ready after</th><th>GPUs</th><th>log</th></tr>
</thead><tbody>
{% for label, s in servers %}<tr><td>{{ label }}</td><td>{{ s.side or "-" }}</td>
<td class="num">{{ s.ready }}</td><td>{{ s.gpus or "-" }}</td><td>{{ s.log or "-" }}</td></tr>
{% endfor %}</tbody></table>
{% endif %}
<h2>Fingerprints</h2>
{% if fingerprints %}
<table><thead><tr><th></th>{% for label, _ in fingerprints %}<th>{{ label }}</th>{% endfor %}</tr>
</thead><tbody>
{% for key in fingerprint_keys %}<tr><th>{{ key }}</th>
{% for _, f in fingerprints %}<td>{{ f.get(key, "-") }}</td>{% endfor %}</tr>
{% endfor %}</tbody></table>
{% else %}
<p>Not in this report.</p>
{% endif %}

<h2>Gate messages</h2>
{% for c, message in messages %}
<details><summary>{{ c.label }}: {{ c.outcome_text }}</summary>
<div class="msg">{{ message }}</div></details>
{% endfor %}

<h2>Tables</h2>
<pre>{{ tables }}</pre>
</body>
</html>
"""

_CSS = {"pass": "pass", "fail": "fail", "declared backfire": "declared", "undecided": "undecided"}


def _css(c: GateComparison) -> str:
    return _CSS.get(c.outcome.value, "nodecision")


def _value(value: Any) -> str:
    if value is None or value == {} or value == []:
        return "-"
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _budget(report: dict[str, Any]) -> str:
    """The session's time budget where the report records it, and the gates it left out."""
    seconds = next((report[k] for k in ("time_budget_s", "session_budget_s", "budget_s")
                    if report.get(k)), None)
    not_run = sum(1 for u in report.get("undecided", [])
                  if u.get("outcome") == "not run" or u.get("kind") == "not run")
    text = (f"{seconds / 60:g} min (--specgate-session-budget)" if seconds
            else "not recorded in report.json")
    return text + (f"; {not_run} gate(s) NOT RUN for want of time" if not_run else "")


def _start_order(order: dict[str, Any]) -> str:
    if not order.get("first"):
        return "not recorded (not an A/B, or an older report)"
    sides = "; ".join(f"{mode}: {side} side first" for mode, side in sorted(order["first"].items()))
    return f"{sides} (seed {order.get('seed')}; --specgate-start-seed to repeat it)"


def _facts(report: dict[str, Any]) -> list[tuple[str, str]]:
    rig = report.get("rig") or {}
    order = report.get("start_order") or {}
    family = report.get("family") or {}
    protocol = rig.get("protocol") or {}

    def listed(values: dict | None, sep: str, fmt=lambda k, v: f"{k}: {v}") -> str:
        return sep.join(fmt(k, v) for k, v in (values or {}).items()) or "-"

    facts = [("rig", f"{rig.get('name', '?')} ({rig.get('tier', '?')} tier)"),
             ("model", _value(rig.get("model"))),
             ("reference mode", _value(rig.get("reference_mode"))),
             ("modes", listed(rig.get("modes"), "; ", lambda m, c: f"{m}: {_value(c)}")),
             ("protocol", listed(protocol, ", ", lambda k, v: f"{k} {_value(v)}")),
             ("complete", "yes" if report.get("complete", True) else "no: a partial run"),
             ("written at", _value(report.get("written_at"))),
             ("attached", "yes" if report.get("attached") else "no"),
             ("start order", _start_order(order)),
             ("session budget", _budget(report)),
             ("outcome policy", listed(report.get("outcome_policy"), ", ")),
             ("gating", listed(report.get("gating"), ", "))]
    if family:
        facts.append(("false-alarm bound", f"{family.get('gating_decisions')} gating decision(s), "
                                           f"bound {_value(family.get('bound'))}"))
    return facts


def _servers(report: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for label, s in sorted((report.get("servers") or {}).items()):
        s = s if isinstance(s, dict) else {}
        ready = s.get("ready_after_s")
        out.append((label, {"side": s.get("side"),
                            "ready": f"{ready:.0f} s" if isinstance(ready, int | float) else "-",
                            "gpus": _value(s.get("gpus")) if s.get("gpus") else None,
                            "log": s.get("log")}))
    return out


def _counts(rows: list[GateComparison]) -> list[tuple[str, str, int]]:
    counted = Counter(c.outcome.value for c in rows)
    return [(name, _CSS.get(name, "nodecision"), n) for name, n in counted.items()]


def write_html(report: dict[str, Any], path: Path, figures: dict[str, Path] | None = None, *,
               headers: list[str], lines: list[str], tables: str) -> Path:
    """Write the page for ``report`` to ``path``, the PNG files in ``figures`` (name -> path)
    embedded; the verdict table's ``headers``, the summary's gate and notice ``lines`` and its
    other ``tables`` (text) come from specgate.report.terminal, which composes every rendering."""
    import jinja2

    rows = gate_comparisons(report)
    entries = {(e.get("mode"), e.get("prompt_class"), e.get("concurrency"), e.get("gate")): e
               for e in [*report.get("gates", []), *report.get("undecided", [])]}
    messages = [(c, (entries.get((c.mode, c.prompt_class, c.concurrency, c.gate)) or {}).get(
        "message", "")) for c in rows]
    embedded = [(name, caption,
                 base64.b64encode(Path(figures[name]).read_bytes()).decode("ascii"))
                for name, caption in FIGURES if figures and name in figures]
    rig = report.get("rig") or {}
    fingerprints = [(label, {k: _value(f.get(k)) for k in FINGERPRINT_KEYS})
                    for label, f in sorted((report.get("fingerprints") or {}).items())
                    if isinstance(f, dict)]
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True)
    page = without_control_chars(env.from_string(TEMPLATE).render(
        title=f"specgate: rig {rig.get('name', '?')}"
        + ("" if report.get("complete", True) else " (partial run)"),
        subtitle=f"{rig.get('tier', '?')} tier, model {rig.get('model', '?')}; "
        f"{len(rows)} gate(s)",
        counts=_counts(rows), headers=headers, rows=rows, css=_css, lines=lines,
        figures=embedded, facts=_facts(report), servers=_servers(report), fingerprints=fingerprints,
        fingerprint_keys=FINGERPRINT_KEYS, messages=messages,
        tables=tables or "No window measured."))
    path = Path(path)
    path.write_text(page, encoding="utf-8")
    return path
