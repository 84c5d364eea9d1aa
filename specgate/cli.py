"""``python -m specgate``: prepare the embedded model, run a tier, render a saved report."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from specgate.model_prep import SHAPES

    parser = argparse.ArgumentParser(prog="specgate", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare-model", help="fetch and convert SmolLM2-135M-Instruct for the cpu tier")
    prep.add_argument("--cache", type=Path, default=None, help="model cache (default $SPECGATE_MODEL_CACHE "
                      "or ~/.cache/specgate/models)")
    prep.add_argument("--force", action="store_true", help="convert again even if cached")
    prep.add_argument("--dummy-llama8b", type=Path, default=None, metavar="OUT",
                      help="instead: write a folder of --shape's shape (default Llama-3-8B's) without weights "
                           "(for --load-format dummy) into OUT, with the tokenizer of --source")
    prep.add_argument("--dummy-llama8b-draft", type=Path, default=None, metavar="OUT",
                      help="instead: the same shape cut to --draft-layers layers (the GPU-bound rig's draft model)")
    prep.add_argument("--draft-layers", type=int, default=4, metavar="N",
                      help="with --dummy-llama8b-draft: the draft's layers, 1-32 (default 4)")
    prep.add_argument("--shape", choices=tuple(SHAPES), default=None,
                      help="with --dummy-llama8b and --dummy-llama8b-draft: the shape written (default llama8b, "
                           "Llama-3-8B's; wide15b: width 6144, 15.5 B parameters, ~1.8x the 8B's GPU time per step)")
    prep.add_argument("--dummy-llama8b-eagle3", type=Path, default=None, metavar="OUT",
                      help="instead: an EAGLE-3 head's config for the target written by --dummy-llama8b "
                           "(of its shape), no weights")
    prep.add_argument("--source", type=Path, default=None, help="with --dummy-llama8b*: the SmolLM2 folder "
                      "(default: the converted model in the cache)")
    run = sub.add_parser("run", help="run the perf tests of a rig and print the mode x class table "
                         "(extra arguments go to pytest)")
    run.add_argument("--rig", default="cpu-smollm2")
    plan = sub.add_parser("plan", help="what a perf session of a rig will cost, before anything starts: server "
                          "starts, windows, requests, tokens, an estimated duration (extra arguments go to pytest's "
                          "selection: -k EXPR, -m EXPR, --specgate-vllm-url URL, ...)")
    plan.add_argument("--rig", default="cpu-smollm2")
    plan.add_argument("--specgate-keep-servers", action="store_true",
                      help="count the kept servers a --specgate-keep-servers session would reuse as no start")
    servers = sub.add_parser("servers", help="list the servers kept running between sessions "
                             "(--specgate-keep-servers), or stop them")
    servers.add_argument("--stop", action="append", default=[], metavar="NAME", help="stop this kept server")
    servers.add_argument("--stop-all", action="store_true", help="stop every kept server")
    rec = sub.add_parser("record", help="record real vLLM responses (SSE streams, /metrics) for replay tests")
    rec.add_argument("--rig", default="cpu-smollm2")
    rec.add_argument("--modes", default=None, help="comma-separated subset of the rig's modes")
    rec.add_argument("--out", type=Path, default=None, help="default: fixtures/recorded/<tier>")
    adopt = sub.add_parser("adopt-baselines", help="write the windows measured in a saved report.json as "
                           "baselines (e.g. those an interrupted --specgate-update-baselines run finished)")
    adopt.add_argument("report", type=Path, help="a run's report.json")
    adopt.add_argument("--baselines", type=Path, default=None, help="default: ./baselines.json")
    adopt.add_argument("--modes", default=None, help="comma-separated subset of the report's modes")
    cal = sub.add_parser("calibrate", help="measure each gate's false alarms and power on real servers: "
                         "A/A duets and real injected slowdowns (specgate.inject) on a candidate side")
    cal.add_argument("--rig", default="cpu-smollm2")
    cal.add_argument("--mode", default=None, help="the mode both sides run (default: the rig's reference mode)")
    cal.add_argument("--rounds", type=int, default=3, help="rounds; each measures every level on every class")
    cal.add_argument("--levels", default=",".join(f"{v:g}" for v in (0.0, 0.02, 0.05, 0.10, 0.20)),
                     help="injected slowdowns, comma-separated fractions (0 is the A/A)")
    cal.add_argument("--classes", default=None, help="comma-separated subset of the rig's prompt classes")
    cal.add_argument("--out", type=Path, default=None, help="default: .specgate/calibration/<time>-<rig>")
    cal.add_argument("--injector", choices=("cpu", "gpu"), default="cpu",
                     help="where the slowdown is injected: cpu (each engine step waits on the host) or gpu (GPU "
                          "work on the model runner's stream; use it on GPU rigs, where async scheduling hides a "
                          "host wait)")
    cal.add_argument("--fresh-servers", action="store_true",
                     help="start both servers again for every round, so windows sample start offsets as "
                          "separate runs do (without it every window shares one start)")
    cal.add_argument("--tolerances", default=None,
                     help="comma-separated tolerances for the table (default 0.02,0.03,0.05,0.10); a window "
                          "undecided at any of them gets the rig's follow-up rounds")
    cal.add_argument("--render", type=Path, nargs="+", default=None, metavar="DIR",
                     help="only render calibration.md and power.png again from DIR/windows.jsonl; several "
                          "runs' DIRs render as one set (their rounds and starts renumbered) into --out")
    e3 = sub.add_parser("train-eagle3", help="train an EAGLE-3 draft head for the target on text it generates "
                        "(specgate.eagle3_train), or write an untrained one (--untrained)")
    e3.add_argument("--out", type=Path, required=True, help="the head's folder (config.json, model.safetensors)")
    e3.add_argument("--target", type=Path, default=None, help="the target's Hugging Face folder "
                    "(default: the converted SmolLM2-135M in the model cache)")
    e3.add_argument("--work", type=Path, default=None, help="corpus and features, reused when present "
                    "(default: OUT.work)")
    e3.add_argument("--prompts", type=int, default=600, help="training prompts expanded from "
                    "fixtures/eagle3/corpus.toml")
    e3.add_argument("--max-tokens", type=int, default=256, help="tokens the target generates per prompt")
    e3.add_argument("--draft-vocab", type=int, default=4096, help="the head's output vocabulary (the most "
                    "frequent answer tokens)")
    e3.add_argument("--minutes", type=float, default=15.0, help="training time budget")
    e3.add_argument("--device", default=None, help="torch device for features and training (default: cuda "
                    "if available, else cpu)")
    e3.add_argument("--dtype", default="float32", help="the target's dtype while generating the corpus")
    e3.add_argument("--lr", type=float, default=1e-3)
    e3.add_argument("--batch-tokens", type=int, default=4096, help="padded tokens per training batch")
    e3.add_argument("--seed", type=int, default=0)
    e3.add_argument("--untrained", action="store_true", help="write a head with random weights and a valid "
                    "config (the backfire fixture) and stop")
    args, rest = parser.parse_known_args(argv)

    if args.command == "calibrate":
        return calibrate(args)
    if args.command == "plan":
        return plan_session_command(args.rig, rest, keep_servers=args.specgate_keep_servers)
    if args.command == "servers":
        from specgate.registry import servers_command

        return servers_command(names=args.stop, stop_all=args.stop_all)
    if args.command == "train-eagle3":
        return train_eagle3(args)

    if args.command == "prepare-model":
        from specgate.errors import SpecgateError
        from specgate.model_prep import MODEL_DIR_NAME, prepare_model, write_dummy_llama

        try:
            if args.dummy_llama8b_eagle3 is not None and args.dummy_llama8b is None:
                raise SpecgateError("--dummy-llama8b-eagle3 needs --dummy-llama8b (the target the head is shaped for)")
            if args.shape is not None and args.dummy_llama8b is None and args.dummy_llama8b_draft is None:
                raise SpecgateError(f"--shape {args.shape} needs --dummy-llama8b or --dummy-llama8b-draft "
                                    "(the folders it shapes)")
            if args.dummy_llama8b is not None or args.dummy_llama8b_draft is not None:
                from specgate.config import default_model_cache

                shape = args.shape or "llama8b"
                source = args.source or (args.cache or default_model_cache()) / MODEL_DIR_NAME
                # the draft first: a depth its shape cannot have is refused before anything is written
                for out, layers in ((args.dummy_llama8b_draft, args.draft_layers), (args.dummy_llama8b, None)):
                    if out is not None:
                        written = write_dummy_llama(source, out, shape, layers)
                        depth = layers or SHAPES[shape]["num_hidden_layers"]
                        print(f"dummy {shape}-shaped model ({depth} layers) written: {written}")
                if args.dummy_llama8b_eagle3 is not None:
                    from specgate.eagle3 import write_dummy_head

                    written = write_dummy_head(args.dummy_llama8b, args.dummy_llama8b_eagle3)
                    print(f"dummy EAGLE-3 head for {args.dummy_llama8b} written: {written}")
                return 0
            model = prepare_model(args.cache, force=args.force)
            _prepare_untrained_head(model)
        except SpecgateError as exc:
            print(f"specgate: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.command == "record":
        from specgate.config import load_rig
        from specgate.record import record_rig

        fixtures = _fixtures_dir()
        rig = load_rig(args.rig, fixtures)
        record_rig(rig, args.out or fixtures / "recorded" / rig.tier,
                   modes=args.modes.split(",") if args.modes else None)
        return 0
    if args.command == "adopt-baselines":
        return adopt_baselines(args.report, args.baselines or _project_root() / "baselines.json",
                               modes=args.modes.split(",") if args.modes else None)
    if args.command == "run":
        import pytest

        from specgate.config import load_rig
        from specgate.errors import SpecgateError

        root = _project_root()
        try:
            tier = load_rig(args.rig, _fixtures_dir()).tier
        except SpecgateError as exc:
            print(f"specgate: {exc}", file=sys.stderr)
            return 1
        if tier == "cpu":
            from specgate.model_prep import prepare_model

            _prepare_untrained_head(prepare_model())
        return int(pytest.main(["-m", tier, "--specgate-rig", args.rig, str(root / "perf_tests"), *rest]))
    return 2


def _project_root() -> Path:
    """The folder a command works in: the current one (a checkout, or any project holding fixtures/,
    perf_tests/ and baselines.json), as pytest's rootdir would be."""
    return Path.cwd()


def _fixtures_dir() -> Path:
    from specgate.locations import resolve_fixtures_dir

    return resolve_fixtures_dir(None, _project_root())


def plan_session_command(rig_name: str, pytest_args: list[str], *, keep_servers: bool = False) -> int:
    """``specgate plan``: collect the perf tests of ``rig_name`` as ``pytest -m TIER`` (with the
    extra arguments' selection) would, start nothing, and print the session's plan."""
    import contextlib
    import io

    import pytest

    from specgate.config import load_rig
    from specgate.errors import SpecgateError
    from specgate.plugin.cost import PlanCapture

    root = _project_root()
    try:
        tier = load_rig(rig_name, _fixtures_dir()).tier
    except SpecgateError as exc:
        print(f"specgate: {exc}", file=sys.stderr)
        return 1
    capture = PlanCapture(keep_servers=keep_servers)
    # test paths given (as `tox -e cpu` names perf_tests/test_speculative_perf.py): those, else perf_tests/
    given = [a for a in pytest_args if not a.startswith("-") and Path(a.split("::")[0]).exists()]
    paths = [] if given else [str(root / "perf_tests")]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "-m", tier, "--specgate-rig", rig_name,
                            f"--rootdir={root}",
                            *(["-c", str(root / "pyproject.toml")] if (root / "pyproject.toml").is_file() else []),
                            *pytest_args, *paths], plugins=[capture])
    if capture.plan is None:
        print(out.getvalue(), end="")
        print(f"specgate: no perf test selected for rig {rig_name} (pytest exit code {int(code)})", file=sys.stderr)
        return 1 if code else 0
    print(capture.plan.render())
    return 0


def _prepare_untrained_head(model: Path) -> None:
    """The EAGLE-3 backfire fixture beside the model (``<model>-eagle3-untrained``): random weights,
    valid config, seconds to write. Skipped where torch is missing (the fast tier's environment)."""
    from specgate.eagle3 import HEAD_MARKER, write_untrained_head

    out = model.with_name(model.name + "-eagle3-untrained")
    if (out / HEAD_MARKER).exists():
        return
    try:
        import torch  # noqa: F401
    except ImportError:
        print(f"untrained EAGLE-3 head not written (no torch here): {out}")
        return
    print(f"untrained EAGLE-3 head written: {write_untrained_head(model, out)}")


def train_eagle3(args: argparse.Namespace) -> int:
    from specgate.config import default_model_cache
    from specgate.errors import SpecgateError
    from specgate.model_prep import MODEL_DIR_NAME

    target = args.target or default_model_cache() / MODEL_DIR_NAME
    try:
        if args.untrained:
            from specgate.eagle3 import write_untrained_head

            out = write_untrained_head(target, args.out, draft_vocab=args.draft_vocab, seed=args.seed)
            print(f"untrained EAGLE-3 head written: {out}")
            return 0
        import torch

        from specgate.eagle3_train import run_recipe

        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        summary = run_recipe(target, args.out, args.work or args.out.with_name(args.out.name + ".work"),
                             prompts=args.prompts, max_tokens=args.max_tokens, draft_vocab=args.draft_vocab,
                             minutes=args.minutes, device=device, dtype=args.dtype, seed=args.seed, lr=args.lr,
                             batch_tokens=args.batch_tokens)
    except SpecgateError as exc:
        print(f"specgate: {exc}", file=sys.stderr)
        return 1
    print(f"EAGLE-3 head written: {args.out}\n{json.dumps(summary, indent=1)}")
    return 0


def _old_mode_name_in(report: dict) -> bool:
    """A report.json written before the no-speculation mode was renamed: its rig has a mode of the
    old name without speculation and none of the new name, and this checkout's rig file of that
    name (if any) does not define a mode of the old name of its own (with ``from``)."""
    from specgate.config import NO_SPEC, OLD_NO_SPEC, read_toml
    from specgate.errors import SpecgateError

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
    from specgate.config import NO_SPEC, OLD_NO_SPEC

    def name(mode: object) -> object:
        return NO_SPEC if mode == OLD_NO_SPEC else mode

    rig = report["rig"]
    return {**report,
            "rig": {**rig, "reference_mode": name(rig.get("reference_mode")),
                    "modes": {name(k): v for k, v in rig["modes"].items()}},
            "fingerprints": {name(k): v for k, v in (report.get("fingerprints") or {}).items()},
            "measurements": [{**m, "mode": name(m.get("mode")),
                              **({"partner": {**m["partner"], "mode": name(m["partner"].get("mode"))}}
                                 if isinstance(m.get("partner"), dict) else {})}
                             for m in report.get("measurements", [])]}


def adopt_baselines(report_path: Path, baselines_path: Path, *, modes: list[str] | None = None) -> int:
    import json

    from specgate.baselines import load_baselines, merge_updates
    from specgate.config import NO_SPEC, OLD_NO_SPEC
    from specgate.errors import SpecgateError
    from specgate.gates import entries_from_report

    try:
        report = json.loads(report_path.read_text())
    except (OSError, ValueError) as exc:
        print(f"specgate: cannot read report {report_path}: {exc}", file=sys.stderr)
        return 1
    if not isinstance(report, dict) or "specgate_report" not in report:
        print(f"specgate: {report_path} is not a specgate report.json", file=sys.stderr)
        return 1
    if _old_mode_name_in(report):
        report, modes = _renamed_in(report), [NO_SPEC if m == OLD_NO_SPEC else m for m in modes or []] or None
        print(f"note: {report_path} names the no-speculation mode by its old name {OLD_NO_SPEC!r}; "
              f"its windows are adopted as {NO_SPEC!r}'s")
    try:
        stored = load_baselines(baselines_path)
    except SpecgateError as exc:
        print(f"specgate: {exc}", file=sys.stderr)
        return 1
    try:
        entries = entries_from_report(report, modes=modes, stored=stored)
    except (KeyError, TypeError, ValueError) as exc:
        print(f"specgate: {report_path}: a measurement is malformed ({type(exc).__name__}: {exc})", file=sys.stderr)
        return 1
    if not entries:
        print(f"specgate: {report_path} holds no measured window" + (f" of modes {modes}" if modes else ""),
              file=sys.stderr)
        return 1
    try:
        merge_updates(baselines_path, entries)
    except SpecgateError as exc:
        print(f"specgate: {exc}", file=sys.stderr)
        return 1
    if not report.get("complete", True):
        print(f"note: {report_path} is from a run that did not finish; only its finished windows are adopted")
    for (rig, mode, prompt_class, concurrency), entry in sorted(entries.items()):
        print(f"{rig} / {mode} / {prompt_class} / c{concurrency}: median {entry.median:.1f} tok/s, n={entry.n}")
    print(f"{len(entries)} baseline(s) written to {baselines_path}")
    return 0


def calibrate(args: argparse.Namespace) -> int:
    import datetime as dt

    from specgate import calibrate as cal
    from specgate.config import load_rig
    from specgate.errors import SpecgateError

    root = _project_root()
    try:
        rig = load_rig(args.rig, _fixtures_dir())
        levels = [float(v) for v in args.levels.split(",") if v.strip()]
        tolerances = [float(v) for v in args.tolerances.split(",") if v.strip()] if args.tolerances \
            else list(cal.DEFAULT_TOLERANCES)
        if not tolerances or any(not 0 < t < 1 for t in tolerances):
            raise ValueError(f"--tolerances {args.tolerances!r}: give fractions between 0 and 1, e.g. 0.05")
    except (SpecgateError, ValueError) as exc:
        print(f"specgate calibrate: {exc}", file=sys.stderr)
        return 2
    if args.render is not None:
        if len(args.render) > 1 and args.out is None:
            print("specgate calibrate: --render with several runs writes one combined set: give it --out DIR",
                  file=sys.stderr)
            return 2
        try:
            results, meta = cal.load_runs(args.render)
        except (OSError, ValueError) as exc:
            print(f"specgate calibrate: {exc}", file=sys.stderr)
            return 2
        out = args.out or args.render[0]
        out.mkdir(parents=True, exist_ok=True)
        if out.resolve() != args.render[0].resolve() or len(args.render) > 1:
            cal.save_windows(out / "windows.jsonl", results)  # OUT renders again on its own
        print(cal.write_outputs(rig, out, results, tolerances, meta))
        return 0
    if rig.tier == "cpu":
        from specgate.model_prep import prepare_model

        prepare_model()
    out = args.out or root / ".specgate" / "calibration" / f"{dt.datetime.now():%Y%m%d-%H%M%S}-{rig.name}"

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # SIGTERM as Ctrl-C: the servers stop and the tables are written

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        path = cal.run_calibration(rig, out, mode_name=args.mode, rounds=args.rounds, levels=levels,
                                   classes=args.classes.split(",") if args.classes else None,
                                   tolerances=tolerances, fresh_servers=args.fresh_servers, injector=args.injector,
                                   progress=lambda line: print(f"[specgate] {line}", flush=True))
    except (SpecgateError, ValueError) as exc:
        print(f"specgate calibrate: {exc} (windows measured so far: {out / 'windows.jsonl'})", file=sys.stderr)
        return 1
    except cal.CalibrationStopped as stopped:
        print(stopped.path.read_text())
        print(f"specgate calibrate: stopped; the windows measured are in {out / 'windows.jsonl'}, their tables "
              f"in {stopped.path}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("specgate calibrate: stopped before any window was measured", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(path.read_text())
    print(f"written: {path}, {out / 'power.png'}, {out / 'windows.jsonl'}")
    return 0
