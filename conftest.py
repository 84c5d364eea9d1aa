"""Root conftest: wiring only. It must stay import-light (no torch, no vLLM): every fast test
pays for whatever is imported here.

specgate's pytest plugin is normally loaded through its ``pytest11`` entry point (named
``specgate.plugin``). Where the package is only on ``PYTHONPATH`` (the GPU lab, a fresh checkout
without ``pip install``), the entry point does not exist; naming the module here loads it then,
and pytest skips it when the entry point already registered it under the same name.
"""

pytest_plugins = ["specgate.plugin"]


def pytest_ignore_collect(collection_path, config):
    """tests/ holds specgate's own tests, every one marked ``fast``, whose modules import the dev extra
    (hypothesis). A run whose ``-m`` expression can select no fast test (``pytest -m gpu``,
    ``pytest -m cpu``) does not collect them: a perf run needs only the extra it names."""
    tests = config.rootpath / "tests"
    if not config.option.markexpr or collection_path.parent != tests:
        return None  # pytest asks for each entry of tests/ (a testpaths entry itself is never ignored)
    try:
        from _pytest.mark.expression import Expression  # pytest's own -m grammar (it has no public API)

        selects_fast = Expression.compile(config.option.markexpr).evaluate(lambda name, **kwargs: name == "fast")
    except Exception:  # another pytest's internals, or an expression pytest itself reports: collect as usual
        return None
    return None if selects_fast else True
