"""Settings for specgate's own tests (tests/ only).

pytest loads this file at start-up whenever ``tests`` is one of its paths (it is in ``testpaths``), so
a perf run from the repository root loads it too, in an environment that may hold only the ``[gpu]``
or ``[cpu]`` extra: it imports nothing beyond specgate's own dependencies at load. Hypothesis (the
``dev`` extra) is configured when it is installed, and the root conftest keeps a perf run from
collecting tests/ at all (``pytest -m gpu`` could select none of its tests).

Hypothesis runs under a profile, so the example count is chosen in one place:

- ``fast`` (the default, what every PR runs): 30 examples per property test. Part of keeping the
  fast tier under 20 s on 2 cores; a property test that held for 30 examples in every run so far
  is unlikely to break on example 31, and the example database replays any failure it finds.
- ``thorough``: 500 examples each, for a release or after touching the parsers and the statistics:
  ``SPECGATE_HYPOTHESIS=thorough tox -e fast`` (tox passes SPECGATE_* through).

Both drop Hypothesis's per-example deadline: on a shared 2-core machine a slow example is load,
not a finding. A test's own ``@settings`` sets only what differs from the profile (health checks).
"""

import os
from pathlib import Path

# pytester's runpytest_inprocess restores sys.modules after each in-process run, and a C extension
# first imported inside one cannot be imported again in this process ("cannot load module more than
# once per process"): numpy is imported here, before any such run, so no test depends on which
# worker ran an in-process run first (tests/test_cost.py failed so under -n 1). httpcore likewise:
# httpx imports it at its first client and keeps a map of its exception classes, so a first client
# inside an in-process run (a server the run starts) left later tests' clients raising raw httpcore
# errors the map no longer knew (tests/test_exit_codes.py's exit code 6, then tests/test_server.py).
import httpcore  # noqa: F401
import numpy  # noqa: F401
import pytest

try:
    from hypothesis import settings
except ImportError:  # no dev extra: a perf run's environment; tests/ is not collected there
    settings = None
if settings is not None:
    settings.register_profile("fast", max_examples=30, deadline=None)
    settings.register_profile("thorough", max_examples=500, deadline=None)
    settings.load_profile(os.environ.get("SPECGATE_HYPOTHESIS", "fast"))


# Python's cyclic garbage collector at a tenth of its default pace while specgate's own tests run: a
# worker's heap grows to hundreds of MB (matplotlib, scipy, pydantic, hypothesis, every product module),
# and at the default thresholds the fast tier's two workers spent 1.6 and 2.6 s in 20 and 23 full
# collections (2026-12-05). Garbage is still collected, only less often. A perf run (it collects nothing
# under tests/) gets the default pace back before its first test: its client's timing is not touched.
_gc_threshold_before: list[tuple[int, ...]] = []


def pytest_configure(config: pytest.Config) -> None:
    import gc

    _gc_threshold_before.append(gc.get_threshold())
    gc.set_threshold(_gc_threshold_before[-1][0] * 10, *_gc_threshold_before[-1][1:])


def pytest_collection_finish(session: pytest.Session) -> None:
    tests = Path(__file__).resolve().parent
    if _gc_threshold_before and not any(item.path.is_relative_to(tests) for item in session.items):
        _default_gc_pace()


def pytest_unconfigure(config: pytest.Config) -> None:
    import gc

    ran_here = bool(_gc_threshold_before)  # the pace is still raised: this session ran tests of tests/
    _default_gc_pace()
    if ran_here:
        # The process exits next, and Python's final collections walk the whole heap: 0.5-0.9 s of each
        # xdist worker's exit, which the controller waits for. Frozen, the heap is left out of them.
        gc.freeze()


def _default_gc_pace() -> None:
    import gc

    if _gc_threshold_before:
        gc.set_threshold(*_gc_threshold_before.pop())


@pytest.fixture(autouse=True)
def kept_across_inline_runs(request: pytest.FixtureRequest) -> None:
    """pytester's in-process runs restore sys.modules as they end, so what a run imported first, the next
    run imports again: the report a run writes as it ends imports matplotlib (its plots) and jinja2
    (report.html) on first use, and one worker imported matplotlib three times and jinja2 six (~0.35 s
    and ~0.04 s each). Imported here, before a test's first in-process run, they stay."""
    if "pytester" in request.fixturenames:
        import importlib

        for name in ("jinja2", "matplotlib.figure", "matplotlib.backends.backend_agg"):
            importlib.import_module(name)


@pytest.fixture(autouse=True)
def no_gc_after_inline_pytest(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pytest session run inside a test (``specgate plan`` collects the perf tests with ``pytest.main``)
    collects garbage twice as it ends, to report unraisable exceptions: a full collection of this
    process's heap, ~0.1 s each in a worker that has run a few hundred tests. pytester turns it off for
    its inline runs for the same reason; this turns it off for every session a test runs in-process.
    The outer session still collects at its own end (this is undone by then)."""
    try:
        import _pytest.unraisableexception as unraisable
    except ImportError:  # another pytest's internals: nothing to turn off
        return
    monkeypatch.setattr(unraisable, "gc_collect_harder", lambda iterations: None, raising=False)


@pytest.fixture
def no_plots(monkeypatch: pytest.MonkeyPatch) -> None:
    """For tests of a whole in-process run (pytester) that check its verdicts and report, not its
    pictures: the run draws no plot (render_all then writes the summary and the page only). Drawing them costs
    ~0.5 s of matplotlib per run; tests/test_plots.py draws every plot from recorded reports."""
    import specgate.report.plots

    monkeypatch.setattr(specgate.report.plots, "plot_throughput", lambda report, path: None)
    monkeypatch.setattr(specgate.report.plots, "plot_acceptance", lambda report, path: None)
    monkeypatch.setattr(specgate.report.plots, "plot_forest", lambda report, path: None)


@pytest.fixture
def perf_project(pytester: pytest.Pytester) -> pytest.Pytester:
    """A project of its own with a copy of fixtures/ and the perf tests: pytester runs specgate there."""
    from pathlib import Path

    from fixture_copy import copy_fixtures

    copy_fixtures(pytester.path / "fixtures")
    perf_tests = Path(__file__).resolve().parents[1] / "perf_tests" / "test_speculative_perf.py"
    pytester.makepyfile(test_perf=perf_tests.read_text())
    pytester.makeini("[pytest]\nmarkers =\n    perf: p\n    cpu: c\n    gpu: g\n    speculative_only: s\n"
                     "    live_reference: l\n")
    return pytester


@pytest.fixture
def fake(tmp_path):
    """The fake vLLM server's script (tests/fake_vllm.py), written where a test can start it."""
    from fake_vllm import FAKE_SERVER

    script = tmp_path / "fake_vllm.py"
    script.write_text(FAKE_SERVER)
    return script


@pytest.fixture
def reaper():
    """Processes a test started, SIGKILLed at teardown if a failed test left them alive.
    psutil.Process.kill() checks the creation time first, so a reused pid is never hit."""
    import contextlib

    import psutil

    procs: list = []
    yield procs
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.kill()
