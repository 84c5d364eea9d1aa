"""One vLLM server process: start (in a new session, one process group to signal), readiness
(``/health``, ``/v1/models``, one generation), liveness, teardown of its whole process group;
``AttachedServer``: the same face for a server someone else started (``--specgate-vllm-url``)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from specgate.config.rig import Mode, Rig, Side
from specgate.durations import format_elapsed
from specgate.errors import ServerDiedError, ServerError, ServerStartError
from specgate.redaction import redacted_argv
from specgate.serve.http import auth_headers, tls_context

LOG_TAIL_LINES = 50
PROGRESS_EVERY_S = 30.0
POLL_EVERY_S = 1.0
TERM_GRACE_S = 30.0
KILL_GRACE_S = 10.0
PORT_RETRIES = 3
# Log lines after which vLLM will not serve (its API server may still answer /health).
FATAL_LOG_MARKERS = (
    "WorkerProc hit an exception",
    "EngineCore encountered a fatal error",
    "Engine core initialization failed",
    "EngineDeadError",
    "WorkerProc failed to start")

Progress = Callable[[str], None]


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free now (``VLLMServer`` retries when another takes it first)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def read_log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with path.open("r", errors="replace") as handle:
            return "".join(deque(handle, maxlen=lines)).rstrip()
    except FileNotFoundError:
        return "(no log file)"


def last_lines(path: Path) -> str:
    """The log's last lines, headed as every error that quotes them."""
    return f"Last {LOG_TAIL_LINES} lines of {path}:\n{read_log_tail(path)}"


def group_members(pgid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes whose process group is ``pgid``."""
    members = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(proc)
        except (ProcessLookupError, psutil.Error):
            continue
    return members


@dataclass
class ServerSpec:
    """Everything needed to launch one server; built by the plugin from a rig and a mode."""

    label: str  # the mode name, used in every message
    argv: Sequence[str]  # without --host/--port, which the server object chooses
    served_model_name: str
    log_path: Path
    env: Mapping[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"
    startup_timeout_s: float = 90 * 60
    probe_timeout_s: float = 300.0

    @property
    def api_key(self) -> str | None:
        """The key the server will demand, as vLLM reads it: ``--api-key`` among its arguments,
        else ``VLLM_API_KEY`` of its environment. Nothing specgate writes carries it."""
        for flag, value in zip(self.argv, [*self.argv[1:], None], strict=True):
            if flag == "--api-key" and value is not None:
                return value
            if flag.startswith("--api-key="):
                return flag.split("=", 1)[1]
        return {**os.environ, **self.env}.get("VLLM_API_KEY") or None


def spec_for_mode(rig: Rig, mode: Mode, *, log_dir: Path, gpus: str | None = None,
                  side: Side | None = None, side_name: str | None = None) -> ServerSpec:
    """The spec that starts ``rig``'s model in ``mode`` (on one side of an A/B: ``side``)."""
    prefix = list(rig.argv_prefix)
    if side is not None and side.python:
        if prefix[0] != sys.executable:
            raise ServerError(f"rig {rig.name}: an A/B side's python ({side.python}) replaces "
                              f"${{python}} in server_command, but it starts with {prefix[0]!r}")
        prefix[0] = side.python
    argv = [*prefix, "--model", rig.model, "--served-model-name", rig.served_model_name,
            *rig.mode_extra_args.get(mode.name, ()), *(side.extra_args if side else ())]
    if not rig.protocol.prefix_caching:
        argv.append("--no-enable-prefix-caching")
    if mode.speculative_config is not None:
        argv += ["--speculative-config", json.dumps({**mode.speculative_config,
                                                     **(side.speculative if side else {})})]
    env = {**rig.env, **rig.mode_env.get(mode.name, {}), **(side.env if side else {})}
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    label = f"{mode.name}@{side_name}" if side_name else mode.name
    return ServerSpec(label=label, argv=argv, served_model_name=rig.served_model_name,
                      log_path=log_dir / f"server-{label.replace('@', '-')}.log", env=env,
                      host=rig.host, startup_timeout_s=rig.startup_timeout_s)


def check_local_paths(rig: Rig, mode: Mode) -> None:
    """Fail before a start when the rig's model or the mode's draft names a missing folder."""
    wanted = {"model": rig.model, f"modes.{mode.name}.speculative_config.model":
              (mode.speculative_config or {}).get("model")}
    missing = [f"{key} = {path}" for key, path in wanted.items()
               if isinstance(path, str) and path.startswith("/") and not Path(path).exists()]
    if missing:
        raise ServerStartError(
            f"rig {rig.name}, mode {mode.name}: no such folder: {'; '.join(missing)}. Write it "
            "first (python -m specgate prepare-model writes the cpu tier's model and what "
            "installed plugins prepare beside it; the rig file's comments say where its other "
            "folders come from)")


class VLLMServer:
    """A vLLM OpenAI-compatible server this process started and owns."""

    term_with_parent = True  # SIGTERM it when specgate dies; a kept server outlives specgate

    def __init__(self, spec: ServerSpec, *, progress: Progress | None = None,
                 before_start: Callable[[], None] | None = None) -> None:
        self.spec = spec
        self.label = spec.label
        self.log_path = spec.log_path
        self.progress = progress or (lambda line: None)
        self.before_start = before_start
        self.port: int | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.pgid: int | None = None
        self.started_at: float | None = None
        self.ready_after_s: float | None = None
        self.api_key = spec.api_key  # demanded where it inherits VLLM_API_KEY or has --api-key
        self._log_start = 0
        self._scanned_to = 0  # log offset up to which fatal markers were looked for

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise ServerError(f"server for mode {self.label} has not been started")
        return f"http://{self.spec.host}:{self.port}"

    def __enter__(self) -> VLLMServer:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        if self.before_start is not None:
            self.before_start()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        for attempt in range(1, PORT_RETRIES + 1):
            self._launch(attempt)
            try:
                self._wait_ready()
                return
            except ServerStartError:
                log = self._this_attempt_log().lower()
                if attempt < PORT_RETRIES and "address already in use" in log:
                    self.progress(f"mode {self.label}: port {self.port} was taken; retrying on "
                                  "another port")
                    self.stop()
                    continue
                raise

    def _this_attempt_log(self) -> str:
        """The log written by the current attempt only (earlier attempts are appended above it)."""
        with self.log_path.open("r", errors="replace") as handle:
            handle.seek(self._log_start)
            return handle.read()

    def fatal_log_line(self) -> str | None:
        """The first line this attempt logged since the last call with a fatal engine error."""
        start = max(self._scanned_to, self._log_start)
        try:
            with self.log_path.open("rb") as handle:  # bytes: offsets stay exact
                handle.seek(start)
                chunk = handle.read()
        except FileNotFoundError:
            return None
        # Stop at the last complete line, so a marker split across two reads is still seen.
        complete = chunk[:chunk.rfind(b"\n") + 1]
        self._scanned_to = start + len(complete)
        return next((line.strip() for line in complete.decode(errors="replace").splitlines()
                     if any(marker in line for marker in FATAL_LOG_MARKERS)), None)

    def _launch(self, attempt: int) -> None:
        appended = attempt > 1 and self.log_path.exists()
        self._log_start = self.log_path.stat().st_size if appended else 0
        self._scanned_to = self._log_start
        self.port = free_port(self.spec.host)
        argv = [*self.spec.argv, "--host", self.spec.host, "--port", str(self.port)]
        env = {**os.environ, **self.spec.env}
        mode = "w" if attempt == 1 else "a"
        with self.log_path.open(mode) as log:
            log.write(f"# specgate: mode {self.label}, attempt {attempt}\n"
                      f"# argv: {redacted_argv(argv)!r}\n"
                      f"# CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES', '(unset)')}\n")
            log.flush()
            self.started_at = time.monotonic()
            self.process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, start_new_session=True,
                preexec_fn=_term_when_parent_dies if self.term_with_parent else None)
        self.pgid = self.process.pid  # start_new_session: the leader's pid is the group id

    def _wait_ready(self) -> None:
        assert self.process is not None and self.started_at is not None
        deadline = self.started_at + self.spec.startup_timeout_s
        last_progress = self.started_at
        stage = "waiting for /health"
        generation: _FirstGeneration | None = None
        with httpx.Client(base_url=self.base_url, timeout=httpx.Timeout(5.0),
                          headers=auth_headers(self.api_key), verify=tls_context()) as http:
            while True:
                now = time.monotonic()
                elapsed = now - self.started_at
                after = f"after {format_elapsed(elapsed)}"
                self._raise_if_down(ServerStartError, f"{after}, before it was ready ({stage})",
                                    f"{after} ({stage}); it will not become ready, stopping it")
                if now > deadline:
                    raise ServerStartError(
                        f"vLLM server for mode {self.label} was not ready {after} (startup "
                        f"deadline {format_elapsed(self.spec.startup_timeout_s)}; {stage}); "
                        f"stopping it.\n{last_lines(self.log_path)}")
                if now - last_progress >= PROGRESS_EVERY_S:
                    last_line = read_log_tail(self.log_path, 1).strip()[:160]
                    self.progress(f"mode {self.label}: {stage}, {format_elapsed(elapsed)} "
                                  f"elapsed; log: {last_line}")
                    last_progress = now
                if stage == "waiting for a first generation":
                    if generation is None:
                        generation = _FirstGeneration(self.base_url, self.spec,
                                                      api_key=self.api_key)
                    elif generation.done.is_set():
                        if generation.refused():
                            generation = None  # not accepting connections this instant: try again
                        else:
                            generation.raise_for_failure(self.label)
                            stage = "ready"
                else:
                    stage = self._probe(http, stage)
                if stage == "ready":
                    self.ready_after_s = time.monotonic() - self.started_at
                    self.progress(f"mode {self.label}: ready on port {self.port} after "
                                  f"{format_elapsed(self.ready_after_s)}")
                    return
                time.sleep(POLL_EVERY_S)

    def _probe(self, http: httpx.Client, stage: str) -> str:
        """Advance one readiness stage (/health, then /v1/models) if the server allows it."""
        try:
            if stage == "waiting for /health":
                if http.get("/health").status_code != 200:
                    return stage
                stage = "waiting for /v1/models"
            if stage == "waiting for /v1/models":
                response = http.get("/v1/models")
                if response.status_code != 200:
                    return stage
                names = [m.get("id") for m in response.json().get("data", [])]
                if self.spec.served_model_name not in names:
                    raise ServerStartError(f"vLLM server for mode {self.label} serves {names}, "
                                           f"not {self.spec.served_model_name!r} (check the rig's "
                                           "served_model_name)")
                stage = "waiting for a first generation"
        except (httpx.TransportError, ValueError):
            return stage  # not listening yet, or a half-written answer: poll again
        return stage

    def check_alive(self) -> None:
        """Raise ServerDiedError, quoting the log, if the server process has exited."""
        if self.process is None:
            raise ServerDiedError(f"vLLM server for mode {self.label} was never started")
        self._raise_if_down(ServerDiedError, "during the run",
                            "during the run; its requests would hang")

    def _raise_if_down(self, error: type[ServerError], exited: str, fatal_then: str) -> None:
        """Raise ``error``, quoting the log, if the process exited or logged a fatal error."""
        assert self.process is not None
        code = self.process.poll()
        if code is not None:
            raise error(f"vLLM server for mode {self.label} exited with code {code} {exited}.\n"
                        f"{last_lines(self.log_path)}")
        fatal = self.fatal_log_line()
        if fatal is not None:
            raise error(f"vLLM server for mode {self.label} logged a fatal engine error "
                        f"{fatal_then}.\n  {fatal[:300]}\n{last_lines(self.log_path)}")

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return read_log_tail(self.log_path, lines)

    def stop(self) -> None:
        """SIGTERM the group, wait, SIGKILL what is left, then check nothing of it survives."""
        if self.process is None or self.pgid is None:
            return
        pgid, process = self.pgid, self.process
        # Children that called setsid() would escape the group signal: remember them too.
        strays: list[psutil.Process] = []
        with contextlib.suppress(psutil.Error):
            strays = psutil.Process(process.pid).children(recursive=True)
        _signal_group(pgid, signal.SIGTERM)
        try:
            process.wait(timeout=TERM_GRACE_S)
        except subprocess.TimeoutExpired:
            self.progress(f"mode {self.label}: server ignored SIGTERM for {TERM_GRACE_S:g}s; "
                          "sending SIGKILL")
        _signal_group(pgid, signal.SIGKILL)
        for proc in strays:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=KILL_GRACE_S)
        survivors = _wait_group_gone(pgid, KILL_GRACE_S)
        survivors += [p for p in strays if _alive(p)]
        self.process = None
        self.pgid = None
        if survivors:
            raise ServerError(f"mode {self.label}: processes of server group {pgid} survived "
                              f"SIGKILL: {sorted({p.pid for p in survivors})}")


class _FirstGeneration:
    """The readiness probe's one real generation, in a daemon thread: a hung engine must not
    block the loop that watches the log and enforces the deadline."""

    def __init__(self, base_url: str, spec: ServerSpec, *, api_key: str | None = None) -> None:
        self.done = threading.Event()
        self.response: httpx.Response | None = None
        self.error: Exception | None = None
        body = {"model": spec.served_model_name, "max_tokens": 4, "temperature": 0.0,
                "messages": [{"role": "user", "content": "Say hello."}]}
        self._headers = auth_headers(api_key)
        self._thread = threading.Thread(target=self._run,
                                        args=(base_url, body, spec.probe_timeout_s),
                                        name=f"specgate-probe-{spec.label}", daemon=True)
        self._thread.start()

    def _run(self, base_url: str, body: dict, timeout_s: float) -> None:
        try:
            with httpx.Client(base_url=base_url, timeout=httpx.Timeout(timeout_s, connect=5.0),
                              headers=self._headers, verify=tls_context()) as http:
                self.response = http.post("/v1/chat/completions", json=body)
        except Exception as exc:  # reported by raise_for_failure on the waiting thread
            self.error = exc
        finally:
            self.done.set()

    def refused(self) -> bool:
        return isinstance(self.error, httpx.ConnectError)

    def raise_for_failure(self, label: str) -> None:
        if self.error is not None:
            raise ServerStartError(f"vLLM server for mode {label}: the first generation failed: "
                                   f"{type(self.error).__name__}: {self.error}")
        assert self.response is not None
        if self.response.status_code != 200:
            raise ServerStartError(f"vLLM server for mode {label}: the first generation failed "
                                   f"with HTTP {self.response.status_code}: "
                                   f"{self.response.text[:500]}")


def _term_when_parent_dies() -> None:
    """In the child, before exec: ask Linux to SIGTERM the server if specgate's process dies
    without tearing it down (SIGKILL, OOM), so no server keeps holding the GPU."""
    try:
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux/glibc: teardown still covers every normal exit
        pass


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:  # exited between the two calls
        return False


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _wait_group_gone(pgid: int, timeout_s: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout_s
    while True:
        members = group_members(pgid)
        if not members or time.monotonic() > deadline:
            return members
        time.sleep(0.2)


class AttachedServer:
    """A server started by someone else (``--specgate-vllm-url``): nothing to start or stop."""

    def __init__(self, base_url: str, *, label: str, api_key: str | None = None,
                 timeout_s: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.label = label
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.log_path: Path | None = None
        self.ready_after_s: float | None = None

    def __enter__(self) -> AttachedServer:
        self.check_alive()
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def check_alive(self) -> None:
        try:
            response = httpx.get(f"{self.base_url}/health", headers=auth_headers(self.api_key),
                                 timeout=self.timeout_s, verify=tls_context())
        except httpx.TransportError as exc:
            raise ServerDiedError(f"attached server {self.base_url} (mode {self.label}) is not "
                                  f"reachable: {type(exc).__name__}") from None
        if response.status_code != 200:
            raise ServerDiedError(f"attached server {self.base_url} (mode {self.label}) answered "
                                  f"/health with HTTP {response.status_code}")

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return "(attached server: its log is not available to specgate)"

    def stop(self) -> None:
        return None
