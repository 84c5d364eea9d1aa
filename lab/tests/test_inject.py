"""The slowdown injector (specgate_lab.inject) against a stand-in engine: inert by default, the
fraction of each step's own duration, re-read from its file, and declared as a vLLM plugin."""

import tomllib
from pathlib import Path

import pytest

from specgate_lab import inject

pytestmark = pytest.mark.fast


class StandInEngine:
    def __init__(self, executed=True):
        self.executed = executed

    def step(self):
        return {}, self.executed

    def step_with_batch_queue(self):
        return None, self.executed


@pytest.fixture
def clock(monkeypatch):
    """perf_counter advancing 20 ms per call; every wait requested is recorded."""
    now = {"t": 0.0}
    waits = []

    def perf_counter():
        now["t"] += 0.020
        return now["t"]

    monkeypatch.setattr(inject.time, "perf_counter", perf_counter)
    monkeypatch.setattr(inject, "wait", lambda seconds: waits.append(seconds))
    return waits


def test_each_step_waits_its_fraction_of_its_own_duration(clock):
    engine_cls = type("Engine", (StandInEngine,), {})
    assert inject.patch(engine_cls, inject.Slowdown(0.10)) == ["step", "step_with_batch_queue"]
    assert inject.patch(engine_cls, inject.Slowdown(0.10)) == []  # once only
    engine_cls().step()
    engine_cls().step_with_batch_queue()
    assert clock == [pytest.approx(0.002), pytest.approx(0.002)]  # 10 % of the 20 ms step


def test_a_step_that_ran_no_model_is_not_slowed(clock):
    engine_cls = type("Engine", (StandInEngine,), {})
    inject.patch(engine_cls, inject.Slowdown(0.5))
    engine_cls(executed=False).step()
    assert clock == []


def test_the_fraction_follows_its_file(tmp_path):
    path = tmp_path / "slowdown"
    ticks = iter(range(0, 1000, 1))
    slowdown = inject.Slowdown(path=str(path), clock=lambda: float(next(ticks)))
    assert slowdown.fraction() == 0.0  # no file yet: no slowdown
    path.write_text("0.2\n")
    assert slowdown.fraction() == 0.2
    path.write_text("oops")
    import os
    os.utime(path, (1, 1))
    assert slowdown.fraction() == 0.2  # a bad value keeps the last good one (and says so on stderr)


def test_inert_unless_asked(monkeypatch):
    monkeypatch.delenv(inject.ENV_FRACTION, raising=False)
    monkeypatch.delenv(inject.ENV_FILE, raising=False)
    assert inject.Slowdown.from_environ() is None
    inject.register()  # returns before importing vLLM (not installed in the fast tier)


@pytest.mark.parametrize("bad", ["-0.1", "9", "ten"])
def test_a_bad_fraction_names_its_source(bad):
    with pytest.raises(ValueError, match="SPECGATE_SLOWDOWN"):
        inject.Slowdown.from_environ({inject.ENV_FRACTION: bad})


def test_wait_spins_the_last_part_precisely():
    slept, now = [], {"t": 0.0}

    def clock():
        now["t"] += 0.00005
        return now["t"]

    inject.wait(0.001, sleep=lambda s: (slept.append(s), now.__setitem__("t", now["t"] + s)), clock=clock)
    assert slept == [pytest.approx(0.001 - inject.SPIN_S)]
    assert now["t"] >= 0.001


def test_declared_as_a_vllm_general_plugin_and_its_variables_as_server_env():
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    entry_points = project["project"]["entry-points"]
    assert entry_points["vllm.general_plugins"]["specgate_slowdown"] == "specgate_lab.inject:register"
    assert entry_points["specgate.server_env"]["specgate_slowdown"] == "specgate_lab.inject:ENV_PREFIXES"
    # every variable the injector reads is covered by a prefix the fingerprint keeps
    assert all(name.startswith(inject.ENV_PREFIXES)
               for name in (inject.ENV_FRACTION, inject.ENV_FILE, inject.ENV_GPU_FRACTION, inject.ENV_GPU_FILE))


def fake_vllm_engine(monkeypatch):
    """A stand-in ``vllm.v1.engine.core`` module (vLLM is not installed here) holding a fresh engine class."""
    import sys
    import types

    engine_cls = type("EngineCore", (StandInEngine,), {})
    for name in ("vllm", "vllm.v1", "vllm.v1.engine", "vllm.v1.engine.core"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    sys.modules["vllm.v1.engine.core"].EngineCore = engine_cls
    return engine_cls


def test_a_fixed_fraction_of_zero_installs_no_hook(monkeypatch, capsys):
    """SPECGATE_SLOWDOWN=0 (no file): the engine's step methods stay vLLM's own, so an A/A that gives
    this variable to both sides (.ci/teeth.py) runs the same code on both. A file, even at 0, and any
    fraction above 0 still wrap them, and only those print the "slowed by" line .ci/teeth.py looks for."""
    for name in (inject.ENV_FRACTION, inject.ENV_FILE, inject.ENV_GPU_FRACTION, inject.ENV_GPU_FILE):
        monkeypatch.delenv(name, raising=False)
    assert inject.Slowdown(0.0).inert and inject.Slowdown(None).inert
    assert not inject.Slowdown(0.0, "/x").inert and not inject.Slowdown(0.1).inert

    engine_cls = fake_vllm_engine(monkeypatch)
    plain = dict(vars(engine_cls))
    for value in ("0", "0.0"):
        monkeypatch.setenv(inject.ENV_FRACTION, value)
        inject.register()
        assert dict(vars(engine_cls)) == plain  # nothing wrapped
    err = capsys.readouterr().err
    assert "SPECGATE_SLOWDOWN=0: no hook installed" in err and "slowed by" not in err

    monkeypatch.setenv(inject.ENV_FRACTION, "0.10")
    inject.register()
    assert hasattr(engine_cls.step, "__specgate_slowdown__")
    assert hasattr(engine_cls.step_with_batch_queue, "__specgate_slowdown__")
    assert "[specgate_lab.inject]" in (err := capsys.readouterr().err) and "slowed by 0.1" in err

    followed = fake_vllm_engine(monkeypatch)
    monkeypatch.setenv(inject.ENV_FRACTION, "0")
    monkeypatch.setenv(inject.ENV_FILE, "/nonexistent/slowdown")  # a file can change: it is followed from 0
    inject.register()
    assert hasattr(followed.step, "__specgate_slowdown__")


def test_a_gpu_fraction_of_zero_installs_no_hook(monkeypatch, capsys):
    import sys

    for name in (inject.ENV_FRACTION, inject.ENV_FILE, inject.ENV_GPU_FILE):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(inject.ENV_GPU_FRACTION, "0")
    before = list(sys.meta_path)
    inject.register()
    assert sys.meta_path == before  # no patch-on-import finder, no runner imported
    assert "SPECGATE_GPU_SLOWDOWN=0: no hook installed" in capsys.readouterr().err
