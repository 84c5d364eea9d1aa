"""specgate's command-line options: one "specgate" group (the plugin loads in every project of the
environment), each value checked by a ``parse_*`` function at parse time."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from specgate.config.locations import is_rig_path
from specgate.decide.outcome import parse_gating, parse_policy
from specgate.lazy import rig as config_mod
from specgate.serve.gpu import is_gpu_id


def parse_url(value: str) -> str:
    if not value.startswith(("http://", "https://")) or value.rstrip("/")[-3:] == "://":
        raise argparse.ArgumentTypeError(f"{value!r} is not an http(s) URL, e.g. "
                                         "http://127.0.0.1:8000")
    return value.rstrip("/")


def parse_gpu_list(value: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items or not all(is_gpu_id(v) for v in items) or len(set(items)) != len(items):
        raise argparse.ArgumentTypeError(f"{value!r} is not a list of distinct GPUs like 0,1,2 "
                                         "(indices, GPU-<uuid> or MIG-<uuid>, as "
                                         "CUDA_VISIBLE_DEVICES takes)")
    return items


def parse_rig_name(value: str) -> str:
    """A rig of the fixtures folder or a path to a rig file (contains ``/`` or ends in ``.toml``),
    which must be readable; a path comes back absolute."""
    if value and is_rig_path(value):
        path = Path(value).expanduser()
        if not path.is_file():
            raise argparse.ArgumentTypeError(f"rig file {str(path)!r} does not exist (or is not a "
                                             "file)")
        if not os.access(path, os.R_OK):
            raise argparse.ArgumentTypeError(f"rig file {str(path)!r} is not readable")
        return str(path.resolve())
    if not value or value.startswith("."):
        raise argparse.ArgumentTypeError(f"{value!r} is not a rig: a name (a file stem under "
                                         "fixtures/rigs/) or a path to a rig .toml file")
    return value


ARRANGEMENTS = ("auto", "duet", "alternation", "sequential")


def parse_arrangement(value: str) -> str:
    """One of ARRANGEMENTS ("alternate", the older spelling, reads as "alternation")."""
    value = "alternation" if value == "alternate" else value
    if value not in ARRANGEMENTS:
        raise argparse.ArgumentTypeError(f"{value!r}: expected one of {', '.join(ARRANGEMENTS)}")
    return value


def _option_type(parse: Callable[[str], dict[str, str]]) -> Callable[[str], dict[str, str]]:
    """``parse`` with its ValueError said as argparse's error."""
    def parse_option(value: str) -> dict[str, str]:
        try:
            return parse(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parse_option


parse_gating_option = _option_type(parse_gating)
parse_outcome_policy = _option_type(parse_policy)


def parse_duration(value: str) -> float:
    """Seconds, from ``1500``, ``1500s``, ``25m``, ``2h`` or ``1h30m``."""
    text = value.strip().lower()
    match = re.fullmatch(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?", text)
    if not text or match is None or not any(match.groups()):
        raise argparse.ArgumentTypeError(f"{value!r} is not a duration: seconds (1500), or with a "
                                         "unit (25m, 2h, 1h30m)")
    hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    total = 3600 * hours + 60 * minutes + seconds
    if total <= 0:
        raise argparse.ArgumentTypeError(f"{value!r} is not a duration above 0")
    return total


def _assignment(value: str, form: str, example: str) -> tuple[str, str]:
    name, sep, val = value.partition("=")
    if not sep or not name or not name.replace("_", "").isalnum():
        raise argparse.ArgumentTypeError(f"{value!r} is not {form}, e.g. {example}")
    return name, val


def parse_env_assignment(value: str) -> tuple[str, str]:
    return _assignment(value, "NAME=VALUE", "VLLM_CPU_KVCACHE_SPACE=4")


def parse_spec_assignment(value: str) -> tuple[str, Any]:
    """KEY=VALUE for a speculative-config key; VALUE read as JSON, else a string."""
    name, val = _assignment(value, "KEY=VALUE", "num_speculative_tokens=5")
    try:
        return name, json.loads(val)
    except ValueError:
        return name, val


AB_SIDES = ("reference", "candidate")


def ab_from_options(config: pytest.Config):
    """An A/B from the --specgate-ab-* options, or None when none is given."""
    given = {side: {"python": config.getoption(f"specgate_ab_{side}_python"),
                    "extra_args": tuple(shlex.split(config.getoption(f"specgate_ab_{side}_args")
                                                    or "")),
                    "env": dict(config.getoption(f"specgate_ab_{side}_env") or []),
                    "speculative": dict(config.getoption(f"specgate_ab_{side}_spec") or [])}
             for side in AB_SIDES}
    if not any(v for side in given.values() for v in side.values()):
        return None
    # pydantic (specgate.lazy): only for a run that gives --specgate-ab-* options
    return config_mod.AB(**{side: config_mod.Side(**values) for side, values in given.items()})


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("specgate", "specgate: vLLM speculative-decoding performance gates")
    _add_input_options(group)
    _add_ab_options(group)
    _add_session_options(group)


def _add_input_options(group) -> None:
    """The rig, fixtures, baselines and an attached server."""
    group.addoption("--specgate-rig", type=parse_rig_name,
                    default=os.environ.get("SPECGATE_RIG", "cpu-smollm2"),
                    help="rig to run: NAME (fixtures/rigs/NAME.toml) or a path to a rig .toml "
                         "file (default: cpu-smollm2, or $SPECGATE_RIG)")
    group.addoption("--specgate-fixtures", type=Path, default=None,
                    help="folder holding modes.toml, prompts.toml and rigs/ (default: "
                         "$SPECGATE_FIXTURES, else <rootdir>/fixtures)")
    group.addoption("--specgate-baselines", type=Path, default=None,
                    help="baselines file (default: <rootdir>/baselines.json)")
    group.addoption("--specgate-run-dir", type=Path, default=None,
                    help="where server logs and reports go (default: "
                         "<rootdir>/.specgate/runs/<time>-<rig>-<pid>)")
    group.addoption("--specgate-update-baselines", action="store_true",
                    help="write the measured values as baselines; those tests still FAIL, so CI "
                         "never updates silently")
    group.addoption("--specgate-regen-baselines", action="store_true",
                    help="write the measured values as baselines and let those tests pass")
    group.addoption("--specgate-strict-fingerprint", action="store_true",
                    help="fail a throughput gate when the stored figures were measured on another "
                         "accelerator/vLLM/model")
    group.addoption("--specgate-vllm-url", type=parse_url, default=None,
                    help="attach mode: test an already running server (starts nothing)")
    group.addoption("--specgate-vllm-mode", default=None,
                    help="attach mode: the rig's mode the running server was started with "
                         "(default: the reference mode)")
    group.addoption("--specgate-vllm-api-key", default=None,
                    help="attach mode: API key (or $SPECGATE_API_KEY); never printed or stored")
    group.addoption("--specgate-gpus", type=parse_gpu_list, default=None,
                    help="GPUs specgate may use: indices (0,1,2,3) or GPU-/MIG- UUIDs (default: "
                         "CUDA_VISIBLE_DEVICES, else all NVML sees); under xdist each worker gets "
                         "gpus_per_server of them for its servers")
    group.addoption("--specgate-record-responses", type=Path, default=None, metavar="DIR",
                    help="also record each started server's raw responses and /metrics into DIR, "
                         "for the fast tier's replay tests (no extra server start)")


def _add_ab_options(group) -> None:
    """Each A/B side's python, arguments, environment and speculative config."""
    for side in AB_SIDES:
        group.addoption(f"--specgate-ab-{side}-python", default=None, metavar="PYTHON",
                        help=f"A/B: the {side} side's python (its vLLM build's environment); any "
                             "--specgate-ab-* option makes the run an A/B: every mode on both "
                             "sides, alternated")
        group.addoption(f"--specgate-ab-{side}-args", default=None, metavar="'ARGS'",
                        help=f"A/B: extra `vllm serve` arguments of the {side} side (one quoted "
                             "string)")
        group.addoption(f"--specgate-ab-{side}-env", type=parse_env_assignment, action="append",
                        default=None, metavar="NAME=VALUE",
                        help=f"A/B: an environment variable of the {side} side's servers "
                        "(repeatable), e.g. VLLM_CPU_KVCACHE_SPACE=4")
        group.addoption(f"--specgate-ab-{side}-spec", type=parse_spec_assignment, action="append",
                        default=None, metavar="KEY=VALUE",
                        help=f"A/B: a speculative-config key of the {side} side's speculative "
                        "modes (repeatable; VALUE as JSON), e.g. num_speculative_tokens=5")
    group.addoption("--specgate-start-seed", type=int, default=None, metavar="N",
                    help="A/B: the seed that picks, per mode, which side's server starts first "
                         "(two fresh identical servers read about 1 %% apart by start order); "
                         "reported in the summary and report.json (default: drawn for each "
                         "session)")
    group.addoption("--specgate-first-side", choices=("reference", "candidate"), default=None,
                    help="A/B: the side whose server starts first for every mode, over the seed's "
                         "pick (`python -m specgate start-pairs` alternates it from one start "
                         "pair to the next)")


def _add_session_options(group) -> None:
    """Budget, kept servers, outcome policy, arrangement, gating."""
    group.addoption("--specgate-session-budget", type=parse_duration,
                    default=os.environ.get("SPECGATE_SESSION_BUDGET"), metavar="DURATION",
                    help="bound the whole session (1500, 25m, 1h30m): the windows run in the "
                    "order that decides backfire first; a window that would not end within "
                    "DURATION of the session's start is NOT RUN (reported with the reason), and "
                    "follow-up rounds get only what the remaining windows leave (default: no "
                    "bound, or $SPECGATE_SESSION_BUDGET)")
    group.addoption("--specgate-keep-servers", action="store_true",
                    default=bool(os.environ.get("SPECGATE_KEEP_SERVERS")),
                    help="leave the servers specgate starts running after the session, and reuse a "
                         "kept one whose whole fingerprint (argv, environment, vLLM build, model, "
                         "rig mode) matches; a kept server of the same rig and mode with another "
                         "fingerprint is stopped, never reused. List or stop them with `python -m "
                         "specgate servers` (default: off, or $SPECGATE_KEEP_SERVERS)")
    group.addoption("--specgate-undecided", type=parse_outcome_policy, default=None,
                    metavar="skip|fail",
                    help="what a gate that decided nothing (undecided, not stored, other machine, "
                         "not run) does to the run: 'skip' (listed in the summary, exit 0), "
                         "'fail' (pre-merge gating), or per outcome, e.g. "
                         "not_stored=skip,undecided=fail (default: the rig's [gates] undecided, "
                         "else not_stored=fail and the others skip)")
    group.addoption("--specgate-arrangement", "--specgate-design", dest="specgate_arrangement",
                    type=parse_arrangement, default=None,
                    metavar="auto|duet|alternation|sequential",
                    help="how the servers of a comparison share the machine, over the rig's "
                         "arrangement: 'duet' (both live), 'alternation' (taking turns on the "
                         "same GPUs, vLLM sleep mode), 'sequential' (one server at a time; what "
                         "`specgate plan` picks for a rig too big to keep two loaded) or 'auto' "
                         "(default: the rig's arrangement). --specgate-design (with 'alternate') "
                         "is its older spelling")
    group.addoption("--specgate-gating", type=parse_gating_option, default=None,
                    metavar="auto|gate|report",
                    help="which gates fail the run: 'auto' (those that can decide on this rig: an "
                         "A/B, backfire, TTFT, stored figures with 3 runs of history; the others "
                         "are reported only), 'gate' (an undecided one fails the run), 'report' "
                         "(never fails it), or per gate, e.g. throughput=gate,acceptance=report "
                         "(default: the rig's [gates] gating, else unset: every FAIL fails the "
                         "run and --specgate-undecided says what one that decided nothing does)")
    group.addoption("--specgate-report-only", type=Path, default=None, metavar="REPORT_JSON",
                    help="render the summary, Markdown and plots again from a saved report.json "
                         "into --specgate-run-dir, else a folder beside it named after it "
                         "(report-rendered/); runs no test")
