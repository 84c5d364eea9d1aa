"""Root conftest: wiring only. It must stay import-light (no torch, no vLLM): every fast test
pays for whatever is imported here.

specgate's pytest plugin is normally loaded through its ``pytest11`` entry point (named
``specgate.plugin``). Where the package is only on ``PYTHONPATH`` (the GPU lab, a fresh checkout
without ``pip install``), the entry point does not exist; naming the module here loads it then,
and pytest skips it when the entry point already registered it under the same name.
"""

import re

pytest_plugins = ["specgate.plugin"]

# ``pytestmark = pytest.mark.x``, ``pytestmark = [pytest.mark.x, ...]`` over several lines, or annotated
_MODULE_MARKS = re.compile(r"^pytestmark\s*(?::[^=\n]*)?=\s*(\[[^\]]*\]|.+)$", re.MULTILINE)


def module_marks(path) -> set[str]:
    """The marks a test module declares for all its tests (its ``pytestmark`` line), read as text:
    importing it would import what it needs. tests/ modules declare ``fast``, or a tier (``cpu``) where
    they need a real server (tests/test_tiers.py holds this reading to the modules' syntax trees)."""
    line = _MODULE_MARKS.search(path.read_text(encoding="utf-8", errors="replace"))
    return set(re.findall(r"pytest\.mark\.(\w+)", line.group(1))) if line else set()


def pytest_ignore_collect(collection_path, config):
    """tests/ holds specgate's own tests, most marked ``fast``, whose modules import the dev extra
    (hypothesis). A run whose ``-m`` expression selects none of a module's declared marks (``pytest -m
    gpu`` for the fast modules) does not collect it: a perf run needs only the extra it names. The few
    modules that declare ``cpu`` (a real vLLM: per-request acceptance, the HTML report in a browser,
    secrets in a real run) run where tests/ is named (``pytest -m cpu tests perf_tests lab/tests``,
    .ci/run's cpu tier), not in a perf run from the repository root (``pytest -m cpu``, testpaths)."""
    tests = config.rootpath / "tests"
    if not config.option.markexpr or collection_path.parent != tests:
        return None  # pytest asks for each entry of tests/ (a testpaths entry itself is never ignored)
    try:
        from _pytest.mark.expression import Expression  # pytest's own -m grammar (it has no public API)

        named = getattr(config, "args_source", None) == config.ArgsSource.ARGS
        marks = (module_marks(collection_path) if named and collection_path.suffix == ".py" else set())
        selected = Expression.compile(config.option.markexpr).evaluate(
            lambda name, **kwargs: name in (marks or {"fast"}))
    except Exception:  # another pytest's internals, or an expression pytest itself reports: collect as usual
        return None
    return None if selected else True
