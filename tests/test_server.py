"""Tests for specgate.serve.server without vLLM: small fake servers (Python scripts in tmp_path) stand in
for ``vllm serve``, including an "engine core" child process in the same process group."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from fake_vllm import Reaper

import specgate.serve.server as server_mod
from specgate.errors import ServerDiedError, ServerError, ServerStartError
from specgate.serve.server import AttachedServer, ServerSpec, VLLMServer, format_elapsed, group_members

pytestmark = [pytest.mark.fast, pytest.mark.timeout(60)]

SERVED = "fake-model"



@pytest.fixture(autouse=True)
def fast_polling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_mod, "POLL_EVERY_S", 0.005)  # a fake server is ready in ~50 ms
    monkeypatch.setattr(server_mod, "KILL_GRACE_S", 5.0)


def _spec(fake: Path, tmp_path: Path, *extra: str, label: str = "ngram", served: str = SERVED,
          timeout_s: float = 20.0, env: dict[str, str] | None = None) -> ServerSpec:
    return ServerSpec(label=label, argv=[sys.executable, "-S", str(fake), "--state", str(tmp_path / "state.json"),
                                         *extra],
                      served_model_name=served, log_path=tmp_path / "logs" / f"{label}.log",
                      env=env or {}, startup_timeout_s=timeout_s, probe_timeout_s=5.0)


def _state(tmp_path: Path, reaper: Reaper, timeout_s: float = 10.0) -> dict:
    path = tmp_path / "state.json"
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, "the fake server never wrote its state"
        time.sleep(0.02)
    state = json.loads(path.read_text())
    for pid in (state["child"], state["pid"]):
        with contextlib.suppress(psutil.Error):
            reaper.append(psutil.Process(pid))
    return state


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_gone(pid: int, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not _gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# --------------------------------------------------------------------------- (a) lifecycle


def test_ready_then_whole_group_torn_down(fake: Path, tmp_path: Path, reaper: Reaper) -> None:
    lines: list[str] = []
    spec = _spec(fake, tmp_path, env={"FAKE_MARK": "from-spec"})
    with VLLMServer(spec, progress=lines.append) as server:
        state = _state(tmp_path, reaper)
        assert server.ready_after_s is not None and 0 < server.ready_after_s < 20
        assert server.pgid == server.process.pid == state["pid"] == state["pgid"]
        assert state["pgid"] != os.getpgid(0)  # its own session: the group is the server's alone
        assert server.base_url == f"http://127.0.0.1:{server.port}"
        assert state["argv"][-4:] == ["--host", "127.0.0.1", "--port", str(server.port)]
        assert state["env_mark"] == "from-spec"
        pgid, child = server.pgid, state["child"]
        members = {p.pid for p in group_members(pgid)}
        assert {state["pid"], child} <= members
        server.check_alive()  # no exception while it runs
        with socket.create_connection(("127.0.0.1", server.port), timeout=2):
            pass
    assert group_members(pgid) == []
    assert _gone(child) and _gone(state["pid"])
    assert server.process is None and server.pgid is None
    assert any(f"ready on port {server.port}" in line for line in lines)
    log = spec.log_path.read_text()
    assert log.startswith("# specgate: mode ngram, attempt 1\n# argv: ")
    assert "fake-vllm: generation for fake-model" in log  # readiness included one real generation
    server.stop()  # a second stop is a no-op


def test_base_url_before_start_is_an_error(fake: Path, tmp_path: Path) -> None:
    server = VLLMServer(_spec(fake, tmp_path))
    with pytest.raises(ServerError, match="mode ngram has not been started"):
        _ = server.base_url
    with pytest.raises(ServerDiedError, match="never started"):
        server.check_alive()
    server.stop()  # nothing to stop


def test_before_start_hook_runs_first_and_can_refuse(fake: Path, tmp_path: Path) -> None:
    def refuse() -> None:
        raise ServerStartError("GPU 0 is held")

    with pytest.raises(ServerStartError, match="GPU 0 is held"), VLLMServer(_spec(fake, tmp_path),
                                                                             before_start=refuse):
        pass
    assert not (tmp_path / "state.json").exists()  # nothing was launched


# --------------------------------------------------------------------------- (b) early exit


def test_exit_before_ready_quotes_code_and_log(fake: Path, tmp_path: Path, reaper: Reaper) -> None:
    started = time.monotonic()
    with pytest.raises(ServerStartError) as info, VLLMServer(_spec(fake, tmp_path, "--behaviour", "exit3")):
        pass
    assert time.monotonic() - started < 10
    message = str(info.value)
    assert "vLLM server for mode ngram exited with code 3" in message
    assert "fake-vllm: loading shard 4" in message
    assert "CUDA out of memory (pretend)" in message
    assert str(tmp_path / "logs" / "ngram.log") in message
    state = _state(tmp_path, reaper)
    assert _wait_gone(state["child"])  # the orphaned engine core was killed too
    assert group_members(state["pgid"]) == []


# --------------------------------------------------------------------------- (c) deadline


def test_startup_deadline(fake: Path, tmp_path: Path, reaper: Reaper, monkeypatch: pytest.MonkeyPatch) -> None:
    # polled every 50 ms: the 50 lines of log the message quotes still reach back to the fake's start
    # (each poll of /health logs a line)
    monkeypatch.setattr(server_mod, "POLL_EVERY_S", 0.05)
    spec = _spec(fake, tmp_path, "--behaviour", "never-healthy", timeout_s=1)
    started = time.monotonic()
    with pytest.raises(ServerStartError) as info, VLLMServer(spec):
        pass
    elapsed = time.monotonic() - started
    assert 1 <= elapsed < 10
    message = str(info.value)
    assert re.search(r"was not ready after [1-4]s \(startup deadline 1s; waiting for /health\)", message)
    assert "fake-vllm: listening on" in message  # the log's tail
    state = _state(tmp_path, reaper)
    assert group_members(state["pgid"]) == []
    assert _gone(state["child"]) and _gone(state["pid"])


def test_fatal_engine_error_in_the_log_fails_fast(fake: Path, tmp_path: Path, reaper: Reaper) -> None:
    # Seen on the GPU lab: the API server stayed up, the first generation hung, nothing exited.
    spec = _spec(fake, tmp_path, "--behaviour", "engine-error", timeout_s=60)
    started = time.monotonic()
    with pytest.raises(ServerStartError) as info, VLLMServer(spec):
        pass
    assert time.monotonic() - started < 15  # not the 60 s deadline, nor the 5 s probe timeout x N
    message = str(info.value)
    assert "mode ngram logged a fatal engine error" in message
    assert "(waiting for a first generation)" in message
    assert "WorkerProc hit an exception" in message and "no attribute 'drafter'" in message
    state = _state(tmp_path, reaper)
    assert group_members(state["pgid"]) == []


def test_hung_first_generation_keeps_reporting_and_meets_the_deadline(
        fake: Path, tmp_path: Path, reaper: Reaper, monkeypatch: pytest.MonkeyPatch) -> None:
    # a line every 20 ms: under load the fake server's start can take most of the 1-s deadline
    monkeypatch.setattr(server_mod, "PROGRESS_EVERY_S", 0.02)
    monkeypatch.setattr(server_mod, "POLL_EVERY_S", 0.02)
    spec = _spec(fake, tmp_path, "--behaviour", "hang-generation", timeout_s=1)
    spec.probe_timeout_s = 60  # longer than the deadline: the deadline must still hold
    lines: list[str] = []
    started = time.monotonic()
    with pytest.raises(ServerStartError, match=r"not ready after \ds \(startup deadline 1s; waiting for a first "
                                               r"generation\)"), VLLMServer(spec, progress=lines.append):
        pass
    assert time.monotonic() - started < 10
    assert sum("waiting for a first generation" in line for line in lines) >= 3, lines
    state = _state(tmp_path, reaper)
    assert group_members(state["pgid"]) == []


def test_fatal_engine_error_after_ready_is_a_dead_server(fake: Path, tmp_path: Path, reaper: Reaper) -> None:
    with VLLMServer(_spec(fake, tmp_path)) as server:
        server.check_alive()
        with server.log_path.open("a") as log:  # the engine dies; the API process lives on
            log.write("(EngineCore_DP0 pid=1) ERROR EngineCore encountered a fatal error.\n")
        with pytest.raises(ServerDiedError, match="logged a fatal engine error during the run"):
            server.check_alive()
        _state(tmp_path, reaper)


# --------------------------------------------------------------------------- (d) SIGTERM ignored


def test_stop_kills_a_server_that_ignores_sigterm(fake: Path, tmp_path: Path, reaper: Reaper,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_mod, "TERM_GRACE_S", 0.2)
    lines: list[str] = []
    server = VLLMServer(_spec(fake, tmp_path, "--behaviour", "ignore-term"), progress=lines.append)
    with server:
        state = _state(tmp_path, reaper)
        pgid = server.pgid
        os.killpg(pgid, signal.SIGTERM)  # really ignored, by both processes
        time.sleep(0.1)
        assert not _gone(state["pid"]) and not _gone(state["child"])
        started = time.monotonic()
    took = time.monotonic() - started
    assert 0.2 <= took < 8
    assert any("ignored SIGTERM for 0.2s; sending SIGKILL" in line for line in lines)
    assert group_members(pgid) == []
    assert _gone(state["pid"]) and _gone(state["child"])


# --------------------------------------------------------------------------- (e) death after ready


def test_death_after_ready_is_reported_with_the_log(fake: Path, tmp_path: Path, reaper: Reaper) -> None:
    with VLLMServer(_spec(fake, tmp_path)) as server:
        state = _state(tmp_path, reaper)
        pgid = server.pgid
        os.kill(server.process.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while server.process.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        with pytest.raises(ServerDiedError) as info:
            server.check_alive()
        message = str(info.value)
        assert "mode ngram exited with code -9 during the run" in message
        assert f"fake-vllm: listening on 127.0.0.1:{server.port}" in message
        assert not _gone(state["child"])  # the engine core outlived its parent...
    assert _wait_gone(state["child"])  # ...until stop() killed the group
    assert group_members(pgid) == []


# --------------------------------------------------------------------------- (f) wrong model


def test_wrong_served_model_name(fake: Path, tmp_path: Path, reaper: Reaper) -> None:
    spec = _spec(fake, tmp_path, "--served", "other-model", served="smollm2-135m")
    with pytest.raises(ServerStartError) as info, VLLMServer(spec):
        pass
    message = str(info.value)
    assert "other-model" in message and "'smollm2-135m'" in message
    assert "served_model_name" in message
    state = _state(tmp_path, reaper)
    assert group_members(state["pgid"]) == []


# --------------------------------------------------------------------------- (g) progress


def test_progress_reports_elapsed_time(fake: Path, tmp_path: Path, reaper: Reaper,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_mod, "PROGRESS_EVERY_S", 0.05)
    lines: list[str] = []
    with VLLMServer(_spec(fake, tmp_path, "--healthy-after", "0.2"), progress=lines.append):
        _state(tmp_path, reaper)
    waiting = [line for line in lines if "waiting for /health" in line]
    assert len(waiting) >= 2, lines
    assert all(re.search(r"mode ngram: waiting for /health, \d+s elapsed; log: ", line) for line in waiting)
    assert re.search(r"ready on port \d+ after \d+s", lines[-1])


@pytest.mark.parametrize(("seconds", "text"),
                         [(0, "0s"), (59.9, "59s"), (60, "1m00s"), (5405, "90m05s"), (8616, "2h23m")])
def test_format_elapsed(seconds: float, text: str) -> None:
    assert format_elapsed(seconds) == text


# --------------------------------------------------------------------------- (h) no shell


def test_argv_list_without_shell(fake: Path, tmp_path: Path, reaper: Reaper,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[tuple, dict]] = []
    real_popen = subprocess.Popen

    def spy(*args: object, **kwargs: object) -> subprocess.Popen:
        calls.append((args, kwargs))
        return real_popen(*args, **kwargs)

    monkeypatch.setattr(server_mod.subprocess, "Popen", spy)
    pwned = tmp_path / "pwned"
    nasty = f"$(touch {pwned}); touch {pwned} && echo `touch {pwned}`"
    with VLLMServer(_spec(fake, tmp_path, "--note", nasty)) as server:
        state = _state(tmp_path, reaper)
        port = server.port
    monkeypatch.undo()
    assert len(calls) == 1
    (argv,), kwargs = calls[0]
    assert isinstance(argv, list) and all(isinstance(a, str) for a in argv)
    assert not kwargs.get("shell", False)
    assert kwargs["start_new_session"] is True
    assert kwargs["stdin"] == subprocess.DEVNULL
    assert argv[-4:] == ["--host", "127.0.0.1", "--port", str(port)]
    assert state["unknown"] == ["--note", nasty]  # reached the server verbatim
    assert not pwned.exists()


# --------------------------------------------------------------------------- (i) port taken


@contextlib.contextmanager
def _held_port() -> Iterator[int]:
    """A port bound (without SO_REUSEADDR) by this process, so the fake's bind fails with
    EADDRINUSE. Not listening: a probe to it is refused at once instead of hanging until the
    readiness probe's 5 s read timeout, which a listening socket nobody serves would cause."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        yield int(held.getsockname()[1])


@pytest.fixture
def first_port_taken(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[int, list[int]]]:
    """free_port hands out a port someone holds first, then really free ones; yields that port
    and the list of ports handed out."""
    real_free_port = server_mod.free_port
    with _held_port() as taken:
        handed: list[int] = []

        def free_port(host: str = "127.0.0.1") -> int:
            handed.append(taken if not handed else real_free_port(host))
            return handed[-1]

        monkeypatch.setattr(server_mod, "free_port", free_port)
        yield taken, handed


def test_port_taken_is_retried_on_another_port(fake: Path, tmp_path: Path, reaper: Reaper,
                                               first_port_taken: tuple[int, list[int]]) -> None:
    taken, handed = first_port_taken
    lines: list[str] = []
    spec = _spec(fake, tmp_path)
    with VLLMServer(spec, progress=lines.append) as server:
        state = _state(tmp_path, reaper)
        assert server.port == handed[-1] != taken
        assert state["argv"][-1] == str(server.port)
        server.check_alive()
    assert len(handed) == 2
    assert any(f"port {taken} was taken; retrying on another port" in line for line in lines)
    log = spec.log_path.read_text()
    assert "Address already in use" in log
    assert "# specgate: mode ngram, attempt 1" in log and "# specgate: mode ngram, attempt 2" in log
    assert group_members(state["pgid"]) == []


def test_port_taken_every_time_gives_up(fake: Path, tmp_path: Path, reaper: Reaper,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    with _held_port() as taken:
        monkeypatch.setattr(server_mod, "free_port", lambda host="127.0.0.1": taken)
        with pytest.raises(ServerStartError) as info, VLLMServer(_spec(fake, tmp_path)):
            pass
    assert "exited with code 1" in str(info.value)
    assert "Address already in use" in str(info.value)
    log = (tmp_path / "logs" / "ngram.log").read_text()
    assert f"attempt {server_mod.PORT_RETRIES}" in log
    assert f"attempt {server_mod.PORT_RETRIES + 1}" not in log


def test_only_a_port_clash_of_this_attempt_is_retried(fake: Path, tmp_path: Path, reaper: Reaper,
                                                      first_port_taken: tuple[int, list[int]]) -> None:
    _taken, handed = first_port_taken
    with pytest.raises(ServerStartError, match="exited with code 3"), VLLMServer(
            _spec(fake, tmp_path, "--behaviour", "exit3-when-restarted")):
        pass
    _state(tmp_path, reaper)
    assert len(handed) == 2  # attempt 2 failed for another reason: no third start


# --------------------------------------------------------------------------- (j) attached


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_attached_server_unreachable_hides_the_api_key() -> None:
    secret = "sk-very-secret-4242"
    url = f"http://127.0.0.1:{_closed_port()}/"
    server = AttachedServer(url, label="no_spec", api_key=secret, timeout_s=2)
    assert server.base_url == url.rstrip("/")
    with pytest.raises(ServerDiedError) as info, server:
        pass
    message = str(info.value)
    assert secret not in message and secret not in repr(info.value.__cause__ or "")
    assert "not reachable" in message and "mode no_spec" in message and url.rstrip("/") in message
    assert "attached server" in server.log_tail()
    server.stop()  # nothing to stop, never raises


def test_attached_server_ready_and_unhealthy(fake: Path, tmp_path: Path, reaper: Reaper,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_mod, "PROGRESS_EVERY_S", 3600)
    with VLLMServer(_spec(fake, tmp_path)) as owned:
        _state(tmp_path, reaper)
        with AttachedServer(owned.base_url, label="no_spec", api_key="sk-x") as attached:
            attached.check_alive()
        bad = AttachedServer(owned.base_url + "/nothing-here", label="no_spec", api_key="sk-x")
        with pytest.raises(ServerDiedError, match="answered /health with HTTP 404") as info:
            bad.check_alive()
        assert "sk-x" not in str(info.value)


def test_server_is_terminated_when_specgate_itself_is_killed(tmp_path: Path) -> None:
    # SIGKILL of the pytest process (a CI timeout, the OOM killer) skips every teardown; the
    # parent-death signal still stops the server so it cannot keep holding a GPU.
    script = tmp_path / "parent.py"
    script.write_text(
        "import sys, time\n"
        "from pathlib import Path\n"
        "from specgate.serve.server import ServerSpec, VLLMServer\n"
        f"spec = ServerSpec(label='fake', argv=[sys.executable, '-S', '-c', 'import time; time.sleep(600)'],"
        f" served_model_name='x', log_path=Path({str(tmp_path / 'server.log')!r}))\n"
        "server = VLLMServer(spec)\n"
        "server._launch(1)\n"
        "print(server.process.pid, flush=True)\n"
        "time.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        parent.kill()
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while psutil.pid_exists(child) and psutil.Process(child).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, f"server {child} survived its parent's SIGKILL"
            time.sleep(0.05)
    finally:
        parent.kill()


def test_a_missing_local_draft_folder_fails_before_the_start_naming_rig_mode_and_key(tmp_path):
    from specgate.config.rig import load_rig
    from specgate.errors import ServerStartError
    from specgate.serve.server import check_local_paths

    rig = load_rig("cpu-smollm2-eagle3", Path(__file__).resolve().parent.parent / "fixtures")
    mode = rig.mode("eagle3_untrained").model_copy(update={"speculative_config": {
        **rig.mode("eagle3_untrained").speculative_config, "model": str(tmp_path / "nowhere")}})
    with pytest.raises(ServerStartError, match=r"rig cpu-smollm2-eagle3, mode eagle3_untrained: no such folder: "
                                               r"modes\.eagle3_untrained\.speculative_config\.model = .*nowhere\. "
                                               r"Write it first \(python -m specgate prepare-model"):
        check_local_paths(rig.model_copy(update={"model": str(tmp_path)}), mode)
    check_local_paths(rig.model_copy(update={"model": str(tmp_path)}), rig.mode("no_spec"))  # nothing to check
