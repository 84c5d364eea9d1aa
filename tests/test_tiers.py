"""Which tier collects a module of tests/: the root conftest.py reads each module's ``pytestmark`` line
(as text, without importing it) and leaves a module out of a run whose ``-m`` selects none of its marks.
A cpu-marked module in tests/ must reach .ci/run's cpu tier (``pytest -m cpu tests perf_tests lab/tests``);
it did not until 2026-12-06, when every module of tests/ was taken as fast."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest
from sources import parsed

pytestmark = pytest.mark.fast

TESTS = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("root_conftest", TESTS.parent / "conftest.py")
root_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(root_conftest)
module_marks, pytest_ignore_collect = root_conftest.module_marks, root_conftest.pytest_ignore_collect
TIERS = {"fast", "cpu", "gpu"}


class _Config:
    ArgsSource = pytest.Config.ArgsSource

    def __init__(self, markexpr: str, named: bool) -> None:
        self.rootpath = TESTS.parent
        self.option = type("Option", (), {"markexpr": markexpr})()
        self.args_source = self.ArgsSource.ARGS if named else self.ArgsSource.TESTPATHS


def _collected(name: str, markexpr: str, *, named: bool = True) -> bool:
    return pytest_ignore_collect(TESTS / name, _Config(markexpr, named)) is None


def test_each_tier_collects_its_modules_of_tests_and_no_other() -> None:
    assert module_marks(TESTS / "test_per_request_real.py") == {"cpu"}
    assert module_marks(TESTS / "test_registry.py") == {"fast", "timeout"}
    for markexpr, fast, cpu in (("cpu", False, True), ("gpu", False, False), ("fast", True, False),
                                ("not gpu", True, True), ("cpu or fast", True, True), ("", True, True)):
        assert _collected("test_registry.py", markexpr) is fast, markexpr
        assert _collected("test_secrets_in_a_real_run.py", markexpr) is cpu, markexpr
    assert not _collected("data", "cpu")  # a folder of tests/ is fast's
    # a perf run from the repository root (testpaths, tests/ not named) runs no self-test
    assert not _collected("test_secrets_in_a_real_run.py", "cpu", named=False)


def test_a_mark_list_over_several_lines_or_annotated_is_read(tmp_path: Path) -> None:
    module = tmp_path / "test_x.py"
    module.write_text("import pytest\n\npytestmark = [\n    pytest.mark.cpu,\n    pytest.mark.timeout(60),\n]\n")
    assert module_marks(module) == {"cpu", "timeout"}
    module.write_text("import pytest\n\npytestmark: list = [pytest.mark.gpu]\n")
    assert module_marks(module) == {"gpu"}


def _marks(node: ast.expr) -> set[str]:
    """The ``pytest.mark.NAME`` marks an expression names (``pytest.mark.cpu``, ``pytest.mark.timeout(60)``)."""
    return {n.attr for n in ast.walk(node)
            if isinstance(n, ast.Attribute) and ast.unparse(n.value) == "pytest.mark"}


def _module_level_marks(tree: ast.Module) -> set[str]:
    """The marks of the module's ``pytestmark`` assignment, from its syntax tree."""
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in targets):
            return _marks(node.value)
    return set()


def _tiers_marked_on_tests(tree: ast.Module) -> set[str]:
    """Tiers named by a decorator (``@pytest.mark.cpu``) on a test function or class of the module."""
    return {mark for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            for d in node.decorator_list for mark in _marks(d) & TIERS}


def test_every_module_of_tests_declares_its_tier_at_the_top() -> None:
    """A tier set on one test only would be left out with its module's: each module names its tier in
    its ``pytestmark`` assignment, and exactly one; the hook's reading of it as text agrees with Python's."""
    for path in sorted(TESTS.glob("test_*.py")):
        tree = parsed(path)
        assert module_marks(path) == _module_level_marks(tree), path.name
        declared = module_marks(path) & TIERS
        assert len(declared) == 1, f"{path.name}: pytestmark names {sorted(declared) or 'no tier'}"
        assert _tiers_marked_on_tests(tree) <= declared, path.name
