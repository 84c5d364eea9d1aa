"""specgate.serve.registry: servers kept loaded between sessions, with the stand-in `vllm serve` of
test_server.py. A kept server is reused only on its whole fingerprint; one of another configuration
is stopped, never reused; an attached server is never recorded, reused or stopped."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from test_server import _spec, _wait_gone

from specgate.serve import registry
from specgate.serve.registry import KeptVLLMServer, ReusedServer, fingerprint, kept_or_started, load_all
from specgate.serve.server import AttachedServer, VLLMServer

pytestmark = [pytest.mark.fast, pytest.mark.timeout(60)]

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def fast_polling(monkeypatch: pytest.MonkeyPatch) -> None:
    import specgate.serve.server as server_mod

    monkeypatch.setattr(server_mod, "POLL_EVERY_S", 0.005)  # a fake server is ready in ~50 ms


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The registry's folder for this test; every server still recorded there is stopped after it."""
    state = tmp_path / "state"
    monkeypatch.setenv(registry.STATE_ENV, str(state))
    yield state
    for kept in load_all(state):
        registry.stop_kept(kept, state, grace_s=5.0)


def _rig(tmp_path: Path) -> SimpleNamespace:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    return SimpleNamespace(name="stand-in", model=str(model))


def _digest(spec, rig, **changes) -> str:
    values = {"rig": rig.name, "label": "ngram", "model": rig.model, "build": "vllm 0.32.0 /venv",
              "folder": Path(rig.model).parent / "state", **changes}
    return fingerprint(spec, **values)[0]


def test_the_fingerprint_covers_argv_environment_build_model_and_mode(fake, tmp_path):
    rig = _rig(tmp_path)
    spec = _spec(fake, tmp_path)
    same = _digest(spec, rig)
    assert _digest(_spec(fake, tmp_path), rig) == same
    assert _digest(_spec(fake, tmp_path, "--max-num-seqs", "8"), rig) != same  # argv
    assert _digest(_spec(fake, tmp_path, env={"VLLM_X": "1"}), rig) != same  # environment given
    assert _digest(spec, rig, build="vllm 0.33.0 /venv") != same  # vLLM build
    assert _digest(spec, rig, label="no_spec") != same  # rig mode
    (Path(rig.model) / "model.safetensors").write_text("new weights")
    assert _digest(spec, rig) != same  # the model folder's files
    inherited = fingerprint(spec, rig="r", label="m", model="x", build="b", environ={"VLLM_CPU_KVCACHE_SPACE": "2"})
    assert inherited[1]["env"] == {"VLLM_CPU_KVCACHE_SPACE": "2"}


def test_the_fingerprint_covers_the_drafter_s_files_and_a_plugin_s_inherited_variables(fake, tmp_path):
    rig = _rig(tmp_path)
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text("{}")
    spec = _spec(fake, tmp_path, "--speculative-config", json.dumps({"method": "draft_model", "model": str(draft)}))
    same = _digest(spec, rig)
    (draft / "model.safetensors").write_text("retrained into the same folder")
    assert _digest(spec, rig) != same  # a head written again is another server
    env = {"SLOWER_GPU": "0.05", "PYTHONPATH": "/lab", "HF_HUB_OFFLINE": "1", "HOME": "/root", "SLOW": "1"}
    inherited = fingerprint(spec, rig="r", label="m", model="x", build="b", environ=env,
                            plugin_env=("SLOWER_",))[1]["env"]
    assert inherited == {"HF_HUB_OFFLINE": "1", "PYTHONPATH": "/lab", "SLOWER_GPU": "0.05"}


def test_a_kept_server_is_reused_on_its_fingerprint_and_replaced_on_another(fake, tmp_path, folder, reaper):
    rig, lines = _rig(tmp_path), []

    def server_for(spec):
        return kept_or_started(spec, rig=rig, mode_label="ngram", progress=lines.append,
                               before_start=None, folder=folder)

    first = server_for(_spec(fake, tmp_path))
    assert isinstance(first, KeptVLLMServer)
    with first:
        pid, url = first.process.pid, first.base_url
        reaper.append(psutil.Process(pid))
    # the session is over: the server runs on, recorded with its fingerprint
    [kept] = load_all(folder)
    assert kept.pid == pid and kept.alive() and kept.healthy() and kept.base_url == url
    assert psutil.Process(pid).is_running()

    second = server_for(_spec(fake, tmp_path))
    assert isinstance(second, ReusedServer) and second.base_url == url
    assert second.spec is not None and second.spec.argv == _spec(fake, tmp_path).argv  # an alternation reads it
    with second:
        second.check_alive()
    assert "nothing starts" in lines[-1] and psutil.Process(pid).is_running()

    third = server_for(_spec(fake, tmp_path, env={"FAKE_MARK": "another"}))
    assert isinstance(third, KeptVLLMServer)  # never the old one
    assert _wait_gone(pid), "the kept server of another configuration was not stopped"
    assert "its configuration differs (env)" in lines[-1]
    assert load_all(folder) == []  # its record went with it; the new one is recorded once started


def test_a_reused_server_stopped_by_a_failed_swap_is_stopped_for_good(fake, tmp_path, folder, reaper):
    # an alternation whose swap failed stops every server (specgate.serve.sleep): a reused kept one too,
    # or it would hold GPU memory half asleep
    rig = _rig(tmp_path)

    def server_for(spec):
        return kept_or_started(spec, rig=rig, mode_label="ngram", progress=lambda line: None,
                               before_start=None, folder=folder)

    with server_for(_spec(fake, tmp_path)) as first:
        pid = first.process.pid
        reaper.append(psutil.Process(pid))
    reused = server_for(_spec(fake, tmp_path))
    assert isinstance(reused, ReusedServer)
    reused.stop()
    assert _wait_gone(pid) and load_all(folder) == []


def test_a_dead_kept_server_is_not_reused_and_its_record_is_dropped(fake, tmp_path, folder, reaper):
    rig = _rig(tmp_path)
    spec = _spec(fake, tmp_path)
    with kept_or_started(spec, rig=rig, mode_label="ngram", progress=lambda line: None,
                         before_start=None, folder=folder) as server:
        pid = server.process.pid
    [kept] = load_all(folder)
    os.killpg(kept.pgid, signal.SIGKILL)  # the server and its engine-core child
    assert _wait_gone(pid)
    assert registry.find(kept.fingerprint, folder) is None and load_all(folder) == []


def test_a_kept_server_that_runs_but_does_not_answer_is_stopped_not_left_beside_a_new_one(fake, tmp_path, folder,
                                                                                          reaper):
    rig, lines = _rig(tmp_path), []

    def server_for():
        return kept_or_started(_spec(fake, tmp_path), rig=rig, mode_label="ngram",
                               progress=lines.append, before_start=None, folder=folder)

    with server_for() as first:
        pid = first.process.pid
        reaper.append(psutil.Process(pid))
    [kept] = load_all(folder)
    kept.served_model_name = "not-what-it-serves"  # its /v1/models no longer lists the recorded name
    registry.write(kept, folder)
    again = server_for()
    assert isinstance(again, KeptVLLMServer) and _wait_gone(pid)
    assert "it runs but did not answer /health and /v1/models" in lines[-1] and load_all(folder) == []


def test_the_servers_command_lists_and_stops_kept_servers(fake, tmp_path, folder, reaper):
    rig, out = _rig(tmp_path), []
    with kept_or_started(_spec(fake, tmp_path), rig=rig, mode_label="ngram",
                         progress=lambda line: None, before_start=None, folder=folder) as server:
        pid = server.process.pid
    assert registry.servers_command(names=[], stop_all=False, folder=folder, out=out.append) == 0
    assert "  running  " in out[0] and "mode ngram" in out[0]
    name = load_all(folder)[0].name
    assert registry.servers_command(names=["nope"], stop_all=False, folder=folder, out=out.append) == 1
    assert registry.servers_command(names=[name], stop_all=False, folder=folder, out=out.append) == 0
    assert out[-1] == f"{name}: stopped" and _wait_gone(pid) and load_all(folder) == []


def test_an_attached_server_is_never_recorded_or_stopped(fake, tmp_path, folder, reaper):
    from specgate.plugin.fixtures import serve
    from specgate.plugin.resolve import SessionOptions
    from specgate.plugin.session import SpecgateSession

    with VLLMServer(_spec(fake, tmp_path, label="theirs")) as theirs:
        session = SpecgateSession(SessionOptions(
            rig_name="cpu-smollm2", fixtures_dir=ROOT / "fixtures", baselines_path=tmp_path / "b.json",
            run_dir=tmp_path / "run", repo_root=ROOT, attach_url=theirs.base_url, keep_servers=True))
        serving = serve(session, session.settings.rig.mode("no_spec"))
        attached = next(serving)
        assert isinstance(attached, AttachedServer)
        with contextlib.suppress(StopIteration):
            next(serving)
        assert not folder.exists() or load_all(folder) == []
        assert theirs.process.poll() is None  # untouched


def test_the_vllm_build_is_read_from_the_server_command_s_python(tmp_path, monkeypatch):
    script = tmp_path / "bin" / "vllm"
    script.parent.mkdir()
    script.write_text(f"#!{sys.executable}\nimport sys\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}:{os.environ['PATH']}")
    assert registry.server_python("vllm") == sys.executable  # a console script: its interpreter
    assert registry.server_python("/usr/bin/python3") == "/usr/bin/python3"
    assert registry.server_python("no-such-command") == sys.executable


def test_a_kept_server_a_session_may_not_reuse_is_stopped_and_started_again(fake, tmp_path, folder, reaper):
    # an alternation's kept server that sleeps at a level this session does not know
    rig, lines = _rig(tmp_path), []
    with kept_or_started(_spec(fake, tmp_path), rig=rig, mode_label="ngram",
                         progress=lines.append, before_start=None, folder=folder) as server:
        pid = server.process.pid
    again = kept_or_started(_spec(fake, tmp_path), rig=rig, mode_label="ngram",
                            progress=lines.append, before_start=None, folder=folder,
                            refuse=lambda kept: "it sleeps, at a level this session does not know")
    assert isinstance(again, KeptVLLMServer) and _wait_gone(pid)
    assert "not reusing the kept server" in lines[-1] and "it sleeps" in lines[-1]
    nobody = registry.KeptServer(name="x", rig="r", label="m", fingerprint="f", pid=1, pgid=1, create_time=0.0,
                                 host="127.0.0.1", port=9, served_model_name="m", log="l")
    assert registry.awake_or_why(nobody, timeout_s=1.0).startswith("it did not say whether it sleeps")


def test_an_alternation_s_server_left_asleep_at_sleep_level_1_is_reused_asleep(fake, tmp_path, folder, reaper):
    """Every mode of an alternation stays loaded between sessions: a kept server the last session
    left asleep at sleep level 1 is reused and taken as asleep (woken for its turn); one asleep at sleep level
    2, or at a sleep level its record does not hold, is stopped and started again."""
    import asyncio

    import httpx

    from specgate.serve.sleep import SleepController

    rig, lines = _rig(tmp_path), []

    def server_for():
        return kept_or_started(_spec(fake, tmp_path), rig=rig, mode_label="ngram",
                               progress=lines.append, before_start=None, folder=folder,
                               refuse=registry.awake_or_why)

    turns = SleepController(SimpleNamespace(sleep_host_memory_gib=1.0, sleep_level=None, gpus_per_server=1,
                                            model=rig.model), available_gib=lambda: 100.0, gpu_free=lambda g: None)
    with server_for() as first:
        reaper.append(psutil.Process(first.process.pid))
        turns.add(first)
        asyncio.run(turns.make_room())  # the session ends with it asleep, at level 1
    [kept] = load_all(folder)
    assert kept.sleep_level == 1 and httpx.get(f"{kept.base_url}/is_sleeping").json() == {"is_sleeping": True}

    second = server_for()
    assert isinstance(second, ReusedServer) and second.asleep_at() == 1
    later = SleepController(turns.rig, available_gib=lambda: 100.0, gpu_free=lambda g: None)
    later.add(second, asleep_at=second.asleep_at())
    assert later.awake is None
    assert asyncio.run(later.activate(second))["level"] == 1  # woken for its turn, as level 1
    assert load_all(folder)[0].sleep_level is None and second.asleep_at() is None

    asyncio.run(later.make_room())
    registry.note_sleep(load_all(folder)[0], 2, folder)  # as if it had slept at level 2
    third = server_for()
    assert isinstance(third, KeptVLLMServer) and "it sleeps at sleep level 2 (its weights were dropped)" in lines[-1]
