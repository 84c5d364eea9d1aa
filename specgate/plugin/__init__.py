"""plugin: specgate's pytest plugin (entry point ``specgate.plugin``): the hooks, each a thin call
into the module that holds its work. The server fixture is session-scoped and parametrized on the
rig's modes, so each server starts once (``pytest --setup-plan -m cpu``)."""

from __future__ import annotations

import contextlib
import json

import pytest

from specgate.errors import ConfigError
from specgate.exit_codes import session_exit_code
from specgate.plugin import cost
from specgate.plugin.configure import configure_session, get_session
from specgate.plugin.controller import decide_deferred_gates, deferred_test_reports
from specgate.plugin.gpu_split import XDIST_REFUSAL
from specgate.plugin.options import add_options
from specgate.plugin.output import (
    has_perf_work,
    render_saved_report,
    write_run_output,
    write_summary,
)
from specgate.plugin.parametrize import (
    NOT_RUN_HERE,
    deselect,
    deselect_not_deciding_here,
    deselect_speculative_only,
    parametrize_perf_test,
)

pytest_plugins = ["specgate.plugin.fixtures", "specgate.plugin.confirm"]


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    configure_session(config)
    config.pluginmanager.register(_Ordering(), "specgate-ordering")


def pytest_cmdline_main(config: pytest.Config) -> int | None:
    """--specgate-report-only: render a saved report again; start nothing."""
    path = config.getoption("specgate_report_only")
    return None if path is None else render_saved_report(path, config.getoption("specgate_run_dir"))


# -- xdist: the controller's side ----------------------------------------------------------------
@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist controller: every worker writes into the controller's run directory."""
    node.workerinput["specgate_run_dir"] = str(get_session(node.config).options.run_dir)
    node.workerinput["specgate_dist"] = node.config.getoption("dist", "no")  # workers see "no"


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """xdist controller: collect a finished worker's results and updates."""
    output = getattr(node, "workeroutput", {}).get("specgate")
    if output:
        get_session(node.config).absorb_worker(json.loads(output))


# -- collection ----------------------------------------------------------------------------------
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "vllm_server" in metafunc.fixturenames:  # only tests that use a server are perf tests
        parametrize_perf_test(metafunc, get_session(metafunc.config))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    run_session = get_session(config)
    deselect_speculative_only(config, items, run_session)
    deselect_tiers_not_asked_for(config, items)
    if run_session.config_error is not None or any(item.get_closest_marker("perf")
                                                   for item in items):
        refuse_bad_inputs(config, run_session)


TIER_WORDS = ("cpu", "gpu", "perf", "faults")
_TIERLESS = pytest.StashKey[int]()
_REFUSED = pytest.StashKey[bool]()  # refuse_bad_inputs stopped the run


def deselect_tiers_not_asked_for(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A run whose -m expression names no tier starts no vLLM server: deselect the tests marked cpu,
    gpu or perf (said in one line); ``-m cpu`` asks for them."""
    words = (config.option.markexpr or "").replace("(", " ").replace(")", " ").split()
    if any(word in TIER_WORDS for word in words):
        return

    def tiered(item: pytest.Item) -> bool:
        marks = {mark.name for mark in item.iter_markers()}
        return (bool(marks & {"cpu", "gpu", "perf"}) and "fast" not in marks
                and _selected_by_markexpr(config.option.markexpr, marks))

    if drop := deselect(config, items, tiered):
        config.stash[_TIERLESS] = len(drop)


def _selected_by_markexpr(markexpr: str, marks: set[str]) -> bool:
    if not markexpr:
        return True
    try:
        from _pytest.mark.expression import Expression  # pytest's own -m grammar (no public API)

        return Expression.compile(markexpr).evaluate(
            lambda name, **kwargs: name in marks and not kwargs)
    except Exception:  # another pytest's internals: deselect it here rather than start a server
        return True


def pytest_report_collectionfinish(config: pytest.Config) -> list[str]:
    lines = list(config.stash.get(NOT_RUN_HERE, []))
    count = config.stash.get(_TIERLESS, 0)
    if count:
        lines.append(f"specgate: {count} test(s) marked cpu, gpu or perf deselected: they start "
                     "vLLM servers, so a run selects them with -m cpu or -m gpu")
    return lines


def refuse_bad_inputs(config: pytest.Config, run_session) -> None:
    """Validate every input before any server starts: one usage error (an xdist worker cannot stop
    the run: its perf tests fail at setup instead). `import vllm` only where servers may start."""
    try:
        if run_session.config_error is not None:
            raise run_session.config_error
        planning_only = config.option.collectonly or getattr(config.option, "setupplan", False)
        run_session.validate_inputs(imports=not planning_only)
    except ConfigError as exc:
        if hasattr(config, "workerinput"):
            run_session.worker_refusal = f"specgate: {exc}"
            return
        config.stash[_REFUSED] = True
        raise pytest.UsageError(f"specgate: {exc} (checked before any server starts)") from None


class _Ordering:
    """Leave out the gates that cannot decide here, then order the most important first
    (cost.order_items), after pytest's own selection and grouping."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config,
                                      items: list[pytest.Item]) -> None:
        if any(cost.window_key(item) is not None for item in items):
            deselect_not_deciding_here(config, items, get_session(config))  # of what -m and -k kept
            cost.order_items(items,
                             [c.name for c in get_session(config).settings.rig.prompt_classes])
            cost.refuse_short_host(config, get_session(config), items)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """The selection is known: count the family, print the plan."""
    if session.config.stash.get(_REFUSED, False):
        return  # pytest calls this hook even when the selection raised; a refused run plans nothing
    run_session = get_session(session.config)
    gate_tests = [key for item in session.items if (key := cost.gate_key(item)) is not None]
    if gate_tests:
        with contextlib.suppress(ConfigError):  # refused with its file and key by refuse_bad_inputs
            run_session.plan_family(gate_tests)
    cost.start(session.config, run_session, session.items)


# -- the run -------------------------------------------------------------------------------------
@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    if _xdist_controller_of_a_perf_run(session.config):
        refuse_bad_inputs(session.config, get_session(session.config))


def _xdist_controller_of_a_perf_run(config: pytest.Config) -> bool:
    """The controller collects nothing: a -m expression selecting a tier is taken as a perf run."""
    if hasattr(config, "workerinput") or config.getoption("dist", "no") == "no":
        return False
    words = (config.option.markexpr or "").replace("(", " ").replace(")", " ").split()
    return any(w in ("cpu", "gpu", "perf") and (i == 0 or words[i - 1] != "not")
               for i, w in enumerate(words))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Fail before any fixture runs, so no xdist worker starts a server it may not."""
    if not item.get_closest_marker("perf"):
        return
    run_session = get_session(item.config)
    if hasattr(item.config, "workerinput") and (run_session.worker_refusal
                                                or run_session.settings.worker_gpus is None):
        pytest.fail(run_session.worker_refusal or XDIST_REFUSAL, pytrace=False)
    cost.check_budget(item, run_session)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    result = yield
    # the test's report lines are written: a session status line fits here without breaking them
    if item.get_closest_marker("perf"):
        cost.after_test(item.config, get_session(item.config))
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session: pytest.Session):
    """xdist controller, all workers done: decide and report the deferred gates."""
    result = yield
    run_session = get_session(session.config)
    if not hasattr(session.config, "workerinput") and run_session.worker_reports:
        decide_deferred_gates(run_session)
        for report in deferred_test_reports(run_session):  # as xdist relays a worker's report
            session.config.hook.pytest_runtest_logreport(report=report)
    return result


# -- the end of the run --------------------------------------------------------------------------
@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    run_session = get_session(session.config)
    if not has_perf_work(run_session):
        return
    if hasattr(session.config, "workerinput"):
        session.config.workeroutput["specgate"] = json.dumps(run_session.worker_output())
        return
    if run_session.deferred_failed:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    write_run_output(run_session, interrupted=exitstatus == pytest.ExitCode.INTERRUPTED)
    # specgate.exit_codes: a job that broke exits JOB_BROKEN, not as a gate that said no
    session.exitstatus = session_exit_code(session.exitstatus,
                                           run_session.report_data(complete=True))


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    run_session = get_session(config)
    if has_perf_work(run_session):
        write_summary(terminalreporter, run_session,
                      interrupted=exitstatus == pytest.ExitCode.INTERRUPTED)
