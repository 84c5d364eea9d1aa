"""Issue 38: the plugin loads into every pytest run of its environment, so it must load light (as
pytest-benchmark's does); and the package has no import circle. Issue 53: the package's own modules
are imported at module level, the light path's heavy ones through specgate.lazy (the one place the
package defers them), and at most a handful inside functions."""

import ast
import functools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from sources import parsed

from specgate.lazy import Deferred

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
# gatekeeper fixture reaches it through specgate.lazy, as the light path reaches every heavy module.
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


def _lazy_names(tree: ast.Module) -> dict[str, str]:
    """specgate/lazy.py's registry: each module-level ``name = Deferred("specgate.x")``, name -> module."""
    return {node.targets[0].id: node.value.args[0].value for node in tree.body
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name) and node.value.func.id == "Deferred"}


def _edges(tree: ast.Module, modules: set[str], lazy: dict[str, str] | None = None) -> tuple[set[str], set[str]]:
    """specgate modules imported when the module loads, and those imported inside its functions;
    an import under ``if TYPE_CHECKING:`` never runs and counts as neither. ``from specgate.lazy
    import x`` (``lazy``: specgate.lazy's names) loads specgate.lazy and defers x's module: a deferred
    edge of the importer, as a function-level import would be (the registry imports nothing itself,
    so an edge from it to every module it names would close circles no import ever makes)."""
    at_load: set[str] = set()
    deferred: set[str] = set()
    lazy = lazy or {}

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for child in node.orelse:
                visit(child, in_function)
            return
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module == "specgate.lazy":
            deferred.update(lazy[a.name] for a in node.names if a.name in lazy)
            targets = [node.module]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
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
    return {_module_name(p): (p, parsed(p))
            for p in (*PACKAGE.rglob("*.py"), *LAB.rglob("*.py"))}


@functools.cache
def _import_graphs() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    # the product and the lab together: a circle through both would be one too
    trees = _trees()
    lazy = _lazy_names(trees["specgate.lazy"][1])
    at_load, anywhere = {}, {}
    for name, (_, tree) in trees.items():
        load, deferred = _edges(tree, set(trees), lazy)
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


def test_a_circle_through_the_lazy_registry_is_a_circle():
    # specgate.x defers specgate.y through specgate.lazy; specgate.y imports specgate.x at load
    sources = {"specgate.lazy": 'y = Deferred("specgate.y")\n',
               "specgate.x": "from specgate.lazy import y\n\ndef f():\n    return y.g()\n",
               "specgate.y": "import specgate.x\n"}
    lazy = _lazy_names(ast.parse(sources["specgate.lazy"]))
    edges = {name: _edges(ast.parse(text), set(sources), lazy) for name, text in sources.items()}
    assert lazy == {"y": "specgate.y"} and edges["specgate.x"] == ({"specgate.lazy"}, {"specgate.y"})
    at_load = {name: load for name, (load, _) in edges.items()}
    assert _cycles(at_load) == []
    assert _cycles({name: load | deferred for name, (load, deferred) in edges.items()}) == [
        ["specgate.x", "specgate.y", "specgate.x"]]


# -- specgate.lazy: the one place the package defers its own modules ------------------------
def test_the_lazy_registry_names_exactly_the_modules_it_defers():
    path, tree = _trees()["specgate.lazy"]
    names = _lazy_names(tree)
    assert names, "specgate/lazy.py defers nothing"
    # every module-level assignment of the registry is a Deferred, named as its module
    assigned = [t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
                if isinstance(t, ast.Name) and not t.id.startswith("__")]
    assert sorted(assigned) == sorted(names)
    wrong = {name: module for name, module in names.items()
             if module.rsplit(".", 1)[-1] != name or module not in _trees() or not module.startswith("specgate.")}
    assert wrong == {}, f"{path}: each Deferred must name an existing specgate module as its variable"
    import specgate.lazy

    assert {n: getattr(specgate.lazy, n)._name for n in names} == names


def test_the_lazy_registry_is_imported_by_name_only():
    """``from specgate.lazy import x`` everywhere, so the import graph above sees each deferred edge
    (``import specgate.lazy`` and ``lazy.x`` would hide it), and only names the registry has."""
    names = set(_lazy_names(_trees()["specgate.lazy"][1]))
    found = []
    for module, (path, tree) in sorted(_trees().items()):
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
            if isinstance(node, ast.Import) and any(a.name == "specgate.lazy" for a in node.names):
                found.append(f"{where}: import specgate.lazy")
            elif isinstance(node, ast.ImportFrom) and node.module == "specgate" \
                    and any(a.name == "lazy" for a in node.names):
                found.append(f"{where}: from specgate import lazy")
            elif isinstance(node, ast.ImportFrom) and node.module == "specgate.lazy":
                found += [f"{where}: {a.name} is not in specgate.lazy" for a in node.names
                          if a.name not in names and not (module.startswith("tests") or a.name == "Deferred")]
    assert found == []


def test_a_deferred_module_loads_at_its_first_attribute(tmp_path, monkeypatch):
    name = "specgate_deferred_probe"
    (tmp_path / f"{name}.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    probe = Deferred(name)
    try:
        assert name not in sys.modules
        assert repr(probe) == f"<deferred module {name}>"
        assert name not in sys.modules  # naming it imports nothing
        assert probe.VALUE == 42
        assert name in sys.modules
        sys.modules[name].VALUE = 43  # resolved on the module at each access: a monkeypatch holds
        assert probe.VALUE == 43
        with pytest.raises(AttributeError):
            probe.missing  # noqa: B018
        sys.modules.pop(name)
        for probed in ("__wrapped__", "_mock_name", "_name_of_it"):  # pytest's fixture scan, copy, pickle
            assert not hasattr(probe, probed)
        assert name not in sys.modules
        with pytest.raises(AttributeError, match="read-only"):
            probe.VALUE = 1
    finally:
        sys.modules.pop(name, None)


# The bound: the light path reaches its heavy modules through specgate.lazy; what is left
# inside functions is the exception, and each is listed here when the bound is passed.
MAX_FUNCTION_LEVEL_IMPORTS = 15


def _function_level_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """Imports of specgate modules inside a function (not under ``if TYPE_CHECKING:``)."""
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            return
        if in_function and isinstance(node, ast.Import | ast.ImportFrom):
            if isinstance(node, ast.ImportFrom):
                names = ["specgate" if node.level else node.module or ""]
            else:
                names = [a.name for a in node.names]
            if any(n == "specgate" or n.startswith("specgate.") for n in names):
                found.append((node.lineno, ast.unparse(node)))
        for child in ast.iter_child_nodes(node):
            visit(child, in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef))

    visit(tree, False)
    return found


def test_function_level_imports_of_the_package_are_few():
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}: {text}"
             for module, (path, tree) in sorted(_trees().items()) if module.split(".")[0] == "specgate"
             for line, text in _function_level_imports(tree)]
    assert len(found) <= MAX_FUNCTION_LEVEL_IMPORTS, (
        f"{len(found)} function-level imports of specgate modules (at most {MAX_FUNCTION_LEVEL_IMPORTS}): import "
        "at module level, through specgate.lazy where the light path needs a heavy module:\n" + "\n".join(found))


def test_the_function_level_import_count_sees_what_it_should():
    tree = ast.parse(textwrap.dedent("""
        from typing import TYPE_CHECKING
        from specgate.errors import SpecgateError

        def f():
            import json
            from specgate.config.rig import load_rig
            from . import durations
            if TYPE_CHECKING:
                from specgate.measure.protocol import Measurer

        class C:
            def m(self):
                import specgate.report.terminal
    """))
    assert [text for _, text in _function_level_imports(tree)] == [
        "from specgate.config.rig import load_rig", "from . import durations", "import specgate.report.terminal"]


def _imported_names(tree: ast.Module) -> list[tuple[int, str]]:
    """Every module an import statement names, at any level (module, function, class, TYPE_CHECKING)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in (
                "import_module", "__import__", "Deferred") and node.args and isinstance(node.args[0], ast.Constant):
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
