"""``python -m specgate_lab``: the lab's tools around the product: calibrate the gates on real servers,
record responses for the fast tier's replay tests, prepare the GPU lab's dummy-shaped models, train
an EAGLE-3 head. The product's commands (``prepare-model``, ``run``, ``plan``, ``servers``,
``adopt-baselines``) are ``python -m specgate``'s."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from specgate_lab.model_shapes import SHAPES

    parser = argparse.ArgumentParser(prog="specgate_lab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    cal = sub.add_parser("calibrate", help="measure each gate's false alarms and power on real servers: "
                         "A/A duets and real injected slowdowns (specgate_lab.inject) on a candidate side")
    cal.add_argument("--rig", default="cpu-smollm2")
    cal.add_argument("--mode", default=None, help="the mode both sides run (default: the rig's reference mode)")
    cal.add_argument("--rounds", type=int, default=3, help="rounds; each measures every level on every class")
    cal.add_argument("--levels", default=",".join(f"{v:g}" for v in (0.0, 0.02, 0.05, 0.10, 0.20)),
                     help="injected slowdowns, comma-separated fractions (0 is the A/A)")
    cal.add_argument("--classes", default=None, help="comma-separated subset of the rig's prompt classes")
    cal.add_argument("--out", type=Path, default=None, help="default: .specgate/calibration/<time>-<rig>")
    cal.add_argument("--injector", choices=("cpu", "gpu", "none"), default="cpu",
                     help="where the slowdown is injected: cpu (each engine step waits on the host) or gpu (GPU "
                          "work on the model runner's stream; use it on GPU rigs, where async scheduling hides a "
                          "host wait), or none (no injector on either side: a true A/A, --levels 0 only)")
    cal.add_argument("--repeats", type=int, default=None, metavar="N",
                     help="each prompt's requests per side in a window (default: the rig's protocol.repeats); "
                          "fewer make shorter windows, and the tables say which")
    cal.add_argument("--seed", type=int, default=0, help="the seed of each round's shuffled level order")
    cal.add_argument("--fresh-servers", action="store_true",
                     help="start both servers again for every round, so windows sample start offsets as "
                          "separate runs do (without it every window shares one start)")
    cal.add_argument("--tolerances", default=None,
                     help="comma-separated tolerances for the table (default 0.02,0.03,0.05,0.10); a window "
                          "undecided at any of them gets the rig's follow-up rounds")
    cal.add_argument("--render", type=Path, nargs="+", default=None, metavar="DIR",
                     help="only render calibration.md and power.png again from DIR/windows.jsonl; several "
                          "runs' DIRs render as one set (their rounds and starts renumbered) into --out")
    rec = sub.add_parser("record", help="record real vLLM responses (SSE streams, /metrics) for replay tests")
    rec.add_argument("--rig", default="cpu-smollm2")
    rec.add_argument("--modes", default=None, help="comma-separated subset of the rig's modes")
    rec.add_argument("--out", type=Path, default=None, help="default: fixtures/recorded/<tier>")
    shape = sub.add_parser("prepare-shape", help="write a dummy-weight model folder of a large shape (and its "
                           "draft, its EAGLE-3 head config) for the GPU lab's GPU-bound rigs")
    shape.add_argument("--cache", type=Path, default=None, help="model cache (default $SPECGATE_MODEL_CACHE "
                       "or ~/.cache/specgate/models)")
    shape.add_argument("--dummy-llama8b", type=Path, default=None, metavar="OUT",
                      help="instead: write a folder of --shape's shape (default Llama-3-8B's) without weights "
                           "(for --load-format dummy) into OUT, with the tokenizer of --source")
    shape.add_argument("--dummy-llama8b-draft", type=Path, default=None, metavar="OUT",
                      help="instead: the same shape cut to --draft-layers layers (the GPU-bound rig's draft model)")
    shape.add_argument("--draft-layers", type=int, default=4, metavar="N",
                      help="with --dummy-llama8b-draft: the draft's layers, 1-32 (default 4)")
    shape.add_argument("--shape", choices=tuple(SHAPES), default=None,
                      help="with --dummy-llama8b and --dummy-llama8b-draft: the shape written (default llama8b, "
                           "Llama-3-8B's; wide15b: width 6144, 15.5 B parameters, ~1.8x the 8B's GPU time per step)")
    shape.add_argument("--dummy-llama8b-eagle3", type=Path, default=None, metavar="OUT",
                      help="instead: an EAGLE-3 head's config for the target written by --dummy-llama8b "
                           "(of its shape), no weights")
    shape.add_argument("--source", type=Path, default=None, help="with --dummy-llama8b*: the SmolLM2 folder "
                      "(default: the converted model in the cache)")
    e3 = sub.add_parser("train-eagle3", help="train an EAGLE-3 draft head for the target on text it generates "
                        "(specgate_lab.eagle3_train), or write an untrained one (--untrained)")
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
    args = parser.parse_args(argv)

    if args.command == "calibrate":
        return calibrate(args)
    if args.command == "train-eagle3":
        return train_eagle3(args)
    if args.command == "prepare-shape":
        return prepare_shape(args)
    if args.command == "record":
        from specgate.config.rig import load_rig
        from specgate.measure.record import record_rig

        fixtures = _fixtures_dir()
        rig = load_rig(args.rig, fixtures)
        record_rig(rig, args.out or fixtures / "recorded" / rig.tier,
                   modes=args.modes.split(",") if args.modes else None)
        return 0
    return 2


def _fixtures_dir() -> Path:
    from specgate.config.locations import resolve_fixtures_dir

    return resolve_fixtures_dir(None, Path.cwd())


def prepare_shape(args: argparse.Namespace) -> int:
    from specgate.config.rig import default_model_cache
    from specgate.errors import SpecgateError
    from specgate.serve.model_prep import MODEL_DIR_NAME
    from specgate_lab.model_shapes import SHAPES, write_dummy_llama

    try:
        if args.dummy_llama8b_eagle3 is not None and args.dummy_llama8b is None:
            raise SpecgateError("--dummy-llama8b-eagle3 needs --dummy-llama8b (the target the head is shaped for)")
        if args.dummy_llama8b is None and args.dummy_llama8b_draft is None:
            raise SpecgateError(f"{'--shape ' + args.shape if args.shape else 'prepare-shape'} needs --dummy-llama8b "
                                "or --dummy-llama8b-draft (the folders it shapes)")
        shape = args.shape or "llama8b"
        source = args.source or (args.cache or default_model_cache()) / MODEL_DIR_NAME
        # the draft first: a depth its shape cannot have is refused before anything is written
        for out, layers in ((args.dummy_llama8b_draft, args.draft_layers), (args.dummy_llama8b, None)):
            if out is not None:
                written = write_dummy_llama(source, out, shape, layers)
                depth = layers or SHAPES[shape]["num_hidden_layers"]
                print(f"dummy {shape}-shaped model ({depth} layers) written: {written}")
        if args.dummy_llama8b_eagle3 is not None:
            from specgate_lab.eagle3 import write_dummy_head

            written = write_dummy_head(args.dummy_llama8b, args.dummy_llama8b_eagle3)
            print(f"dummy EAGLE-3 head for {args.dummy_llama8b} written: {written}")
    except SpecgateError as exc:
        print(f"specgate_lab: {exc}", file=sys.stderr)
        return 1
    return 0


def train_eagle3(args: argparse.Namespace) -> int:
    from specgate.config.rig import default_model_cache
    from specgate.errors import SpecgateError
    from specgate.serve.model_prep import MODEL_DIR_NAME

    target = args.target or default_model_cache() / MODEL_DIR_NAME
    try:
        if args.untrained:
            from specgate_lab.eagle3 import write_untrained_head

            out = write_untrained_head(target, args.out, draft_vocab=args.draft_vocab, seed=args.seed)
            print(f"untrained EAGLE-3 head written: {out}")
            return 0
        import torch

        from specgate_lab.eagle3_train import run_recipe

        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        summary = run_recipe(target, args.out, args.work or args.out.with_name(args.out.name + ".work"),
                             prompts=args.prompts, max_tokens=args.max_tokens, draft_vocab=args.draft_vocab,
                             minutes=args.minutes, device=device, dtype=args.dtype, seed=args.seed, lr=args.lr,
                             batch_tokens=args.batch_tokens)
    except SpecgateError as exc:
        print(f"specgate_lab: {exc}", file=sys.stderr)
        return 1
    print(f"EAGLE-3 head written: {args.out}\n{json.dumps(summary, indent=1)}")
    return 0


def calibrate(args: argparse.Namespace) -> int:
    import datetime as dt

    from specgate.config.rig import load_rig
    from specgate.errors import SpecgateError
    from specgate_lab import calibrate as cal

    root = Path.cwd()
    try:
        rig = load_rig(args.rig, _fixtures_dir())
        if args.repeats is not None:
            if args.repeats < 1:
                raise ValueError(f"--repeats {args.repeats}: give 1 or more")
            rig = rig.model_copy(update={"protocol": rig.protocol.model_copy(update={"repeats": args.repeats})})
        levels = [float(v) for v in args.levels.split(",") if v.strip()]
        tolerances = [float(v) for v in args.tolerances.split(",") if v.strip()] if args.tolerances \
            else list(cal.DEFAULT_TOLERANCES)
        if not tolerances or any(not 0 < t < 1 for t in tolerances):
            raise ValueError(f"--tolerances {args.tolerances!r}: give fractions between 0 and 1, e.g. 0.05")
        if args.render is None:
            cal.check_injector(args.injector, levels)
    except (SpecgateError, ValueError) as exc:
        print(f"specgate_lab calibrate: {exc}", file=sys.stderr)
        return 2
    if args.render is not None:
        if len(args.render) > 1 and args.out is None:
            print("specgate_lab calibrate: --render with several runs writes one combined set: give it --out DIR",
                  file=sys.stderr)
            return 2
        try:
            results, meta = cal.load_runs(args.render)
        except (OSError, ValueError) as exc:
            print(f"specgate_lab calibrate: {exc}", file=sys.stderr)
            return 2
        out = args.out or args.render[0]
        out.mkdir(parents=True, exist_ok=True)
        if out.resolve() != args.render[0].resolve() or len(args.render) > 1:
            cal.save_windows(out / "windows.jsonl", results)  # OUT renders again on its own
        print(cal.write_outputs(rig, out, results, tolerances, meta))
        return 0
    if rig.tier == "cpu":
        from specgate.serve.model_prep import prepare_model

        prepare_model()
    out = args.out or root / ".specgate" / "calibration" / f"{dt.datetime.now():%Y%m%d-%H%M%S}-{rig.name}"

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # SIGTERM as Ctrl-C: the servers stop and the tables are written

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        path = cal.run_calibration(rig, out, mode_name=args.mode, rounds=args.rounds, levels=levels,
                                   classes=args.classes.split(",") if args.classes else None,
                                   tolerances=tolerances, fresh_servers=args.fresh_servers, injector=args.injector,
                                   seed=args.seed,
                                   progress=lambda line: print(f"[specgate] {line}", flush=True))
    except (SpecgateError, ValueError) as exc:
        print(f"specgate_lab calibrate: {exc} (windows measured so far: {out / 'windows.jsonl'})", file=sys.stderr)
        return 1
    except cal.CalibrationStopped as stopped:
        print(stopped.path.read_text())
        print(f"specgate_lab calibrate: stopped; the windows measured are in {out / 'windows.jsonl'}, their tables "
              f"in {stopped.path}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("specgate_lab calibrate: stopped before any window was measured", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(path.read_text())
    print(f"written: {path}, {out / 'power.png'}, {out / 'windows.jsonl'}")
    return 0
