"""``python -m specgate``: prepare the embedded model, plan or run a rig's perf tests, list or stop
kept servers, adopt a saved report's windows as baselines, store a rig's history of fresh starts,
write the JSON schemas of report.json and baselines.json. (A saved report renders again with
``pytest --specgate-report-only=PATH``.)"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
from pathlib import Path
from typing import NoReturn

from specgate.advise.advice import advise_command
from specgate.config.locations import resolve_fixtures_dir, writable_folder
from specgate.config.rig import NO_SPEC, OLD_NO_SPEC, load_rig, read_toml
from specgate.decide.entry import entries_from_report
from specgate.decide.start_pairs import combine_folder
from specgate.errors import SpecgateError
from specgate.exit_codes import ExitCode
from specgate.plan.estimate import (
    Conditions,
    arrangement_lines,
    arrangements,
    choose_arrangement,
    paths,
)
from specgate.plugin.cost import PlanCapture
from specgate.report.history_view import build_history, history_text, plot_history
from specgate.report.red_runs import red_run_lines
from specgate.report.schemas import schema_text, write_schemas
from specgate.report.start_pairs_view import run_start_pairs, write_combined
from specgate.serve.extensions import run_model_prepared
from specgate.serve.host_memory import HOST_MEMORY_ENV
from specgate.serve.model_prep import prepare_model
from specgate.serve.registry import servers_command
from specgate.store.baselines import load_baselines, merge_updates

USAGE = int(ExitCode.USAGE_ERROR)


class _Parser(argparse.ArgumentParser):
    """argparse with specgate's usage-error code (argparse's own, 2, is pytest's "interrupted")."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(USAGE, f"{self.prog}: error: {message}\n")


def main(argv: list[str] | None = None) -> int:
    """Exit codes as a pytest run's (specgate.exit_codes): 4 for a bad argument or input file, 6
    when the job broke (the model could not be prepared), 5 when ``plan`` selects no perf test."""
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    if args.command in _NO_EXTRA_ARGUMENTS and rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return _COMMANDS[args.command](args, rest, parser)


def _parser() -> _Parser:
    parser = _Parser(prog="specgate", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_session_commands(sub)
    _add_history_commands(sub)
    schema = sub.add_parser("schema", help="print the JSON schema of report.json or "
                            "baselines.json, or write both (--out FOLDER)")
    schema.add_argument("name", nargs="?", choices=["report", "baselines"],
                        help="the schema to print")
    schema.add_argument("--out", type=Path, default=None, help="write report.schema.json and "
                        "baselines.schema.json into this folder")
    advise = sub.add_parser("advise", help="from a run's report (a speculative mode and no "
                            "speculation): the predicted tok/s ratio of each mode at every k up "
                            "to the served one, per class, with intervals, the best k and a PNG; "
                            "--seed: what the seed case's published figures allow")
    advise.add_argument("--rig", default=None,
                        help="the rig the report is of (with --seed: default the seed's)")
    advise.add_argument("--report", type=Path, default=None,
                        help="a run's report.json (or report.json.gz)")
    advise.add_argument("--seed", action="store_true",
                        help="advise from the seed case's published figures")
    advise.add_argument("--out", type=Path, default=None,
                        help="where the PNG goes (default .specgate/advice/<rig>)")
    return parser


def _add_session_commands(sub) -> None:
    """The commands around one session: prepare the model, run, plan, the kept servers."""
    prep = sub.add_parser("prepare-model",
                          help="fetch and convert SmolLM2-135M-Instruct for the cpu tier")
    prep.add_argument("--cache", type=Path, default=None, help="model cache (default "
                      "$SPECGATE_MODEL_CACHE or ~/.cache/specgate/models)")
    prep.add_argument("--force", action="store_true", help="convert again even if cached")
    run = sub.add_parser("run", help="run the perf tests of a rig and print the mode x class table "
                         "(extra arguments go to pytest)")
    run.add_argument("--rig", default="cpu-smollm2")
    plan = sub.add_parser("plan", help="what a perf session of a rig will cost, before anything "
                          "starts: server starts, windows, requests, tokens, an estimated "
                          "duration (extra arguments go to pytest's selection: -k EXPR, -m EXPR, "
                          "--specgate-vllm-url URL, ...)")
    plan.add_argument("--rig", default="cpu-smollm2")
    plan.add_argument("--host-memory-gib", type=_host_memory_gib, default=None, metavar="GIB",
                      help="plan for a host with this much available memory (default: this host's)")
    plan.add_argument("--specgate-keep-servers", action="store_true",
                      help="count the kept servers a --specgate-keep-servers session would "
                      "reuse as no start")
    plan.add_argument("--specgate-fixtures", type=Path, default=None, metavar="DIR",
                      help="the fixtures folder the rig is looked up in, as the session's option "
                      "(default $SPECGATE_FIXTURES, else ./fixtures)")
    servers = sub.add_parser("servers", help="list the servers kept running between sessions "
                             "(--specgate-keep-servers), or stop them")
    servers.add_argument("--stop", action="append", default=[], metavar="NAME",
                         help="stop this kept server")
    servers.add_argument("--stop-all", action="store_true", help="stop every kept server")


def _add_history_commands(sub) -> None:
    """The commands around stored figures: adopt, build-history, start-pairs, history."""
    adopt = sub.add_parser("adopt-baselines", help="write the windows measured in a saved "
                           "report.json as baselines (e.g. those an interrupted "
                           "--specgate-update-baselines run finished)")
    adopt.add_argument("report", type=Path, help="a run's report.json (or report.json.gz)")
    adopt.add_argument("--baselines", type=Path, default=None, help="default: ./baselines.json")
    adopt.add_argument("--modes", default=None, help="comma-separated subset of the report's modes")
    history = sub.add_parser("build-history", help="run N fresh-start sessions of a rig one after "
                             "the other, each storing its windows: the history of starts the "
                             "stored-level gate decides with (extra arguments after -- go to "
                             "pytest)")
    history.add_argument("--rig", required=True)
    history.add_argument("--starts", type=_positive_int, default=10,
                         help="fresh starts to store (default 10)")
    history.add_argument("--baselines", type=Path, default=None, help="default: ./baselines.json")
    history.add_argument("--runs", type=Path, default=None,
                         help="where each start's run folder goes "
                         "(default .specgate/history/<rig>)")
    pairs = sub.add_parser("start-pairs", help="an A/B over K start pairs: K sessions, each "
                           "starting both sides afresh, the side started first alternating, their "
                           "throughput ratios combined into one verdict per window (extra "
                           "arguments after -- go to pytest: the --specgate-ab-* options)")
    pairs.add_argument("--rig", required=True)
    pairs.add_argument("--pairs", type=_positive_int, default=2, help="start pairs (default 2)")
    pairs.add_argument("--runs", type=Path, default=None,
                       help="where each start pair's run folder goes "
                       "(default .specgate/start-pairs/<rig>)")
    pairs.add_argument("--combine-only", action="store_true",
                       help="run nothing: combine the kept reports of --runs' pair-NN folders "
                       "again")
    shown = sub.add_parser("history", help="show a rig's stored histories: per machine and "
                           "window, the levels over the starts (a table and a PNG), the spread, "
                           "what the level gate catches, a step or a drift")
    shown.add_argument("--rig", required=True)
    shown.add_argument("--baselines", type=Path, default=None, help="default: ./baselines.json")
    shown.add_argument("--out", type=Path, default=None,
                       help="where the PNG goes (default .specgate/history/<rig>)")


def _refused(exc: SpecgateError, code: int = USAGE) -> int:
    print(f"specgate: {exc}", file=sys.stderr)
    return code


def _advise(args, rest: list[str], parser: _Parser) -> int:
    if args.seed == (args.report is not None) or (args.report is not None and args.rig is None):
        parser.error("advise: give --rig NAME --report PATH, or --seed")
    return advise_command(rig=args.rig, report=args.report, seed=args.seed, out=args.out,
                          fixtures_dir=_fixtures_dir(), root=_project_root())


def _build_history(args, rest: list[str], parser: _Parser) -> int:
    try:
        root = _project_root()
        return build_history(args.rig, args.starts, fixtures_dir=_fixtures_dir(),
                             baselines=args.baselines or root / "baselines.json",
                             runs_dir=args.runs or root / ".specgate" / "history" / args.rig,
                             pytest_args=[a for a in rest if a != "--"])
    except SpecgateError as exc:
        return _refused(exc)


def _start_pairs(args, rest: list[str], parser: _Parser) -> int:
    try:
        rig = load_rig(args.rig, _fixtures_dir())
    except SpecgateError as exc:
        return _refused(exc)
    runs = args.runs or _project_root() / ".specgate" / "start-pairs" / args.rig
    if args.combine_only:
        return write_combined(rig, combine_folder(rig, runs), runs)
    return run_start_pairs(rig, args.pairs, runs_dir=runs,
                           pytest_args=[a for a in rest if a != "--"])


def _prepare_model(args, rest: list[str], parser: _Parser) -> int:
    try:
        run_model_prepared(prepare_model(args.cache, force=args.force))
    except SpecgateError as exc:
        return _refused(exc, int(ExitCode.JOB_BROKEN))
    return 0


def _run(args, rest: list[str], parser: _Parser) -> int:
    import pytest

    try:
        tier = load_rig(args.rig, _fixtures_dir()).tier
    except SpecgateError as exc:
        return _refused(exc)
    if tier == "cpu":
        try:
            run_model_prepared(prepare_model())
        except SpecgateError as exc:
            return _refused(exc, 1)
    return int(pytest.main(["-m", tier, "--specgate-rig", args.rig,
                            str(_project_root() / "perf_tests"), *rest]))


# Each command: (parsed arguments, the extra arguments, the parser) -> exit code.
_COMMANDS = {
    "advise": _advise,
    "schema": lambda args, rest, parser: schema_command(args.name, args.out, parser),
    "build-history": _build_history,
    "start-pairs": _start_pairs,
    "history": lambda args, rest, parser: history_command(
        args.rig, args.baselines or _project_root() / "baselines.json",
        args.out or _project_root() / ".specgate" / "history" / args.rig),
    "plan": lambda args, rest, parser: plan_session_command(
        args.rig, rest, keep_servers=args.specgate_keep_servers, host_gib=args.host_memory_gib,
        fixtures=args.specgate_fixtures),
    "servers": lambda args, rest, parser: (  # 1 from servers_command: an unknown name
        USAGE if servers_command(names=args.stop, stop_all=args.stop_all) else 0),
    "prepare-model": _prepare_model,
    "adopt-baselines": lambda args, rest, parser: adopt_baselines(
        args.report, args.baselines or _project_root() / "baselines.json",
        modes=args.modes.split(",") if args.modes else None),
    "run": _run,
}
_NO_EXTRA_ARGUMENTS = ("advise", "schema", "history")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return value


def _host_memory_gib(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an amount of memory in GiB (a number, 0 or more)")
    return value


def _project_root() -> Path:
    """The folder a command works in: the current one, as pytest's rootdir would be."""
    return Path.cwd()


def _fixtures_dir(option: Path | None = None) -> Path:
    return resolve_fixtures_dir(option, _project_root())


def plan_session_command(rig_name: str, pytest_args: list[str], *, keep_servers: bool = False,
                         host_gib: float | None = None, fixtures: Path | None = None) -> int:
    """``specgate plan``: collect the perf tests of ``rig_name`` as ``pytest -m TIER`` would, start
    nothing, and print the session's plan; on a rig whose servers take turns, its arrangements side
    by side and the paths to a verdict. Exit 4 when the plan refuses a mode."""
    import contextlib
    import io
    import os

    import pytest

    root = _project_root()
    try:  # the rig as the session loads it: a bad fixtures folder is refused before collection
        tier = load_rig(rig_name, _fixtures_dir(fixtures)).tier
    except SpecgateError as exc:
        return _refused(exc)
    if fixtures is not None:
        pytest_args = [f"--specgate-fixtures={fixtures}", *pytest_args]
    capture = PlanCapture(keep_servers=keep_servers, host_gib=host_gib)
    # test paths given (as `tox -e cpu` names one): those, else perf_tests/
    given = [a for a in pytest_args if not a.startswith("-") and Path(a.split("::")[0]).exists()]
    test_paths = [] if given else [str(root / "perf_tests")]
    out = io.StringIO()
    # the session's check before any start (sleep levels vs host memory) reads the planned host
    stand_in = os.environ.get(HOST_MEMORY_ENV)
    if host_gib is not None:
        os.environ[HOST_MEMORY_ENV] = repr(host_gib)
    try:
        with contextlib.redirect_stdout(out):
            code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "-m", tier,
                                "--specgate-rig", rig_name, f"--rootdir={root}",
                                *(["-c", str(root / "pyproject.toml")]
                                  if (root / "pyproject.toml").is_file() else []),
                                *pytest_args, *test_paths], plugins=[capture])
    finally:
        if stand_in is None:
            os.environ.pop(HOST_MEMORY_ENV, None)
        else:
            os.environ[HOST_MEMORY_ENV] = stand_in
    if capture.plan is None:
        print(out.getvalue(), end="")  # refused at collection (pytest printed why)
        if code == ExitCode.USAGE_ERROR:
            print(f"specgate: the session of rig {rig_name} is refused before any server starts "
                  "(above)", file=sys.stderr)
            return USAGE
        print(f"specgate: no perf test selected for rig {rig_name} (pytest exit code {int(code)})",
              file=sys.stderr)
        return int(ExitCode.NO_TESTS) if code in (ExitCode.OK, ExitCode.GATE_FAILED) else int(code)
    plan = capture.plan
    rig, store = capture.run_session.settings.rig, capture.run_session.settings.store
    if rig.arrangement.name == "alternation" and plan.servers:
        asked = Conditions(reused=[s.label for s in plan.servers if s.reused],
                           keep_servers=keep_servers, host_gib=host_gib,
                           other_tests=plan.other_tests, rate_note=capture.rates[1])
        options = arrangements(rig, capture.windows, capture.rates[0], store=store,
                               conditions=asked)
        chosen = choose_arrangement(options)
        plan = chosen.plan
        print(plan.render())
        for line in [*arrangement_lines(options, chosen),
                     *paths(rig, capture.windows, capture.rates[0], store=store,
                            host_gib=host_gib)]:
            print(line)
    else:
        print(plan.render())
    red_runs = capture.run_session.settings.red_runs  # the selection's chance of a red A/A
    for line in red_run_lines(red_runs.to_dict() if red_runs is not None else None):
        print(line)
    if plan.refusal:
        print(f"specgate: refused before any server starts: {plan.refusal}", file=sys.stderr)
        return USAGE
    # an input the session refuses (pytest printed it)
    return USAGE if code == ExitCode.USAGE_ERROR else 0


def _old_mode_name_in(report: dict) -> bool:
    """A report.json from before the no-speculation mode was renamed: its rig has a mode of the old
    name without speculation and none of the new, and this checkout's rig file of that name (if
    any) defines no mode of the old name of its own (with ``from``)."""
    rig = report.get("rig")
    if not isinstance(rig, dict) or not isinstance(rig.get("modes"), dict):
        return False
    modes = rig["modes"]
    if OLD_NO_SPEC not in modes or modes[OLD_NO_SPEC] is not None or NO_SPEC in modes:
        return False
    rig_file = _fixtures_dir() / "rigs" / f"{rig.get('name')}.toml"
    try:
        own = read_toml(rig_file).get("modes", {}).get(OLD_NO_SPEC)
    except SpecgateError:
        own = None  # no such rig here: the report alone decides
    return not (isinstance(own, dict) and "from" in own)


def _renamed_in(report: dict) -> dict:
    """The report with the no-speculation mode under its new name, where adopting reads it."""

    def name(mode: object) -> object:
        return NO_SPEC if mode == OLD_NO_SPEC else mode

    rig = report["rig"]
    return {**report,
            "rig": {**rig, "reference_mode": name(rig.get("reference_mode")),
                    "modes": {name(k): v for k, v in rig["modes"].items()}},
            "fingerprints": {name(k): v for k, v in (report.get("fingerprints") or {}).items()},
            "measurements": [{**m, "mode": name(m.get("mode")),
                              **({"partner": {**m["partner"],
                                              "mode": name(m["partner"].get("mode"))}}
                                 if isinstance(m.get("partner"), dict) else {})}
                             for m in report.get("measurements", [])]}


def history_command(rig_name: str, baselines: Path, out: Path) -> int:
    """Print the rig's stored histories and write their PNG; 4 for an unknown rig or a bad file."""
    try:
        rig = load_rig(rig_name, _fixtures_dir())
        if not baselines.exists():
            raise SpecgateError(f"{baselines}: no such baselines file (--baselines PATH)")
        store = load_baselines(baselines)
        writable_folder(out)
    except SpecgateError as exc:
        return _refused(exc)
    print(history_text(store, rig))
    path = plot_history(store, rig_name, out, rig.gates.confidence)
    if path is not None:
        print(f"plot: {path}")
    return 0


def schema_command(name: str | None, out: Path | None, parser: argparse.ArgumentParser) -> int:
    if (name is None) == (out is None):
        parser.error("schema: give a NAME to print, or --out FOLDER to write both")
    if out is not None:
        for path in write_schemas(out):
            print(path)
        return 0
    sys.stdout.write(schema_text(name))
    return 0


def adopt_baselines(report_path: Path, baselines_path: Path, *,
                    modes: list[str] | None = None) -> int:
    try:
        raw = report_path.read_bytes()
        report = json.loads(gzip.decompress(raw) if report_path.suffix == ".gz" else raw)
    except (OSError, ValueError) as exc:
        print(f"specgate: cannot read report {report_path}: {exc}", file=sys.stderr)
        return USAGE
    if not isinstance(report, dict) or "specgate_report" not in report:
        print(f"specgate: {report_path} is not a specgate report.json", file=sys.stderr)
        return USAGE
    if _old_mode_name_in(report):
        report = _renamed_in(report)
        modes = [NO_SPEC if m == OLD_NO_SPEC else m for m in modes or []] or None
        print(f"note: {report_path} names the no-speculation mode by its old name {OLD_NO_SPEC!r}; "
              f"its windows are adopted as {NO_SPEC!r}'s")
    try:
        load_baselines(baselines_path)  # a bad file: exit 4 before the report is read for windows
    except SpecgateError as exc:
        return _refused(exc)
    try:
        entries = entries_from_report(report, modes=modes)
    except (KeyError, TypeError, ValueError) as exc:
        print(f"specgate: {report_path}: a measurement is malformed ({type(exc).__name__}: {exc})",
              file=sys.stderr)
        return USAGE
    if not entries:
        print(f"specgate: {report_path} holds no measured window"
              + (f" of modes {modes}" if modes else ""), file=sys.stderr)
        return USAGE
    try:
        _, said = merge_updates(baselines_path, entries)
    except SpecgateError as exc:
        return _refused(exc)
    if not report.get("complete", True):
        print(f"note: {report_path} is from a run that did not finish; only its finished "
              "windows are adopted")
    for (rig, mode, prompt_class, concurrency), entry in sorted(entries.items()):
        print(f"{rig} / {mode} / {prompt_class} / c{concurrency}: median {entry.median:.1f} tok/s, "
              f"n={entry.n}, stored as {said[(rig, mode, prompt_class, concurrency)]}")
    print(f"{len(entries)} baseline(s) written to {baselines_path}")
    return 0
