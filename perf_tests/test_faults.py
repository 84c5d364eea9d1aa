"""Faults against a real vLLM on CPU: each must give a clear error within bounded time, and leave
no process of the server's group alive. Uses the embedded rig's real server and model."""

import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from specgate.config import load_rig
from specgate.errors import ServerDiedError, ServerStartError
from specgate.server import VLLMServer, group_members, spec_for_mode

pytestmark = [pytest.mark.cpu, pytest.mark.faults]

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def cpu_rig():
    return load_rig("cpu-smollm2", ROOT / "fixtures")


def _spec(rig, tmp_path, *, mode="baseline", speculative_config=None, model=None, timeout_s=None):
    mode_obj = rig.mode(mode)
    if speculative_config is not None:
        mode_obj = mode_obj.model_copy(update={"speculative_config": speculative_config})
    spec = spec_for_mode(rig.model_copy(update={"model": model or rig.model}), mode_obj, log_dir=tmp_path)
    if timeout_s is not None:
        spec.startup_timeout_s = timeout_s
    return spec


def _assert_group_gone(server_pgid):
    assert server_pgid is not None
    assert group_members(server_pgid) == [], f"processes of group {server_pgid} survived"


def _start_expecting_failure(spec):
    server = VLLMServer(spec)
    started = time.monotonic()
    with pytest.raises(ServerStartError) as failure:
        server.start()
    pgid = server.pgid
    server.stop()
    return failure.value, time.monotonic() - started, pgid


def test_invalid_speculative_config_fails_fast_quoting_the_log(cpu_rig, tmp_path, record_property):
    error, elapsed, pgid = _start_expecting_failure(
        _spec(cpu_rig, tmp_path, mode="ngram", speculative_config={"method": "no-such-method"}))
    record_property("seconds_to_error", round(elapsed, 1))
    assert "exited with code" in str(error) and "mode ngram" in str(error)
    assert "no-such-method" in str(error)  # vLLM's own complaint, quoted from the log
    assert elapsed < 120
    _assert_group_gone(pgid)


def test_missing_model_path_fails_fast_quoting_the_log(cpu_rig, tmp_path, record_property):
    error, elapsed, pgid = _start_expecting_failure(_spec(cpu_rig, tmp_path, model=str(tmp_path / "no-model")))
    record_property("seconds_to_error", round(elapsed, 1))
    assert "exited with code" in str(error) and "no-model" in str(error)
    assert elapsed < 120
    _assert_group_gone(pgid)


def test_startup_deadline_tears_down_the_group(cpu_rig, tmp_path, record_property):
    error, elapsed, pgid = _start_expecting_failure(_spec(cpu_rig, tmp_path, timeout_s=8))
    record_property("seconds_to_error", round(elapsed, 1))
    assert "was not ready after" in str(error) and "startup deadline 8s" in str(error)
    assert "Last 50 lines of" in str(error)
    assert elapsed < 60
    _assert_group_gone(pgid)


@pytest.mark.parametrize("victim", ["api-server", "engine-core"])
def test_killed_server_is_detected_and_leaves_nothing(cpu_rig, tmp_path, victim, record_property):
    with VLLMServer(_spec(cpu_rig, tmp_path)) as server:
        pgid = server.pgid
        api = psutil.Process(server.process.pid)
        if victim == "api-server":
            target = api
        else:
            target = next(p for p in api.children(recursive=True) if "EngineCore" in " ".join(p.cmdline()))
        killed_at = time.monotonic()
        os.kill(target.pid, signal.SIGKILL)
        deadline = killed_at + 60
        while True:  # what a measurement does before and after every window
            try:
                server.check_alive()
            except ServerDiedError as died:
                message = str(died)
                break
            assert time.monotonic() < deadline, f"SIGKILL of the {victim} went unnoticed for 60 s"
            time.sleep(0.5)
        record_property("seconds_to_error", round(time.monotonic() - killed_at, 1))
        assert "during the run" in message and "Last 50 lines of" in message
    _assert_group_gone(pgid)
