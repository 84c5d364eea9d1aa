"""No function in specgate/ takes more than MAX_PARAMETERS parameters (issue 53): values that travel
together go as one small frozen value (stats.Observed, paired.Line, plan.Conditions, measure.Duet)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from sources import parsed

import specgate

pytestmark = pytest.mark.fast

MAX_PARAMETERS = 8
PACKAGE = Path(specgate.__file__).resolve().parent


def parameter_count(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Every positional, keyword-only, *args and **kwargs parameter; a method's self or cls not."""
    a = node.args
    positional = [*a.posonlyargs, *a.args]
    n = len(positional) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
    return n - 1 if positional and positional[0].arg in ("self", "cls") else n


def over_limit(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and parameter_count(node) > MAX_PARAMETERS:
                found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name}: {parameter_count(node)}")
    return found


def test_the_count_takes_every_kind_of_parameter_and_leaves_out_self():
    tree = ast.parse("def f(a, /, b, *c, d, **e): ...\nclass K:\n    def m(self, a, *, b): ...")
    f, m = (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef))
    assert (parameter_count(f), parameter_count(m)) == (5, 2)


def test_no_function_in_specgate_takes_more_than_eight_parameters():
    found = over_limit(PACKAGE)
    assert not found, (f"{len(found)} function(s) in {PACKAGE} take more than {MAX_PARAMETERS} parameters "
                       "(group values that travel together in a frozen dataclass): " + "; ".join(found))
