"""Issue 38: the plugin loads into every pytest run of its environment, so it must load light (as
pytest-benchmark's does); and the package has no import circle."""

import ast
import functools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

PACKAGE = Path(__file__).resolve().parent.parent / "specgate"
LAB = PACKAGE.parent / "lab" / "specgate_lab"
HEAVY = ("numpy", "pydantic", "httpx", "aiohttp", "scipy", "matplotlib", "tabulate", "psutil", "prometheus_client",
         "ruptures", "jinja2")


def _heavy_loaded(code: str, cwd: Path) -> list[str]:
    probe = f"import json, sys\n{code}\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    out = subprocess.run([sys.executable, "-c", probe], cwd=cwd, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


# The gatekeeper runs the gates (numpy, scipy, pydantic) and loads with a perf test's first gate: the
# gatekeeper fixture's lazy import (specgate.plugin.fixtures) is the one place the plugin defers one.
GATES_MODULE = "gatekeeper"


def test_plugin_and_its_modules_load_light(tmp_path):
    # every module of specgate.plugin: pytest_plugins registers some at load, the hooks import the rest
    modules = sorted(p.stem for p in (PACKAGE / "plugin").glob("*.py") if p.stem not in ("__init__", GATES_MODULE))
    code = "import specgate.plugin\n" + "".join(f"import specgate.plugin.{m}\n" for m in modules)
    assert _heavy_loaded(code, tmp_path) == []
    code += f"assert 'specgate.plugin.{GATES_MODULE}' not in sys.modules\n"
    assert _heavy_loaded(code, tmp_path) == []


def test_a_pytest_run_without_perf_tests_loads_light(tmp_path):
    """Another project's run (no rig, no perf test): configure, collect, run and finish load nothing
    heavy either; the perf path imports its modules when a perf test needs them."""
    (tmp_path / "test_other.py").write_text(textwrap.dedent(f"""
        import json, sys

        def test_other():
            loaded = [m for m in {HEAVY!r} if m in sys.modules]
            open("loaded.json", "w").write(json.dumps(loaded))
    """))
    code = ("import os, pytest\nos.environ['PYTEST_DISABLE_PLUGIN_AUTOLOAD'] = '1'\n"
            "assert pytest.main(['-q', '-p', 'specgate.plugin', '-p', 'no:cacheprovider', 'test_other.py']) == 0")
    after_run = _heavy_loaded(code, tmp_path)
    assert json.loads((tmp_path / "loaded.json").read_text()) == [] and after_run == []


# -- the import graph ------------------------------------------------------------------------
def _module_name(path: Path) -> str:
    root = LAB.parent if path.is_relative_to(LAB) else PACKAGE.parent
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _edges(tree: ast.Module, modules: set[str]) -> tuple[set[str], set[str]]:
    """specgate modules imported when the module loads, and those imported inside its functions;
    an import under ``if TYPE_CHECKING:`` never runs and counts as neither."""
    at_load: set[str] = set()
    deferred: set[str] = set()

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for child in node.orelse:
                visit(child, in_function)
            return
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        (deferred if in_function else at_load).update(t for t in targets if t in modules)
        inner = in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(tree, False)
    return at_load, deferred


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each import circle once, as the path that closes it."""
    found, done = [], set()

    def walk(node: str, path: list[str]) -> None:
        for nxt in sorted(graph[node]):
            if nxt in path:
                cycle = path[path.index(nxt):]
                if frozenset(cycle) not in done:
                    done.add(frozenset(cycle))
                    found.append([*cycle, nxt])
            elif nxt not in visited:
                walk(nxt, [*path, nxt])
        visited.add(node)

    visited: set[str] = set()
    for start in sorted(graph):
        if start not in visited:
            walk(start, [start])
    return found


@functools.cache
def _trees() -> dict[str, tuple[Path, ast.Module]]:
    """Every module of the product and the lab, parsed once for this file's tests."""
    return {_module_name(p): (p, ast.parse(p.read_text(), str(p)))
            for p in (*PACKAGE.rglob("*.py"), *LAB.rglob("*.py"))}


@functools.cache
def _import_graphs() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    # the product and the lab together: a circle through both would be one too
    trees = _trees()
    at_load, anywhere = {}, {}
    for name, (_, tree) in trees.items():
        load, deferred = _edges(tree, set(trees))
        at_load[name], anywhere[name] = load - {name}, (load | deferred) - {name}
    return at_load, anywhere


def test_no_import_circle_at_load():
    at_load, _ = _import_graphs()
    assert _cycles(at_load) == []


def test_no_import_circle_even_through_function_level_imports():
    _, anywhere = _import_graphs()
    assert _cycles(anywhere) == []


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def _imported_names(tree: ast.Module) -> list[tuple[int, str]]:
    """Every module an import statement names, at any level (module, function, class, TYPE_CHECKING)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in (
                "import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
            found.append((node.lineno, str(node.args[0].value)))
    return found


def test_the_product_imports_nothing_from_the_lab():
    # specgate is the product; the lab (lab/, distribution specgate-lab) plugs in through entry points
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}: {name}"
             for module, (path, tree) in sorted(_trees().items()) if module.split(".")[0] == "specgate"
             for line, name in _imported_names(tree) if name.split(".")[0] == "specgate_lab"]
    assert found == []


def test_the_lab_import_scan_sees_function_level_and_dynamic_imports():
    tree = ast.parse(textwrap.dedent("""
        import os

        def f():
            from specgate_lab.record import record_server
            import specgate_lab.eagle3 as e

        importlib.import_module("specgate_lab.inject")
    """))
    assert sorted(n for _, n in _imported_names(tree) if n.startswith("specgate_lab")) == [
        "specgate_lab.eagle3", "specgate_lab.inject", "specgate_lab.record"]
