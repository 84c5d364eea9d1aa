"""Issue 61's shape of the code: no function in specgate/ over 80 lines, and a session object that
keeps the run's state only (at most 250 lines; pytest-benchmark's BenchmarkSession is 241)."""

from __future__ import annotations

import ast
import functools
import tomllib
from pathlib import Path

import pytest
from sources import parsed

pytestmark = pytest.mark.fast

PACKAGE = Path(__file__).resolve().parent.parent / "specgate"
MAX_FUNCTION_LINES = 80
MAX_SESSION_LINES = 250
# Over the bound while another part of issue 61 reshapes it; each entry names that part, and the
# entry goes once the function is back within the bound (test_the_exceptions_are_still_needed).
BEING_SPLIT: dict[str, str] = {}


@functools.cache
def _trees() -> dict[str, ast.Module]:
    return {str(p.relative_to(PACKAGE)): parsed(p) for p in sorted(PACKAGE.rglob("*.py"))}


def _lines(node: ast.AST) -> int:
    """From the ``def`` (or ``class``) line to the last line of the body, docstring and comments included."""
    return node.end_lineno - node.lineno + 1  # type: ignore[attr-defined]


def function_lengths(trees: dict[str, ast.Module]) -> dict[str, int]:
    """Every function and method, nested ones too: "path::name" -> its lines (the longest of a name)."""
    found: dict[str, int] = {}
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                key = f"{path}::{node.name}"
                found[key] = max(found.get(key, 0), _lines(node))
    return found


def test_no_function_in_specgate_is_over_80_lines():
    long = {key: n for key, n in function_lengths(_trees()).items()
            if n > MAX_FUNCTION_LINES and key not in BEING_SPLIT}
    assert long == {}, f"split these (at most {MAX_FUNCTION_LINES} lines each): {long}"


def test_the_exceptions_are_still_needed():
    lengths = function_lengths(_trees())
    done = [key for key in BEING_SPLIT if lengths.get(key, 0) <= MAX_FUNCTION_LINES]
    assert done == [], f"within the bound now: drop them from BEING_SPLIT: {done}"


def test_the_session_keeps_the_runs_state_only():
    (session,) = [node for node in _trees()["plugin/session.py"].body
                  if isinstance(node, ast.ClassDef) and node.name == "SpecgateSession"]
    assert _lines(session) <= MAX_SESSION_LINES, (
        f"SpecgateSession is {_lines(session)} lines (at most {MAX_SESSION_LINES}): what is not the run's state "
        "goes to its layer (report.run_report, store.pending, plugin.inputs, plugin.workers, decide.settings)")


def test_the_length_rule_counts_methods_nested_functions_and_docstrings():
    tree = ast.parse("class C:\n    def m(self):\n        '''doc\n        more'''\n        def inner():\n"
                     "            return 1\n        return inner\n")
    assert function_lengths({"x.py": tree}) == {"x.py::m": 6, "x.py::inner": 2}


WIDE = 100  # specgate/ruff.toml's line-length: ruff's E501 holds specgate/ to it (issue 61)


def test_ruff_holds_the_package_to_100_characters_a_line():
    config = tomllib.loads((PACKAGE / "ruff.toml").read_text())
    assert config["line-length"] == WIDE and config["extend"] == "../pyproject.toml"
    lines = [line for p in sorted(PACKAGE.rglob("*.py")) for line in p.read_text().splitlines()]
    assert [line for line in lines if len(line) > WIDE and "noqa: E501" not in line] == []
