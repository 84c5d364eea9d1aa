"""The loaders of the files a user edits or hands in, fuzzed (issue 63): a rig, the prompt and mode
libraries, baselines.json and a saved report.json, each a real file of the project damaged by
structured mutations (a key dropped or added, a value of another type, a non-finite number, an odd
string, a list emptied or doubled) and then, sometimes, as bytes (cut short, bytes spliced in). Every
input ends in success or a SpecgateError, the exit-4 class whose message names the file; never
another exception, which would be a traceback and exit 1 (a failed gate, as CI reads it). A saved
report that loads is also rendered (the terminal summary and summary.md) and advised from, as
``--specgate-report-only`` and ``specgate advise`` do with it; a library that loads is read by a rig.

Examples per loader: SPECGATE_FUZZ_EXAMPLES, 50 by default (the fast tier, a fraction of a second a loader);
``.ci/run``'s fast stage runs these tests alone with 2,000. Derandomized, so a CI run is repeatable; a
failure names the shrunk input's mutations.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import math
import os
import shutil
import tomllib
from pathlib import Path
from typing import Any

import pytest
from fixture_copy import copy_fixtures
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specgate.advise.advice import advise_report
from specgate.config.rig import load_mode_library, load_prompt_classes, load_rig
from specgate.decide.settings import window_settings
from specgate.errors import SpecgateError
from specgate.report.terminal import render_markdown, render_text
from specgate.store.baselines import load_baselines
from specgate.store.saved_report import missing_parts, read_saved_report

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
EXAMPLES = int(os.environ.get("SPECGATE_FUZZ_EXAMPLES", "50"))
FUZZ = settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


# -- the valid files mutated ----------------------------------------------------------------------
def _toml(name: str) -> dict[str, Any]:
    return tomllib.loads((FIXTURES / name).read_text())


def _json(path: Path) -> Any:
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def _short_prompts() -> dict[str, Any]:
    """prompts.toml with each prompt's text cut to its first 80 characters (parsed faster, still valid)."""
    library = _toml("prompts.toml")
    return {**library, "classes": {name: {**c, "prompts": [{**p, "text": p["text"][:80]} for p in c["prompts"]]}
                                   for name, c in library["classes"].items()}}


SHORT_PROMPTS = _short_prompts()
RIGS = ("cpu-smollm2", "cpu-smollm2-start-pairs", "h200-wide15b-alternate", "h200x2-smollm2-pp2",
        "kimi-k25-int4-8x-rtx6000")


def _trimmed_baselines(schema: int) -> dict[str, Any]:
    """baselines.json cut to two windows of its first rig (a speculative one holds a ratio and acceptance),
    three samples each; schema 1 (one entry per window, its starts as bare lists) as older files hold it."""
    full = _json(ROOT / "baselines.json")
    rig_name, modes = next(iter(full["rigs"].items()))
    kept: dict[str, Any] = {}
    for mode in list(modes)[:2]:
        prompt_class, levels = next(iter(modes[mode].items()))
        level, found = next(iter(levels.items()))
        entry = {**found[-1], "decode_tokens_per_s": found[-1]["decode_tokens_per_s"][:3], "n": 3}
        if entry.get("sample_keys"):
            entry["sample_keys"] = entry["sample_keys"][:3]
        if schema == 1:
            starts = entry.pop("starts")
            entry.pop("superseded", None)
            entry["level_history"] = [s["level"] for s in starts]
            entry["ratio_history"] = [s["ratio"] for s in starts if s.get("ratio") is not None]
        kept[mode] = {prompt_class: {level: [entry] if schema == 2 else entry}}
    return {**full, "schema_version": schema, "rigs": {rig_name: kept}}


def _trimmed_report(path: str, windows: int = 2, records: int = 3) -> dict[str, Any]:
    """A recorded report cut to its first windows (their records, partners and telemetry too) and their gates."""
    report = _json(ROOT / path)

    def short(record: dict[str, Any]) -> dict[str, Any]:
        return {k: v[:3] if k in ("chunk_times", "text") else v for k, v in record.items()}

    def trim(m: dict[str, Any]) -> dict[str, Any]:
        m = {**m, "records": [short(r) for r in m["records"][:records]]}
        if isinstance(m.get("partner"), dict):
            m["partner"] = trim(m["partner"])
        telemetry = m.get("telemetry") or {}
        if telemetry.get("window"):  # the series the tables read, and the engine cores' CPU seconds
            window = telemetry["window"]
            keep = [k for k in window if not k.startswith("proc.") or ("EngineCore" in k and k.endswith(".cpu_s"))]
            m["telemetry"] = {**telemetry, "window": {k: window[k] for k in keep}}
        if telemetry.get("requests"):
            m["telemetry"]["requests"] = {request: {k: v for k, v in values.items() if k.endswith(".cpu_s")}
                                          for request, values in list(telemetry["requests"].items())[:2]}
        return m

    kept = [trim(m) for m in report["measurements"][:windows]]
    keys = {(m["mode"], m["prompt_class"], m["concurrency"]) for m in kept}

    def ours(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [e for e in entries if (e["mode"], e["prompt_class"], e["concurrency"]) in keys]

    trimmed = {**report, "measurements": kept, "gates": ours(report["gates"]),
               "undecided": ours(report.get("undecided", []))}
    rig = load_rig("cpu-smollm2", FIXTURES)
    trimmed["settings"] = [window_settings(rig, mode, "coding").to_dict() for mode in ("no_spec", "ngram")]
    return trimmed


REPORTS = (
    # trimmed evidence of an older specgate: a duet ("design", "side"), records with a decode rate only
    _trimmed_report("docs/evidence/eagle3-runs/cpu-2026-11-30/trained/report.json.gz"),
    # today's: an A/B with telemetry, TTFT and undecided gates, the family, the start order, fingerprints
    _trimmed_report("tests/data/calibration/cpu-2026-12-04-acceptance/k3-48-auto-report.json.gz"),
)


# -- mutations ------------------------------------------------------------------------------------
ODD_STRINGS = ("", " ", "\x00", "\x1b[2J", "\u202e", "é", "\U0001f600", "${nosuch}", "$", "../..", "*", "NaN",
               "inf", "1e999", "true", "null", "-1", "0", "3", "a" * 300, "no_spec", "ngram", "coding", "nosuch")
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(min_value=-2**70, max_value=2**70),
                    st.floats(), st.sampled_from([math.inf, -math.inf, math.nan, 0.0, -0.0, 1e308, 5e-324]),
                    st.sampled_from(ODD_STRINGS), st.text(max_size=12))
values = st.one_of(scalars, st.lists(scalars, max_size=3), st.dictionaries(st.sampled_from(ODD_STRINGS), scalars,
                                                                            max_size=3))


def _strings(node: Any) -> set[str]:
    """The document's keys and short string values: names that lead a mutation somewhere (a mode, a class)."""
    if isinstance(node, dict):
        return set(node).union(*(_strings(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_strings(v) for v in node))
    return {node} if isinstance(node, str) and len(node) <= 40 else set()


DROP = object()


def _changed(node: Any, path: tuple, change) -> Any:
    """``node`` with the value at ``path`` replaced by ``change(value)`` (removed where it returns DROP): the
    containers along the path are copied, the rest shared, so the bases are never changed."""
    if not path:
        return change(node)
    key, rest = path[0], path[1:]
    copy = dict(node) if isinstance(node, dict) else list(node)
    value = _changed(node[key], rest, change)
    if value is DROP:
        del copy[key]
    else:
        copy[key] = value
    return copy


def _one_of(draw: st.DrawFn, choices: Any) -> Any:
    """One of ``choices``, evenly: Hypothesis draws small integers (and so sampled_from's first entries) more
    often, and the first key of a file (``specgate_report``) would get a third of the mutations."""
    return choices[draw(st.integers(0, 2**16 - 1)) % len(choices)]


def _pick(draw: st.DrawFn, doc: Any) -> tuple[tuple, Any]:
    """A place in ``doc``, reached by descending from the root (at each table or list: stop there, or go
    into one of its entries), so the small tables get as many mutations as the long lists of records."""
    path: tuple = ()
    node = doc
    while isinstance(node, dict | list) and node and not (path and _one_of(draw, (True, False, False, False))):
        key = _one_of(draw, list(node) if isinstance(node, dict) else range(len(node)))
        path, node = (*path, key), node[key]
    return path, node


def mutated(bases: tuple[Any, ...], *, toml: bool = False) -> st.SearchStrategy[tuple[Any, list[str]]]:
    """One of ``bases`` with 1-4 structured mutations, and what was done (for the failure message)."""
    names = st.sampled_from(sorted(set().union(*(_strings(b) for b in bases))))
    new_value = st.one_of(values, names, st.dates()) if toml else st.one_of(values, names)

    @st.composite
    def strategy(draw: st.DrawFn) -> tuple[Any, list[str]]:
        doc = draw(st.sampled_from(bases))
        done: list[str] = []
        for _ in range(_one_of(draw, (1, 1, 1, 2, 3, 4))):
            path, target = _pick(draw, doc)
            op = _one_of(draw, ("drop", "set", "set", "retype", "wrap", "empty", "double", "add"))
            if op in ("empty", "double", "add") and not (isinstance(target, dict | list) and target):
                op = "set"
            if op in ("drop", "set", "retype", "wrap") and not path:
                op = "add"
            if op == "drop":
                change = lambda _: DROP  # noqa: E731
            elif op == "set":
                value = draw(new_value)
                change = lambda _, value=value: value  # noqa: E731
            elif op == "retype":  # the classic: a number given as a string, a string as a number or a list
                value = str(target) if not isinstance(target, str) else draw(
                    st.sampled_from([1, 1.5, True, [target], {"x": target}]))
                change = lambda _, value=value: value  # noqa: E731
            elif op == "wrap":
                value = [target] if draw(st.booleans()) else {"x": target}
                change = lambda _, value=value: value  # noqa: E731
            elif op == "empty":
                change = lambda t: type(t)()  # noqa: E731
            elif op == "double" and isinstance(target, list):
                i = _one_of(draw, range(len(target)))
                change = lambda t, i=i: [*t, t[i]]  # noqa: E731
            elif op == "double":
                key = _one_of(draw, list(target))
                change = lambda t, key=key: {**t, f"{key}_2": t[key]}  # noqa: E731
            else:  # add a key: unknown, or a name the file uses elsewhere
                if not isinstance(target, dict):
                    continue
                key, value = draw(st.one_of(st.sampled_from(ODD_STRINGS), names)), draw(new_value)
                change = lambda t, key=key, value=value: {**t, key: value}  # noqa: E731
            doc = _changed(doc, path, change)
            done.append(f"{op} {'.'.join(map(str, path)) or '(root)'}")
        return doc, done

    return strategy()


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isfinite(value):
            return repr(value)
        return "nan" if math.isnan(value) else "inf" if value > 0 else "-inf"
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, list):  # TOML has no null: a None is left out
        return "[" + ", ".join(_toml_value(v) for v in value if v is not None) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items() if v is not None) + "}"
    return json.dumps(value, ensure_ascii=False)  # a TOML basic string: JSON's escapes are TOML's


def _toml_key(key: str) -> str:
    return json.dumps(key, ensure_ascii=False)


def to_toml(doc: Any) -> bytes:
    """The document as TOML, every table inline (tomllib reads any TOML; a lone surrogate stays as bytes
    that are not UTF-8)."""
    if not isinstance(doc, dict):
        return f"value = {_toml_value(doc)}\n".encode("utf-8", "surrogatepass")
    lines = [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in doc.items() if v is not None]
    return ("\n".join(lines) + "\n").encode("utf-8", "surrogatepass")


def to_json(doc: Any) -> bytes:
    return json.dumps(doc, ensure_ascii=False).encode("utf-8", "surrogatepass")  # NaN and Infinity as Python writes


@st.composite
def damaged(draw: st.DrawFn, content: bytes) -> tuple[bytes, str]:
    """``content`` as it is (mostly), cut short, or with a few bytes spliced in."""
    how = _one_of(draw, ("as is",) * 6 + ("cut", "splice"))
    if how == "cut":
        at = draw(st.integers(0, len(content)))
        return content[:at], f"cut at byte {at}"
    if how == "splice":
        at = draw(st.integers(0, len(content)))
        junk = draw(st.one_of(st.binary(min_size=1, max_size=4), st.sampled_from([b"\xff", b"\x00", b"]", b"}", b'"'])))
        return content[:at] + junk + content[at:], f"{junk!r} spliced in at byte {at}"
    return content, "as is"


def _load(load, path: Path, done: list[str], how: str, *, named: Path | None = None) -> None:
    """The loader's verdict on ``path``: success, or a SpecgateError naming it (or a file under ``named``,
    where a rig read with a damaged library is refused for what the library lacks); anything else fails."""
    try:
        load()
    except SpecgateError as exc:
        assert str(named or path) in str(exc), f"{exc} does not name {named or path} ({done}, {how})"
    except Exception as exc:  # the finding: say how the input was made
        raise AssertionError(f"{type(exc).__name__} from {path} after {done}, {how}: {exc}") from exc


# -- the loaders ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fixtures_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_fixtures(tmp_path_factory.mktemp("fuzz") / "fixtures")


@FUZZ
@given(case=mutated(tuple(_toml(f"rigs/{name}.toml") for name in RIGS), toml=True), data=st.data())
def test_a_damaged_rig_is_loaded_or_refused_naming_the_file(fixtures_copy: Path, case, data) -> None:
    doc, done = case
    content, how = data.draw(damaged(to_toml(doc)))
    rig = fixtures_copy / "rigs" / "fuzzed.toml"
    rig.write_bytes(content)
    _load(lambda: load_rig("fuzzed", fixtures_copy, model_cache=fixtures_copy / "cache"), rig, done, how)


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fixtures folder holding the short prompt library, the mode library and cpu-smollm2: a test replaces one
    library file with its fuzzed one and loads the rig, which reads what the library holds."""
    folder = tmp_path_factory.mktemp("library")
    (folder / "prompts.toml").write_bytes(to_toml(SHORT_PROMPTS))
    (folder / "modes.toml").write_bytes((FIXTURES / "modes.toml").read_bytes())
    (folder / "rigs").mkdir()
    (folder / "rigs" / "cpu-smollm2.toml").write_bytes((FIXTURES / "rigs" / "cpu-smollm2.toml").read_bytes())
    return folder


def _fuzzed_library(library: Path, name: str, content: bytes, load_file, done: list[str], how: str) -> None:
    folder = library.parent / f"{library.name}-{name}"
    if not folder.exists():
        shutil.copytree(library, folder)
    (folder / name).write_bytes(content)

    def load() -> None:
        load_file(folder / name)
        load_rig("cpu-smollm2", folder, model_cache=folder / "cache")

    _load(load, folder / name, done, how, named=folder)


@FUZZ
@given(case=mutated((SHORT_PROMPTS,), toml=True), data=st.data())
def test_a_damaged_prompt_library_is_loaded_or_refused_naming_the_file(library: Path, case, data) -> None:
    doc, done = case
    content, how = data.draw(damaged(to_toml(doc)))
    _fuzzed_library(library, "prompts.toml", content, load_prompt_classes, done, how)


@FUZZ
@given(case=mutated((_toml("modes.toml"),), toml=True), data=st.data())
def test_a_damaged_mode_library_is_loaded_or_refused_naming_the_file(library: Path, case, data) -> None:
    doc, done = case
    content, how = data.draw(damaged(to_toml(doc)))
    _fuzzed_library(library, "modes.toml", content, load_mode_library, done, how)


@FUZZ
@given(case=mutated((_trimmed_baselines(2), _trimmed_baselines(1))), data=st.data())
def test_a_damaged_baselines_file_is_loaded_or_refused_naming_the_file(tmp_path_factory, case, data) -> None:
    doc, done = case
    content, how = data.draw(damaged(to_json(doc)))
    path = tmp_path_factory.getbasetemp() / "fuzz-baselines.json"
    path.write_bytes(content)
    _load(lambda: load_baselines(path), path, done, how)


@FUZZ
@given(case=mutated(REPORTS), data=st.data(), compressed=st.booleans())
def test_a_damaged_report_is_rendered_or_refused_naming_the_file(tmp_path_factory, case, data, compressed) -> None:
    doc, done = case
    content, how = data.draw(damaged(to_json(doc)))
    path = tmp_path_factory.getbasetemp() / "fuzz-report.json.gz"
    path.write_bytes(gzip.compress(content, mtime=0) if compressed else content)

    def render() -> None:
        report = read_saved_report(path)
        render_text(report)
        render_markdown(report)
        missing_parts(report)
        advise_report(report, source=str(path))  # `specgate advise --report` reads it too

    _load(render, path, done, how)


def test_the_report_loader_knows_exactly_the_outcomes_the_gates_give() -> None:
    from specgate.decide.outcome import Outcome
    from specgate.store.readable_report import OUTCOMES

    assert sorted(OUTCOMES) == sorted(o.value for o in Outcome)
