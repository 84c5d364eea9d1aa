"""Issue 51: a stored history is one machine's and one build's. Stand-in machine ids and builds go
through the store's own code (specgate.store.baselines.place_start, merge_updates, gating_history), and the
level gate's false-alarm rate and power with the prediction interval alone are simulated with the
gate's own code (specgate.decide.gates.check_throughput)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
from standins import gate_settings, level_window
from words import said

from specgate.config.rig import load_rig
from specgate.decide.gates import check_throughput
from specgate.decide.history import StartHistory, change_points
from specgate.decide.outcome import Outcome
from specgate.measure.protocol import ClassMeasurement
from specgate.plan.histories import steps_words as history_steps
from specgate.report.history_view import whose_history
from specgate.store.baselines import (
    BaselineEntry,
    Build,
    Fingerprint,
    StoredStart,
    gating_history,
    histories,
    load_baselines,
    lookup,
    merge_updates,
    place_start,
)

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent
KEY = ("rig-a", "no_spec", "coding", 1)
OLD, NEW = "0.26.0", "0.27.0"


def _start(level: float, machine: str | None, vllm: str = OLD) -> BaselineEntry:
    """One start's entry as a storing run writes it (specgate.decide.entry.baseline_entry's shape)."""
    fingerprint = Fingerprint(accelerator="H200", accelerator_count=1, vllm_version=vllm, machine=machine,
                              date="2026-12-04", commit="abc1234")
    return BaselineEntry(decode_tokens_per_s=[level] * 3, median=level, mad=0.0, n=3, fingerprint=fingerprint,
                         starts=[StoredStart(level=level, machine=machine, build=Build.of(fingerprint),
                                             suite_commit="abc1234", date="2026-12-04")])


def _store(path: Path, levels: list[float], machine: str | None, *, vllm: str = OLD, update: bool = False
           ) -> list[str]:
    said = []
    for level in levels:
        _, what = merge_updates(path, {KEY: _start(level, machine, vllm)}, new_history=update)
        said.append(what[KEY])
    return said


def test_build_history_on_a_second_machine_starts_its_own_history(tmp_path):
    # the case: machine A's 4 starts at ~117.6, then build-history on B (1.7 % faster) appended
    # to them (6 starts, spread 0.96 %); here B's starts make B's own history and A's stays as it was
    path = tmp_path / "baselines.json"
    _store(path, [117.57, 117.60, 117.58, 117.59], "GPU-a")
    assert "no history of rig rig-a on this machine (GPU-b)" in whose_history(load_baselines(path), "rig-a", "GPU-b")
    said = _store(path, [119.6, 119.8], "GPU-b")
    assert said[0].startswith("a new history for GPU-b (no history of this machine was stored; 1 of other")
    assert said[1].startswith("start 2 of GPU-b's history")
    store = load_baselines(path)
    a, b = (lookup(store, *KEY, machine=m) for m in ("GPU-a", "GPU-b"))
    assert a.level_history == [117.57, 117.60, 117.58, 117.59] and {s.machine for s in a.starts} == {"GPU-a"}
    assert b.level_history == [119.6, 119.8] and {s.machine for s in b.starts} == {"GPU-b"}
    assert StartHistory(tuple(a.level_history)).log_sd < 0.0002  # A's spread untouched by B's levels
    assert lookup(store, *KEY, machine="GPU-c") is None  # a third machine has none: never another's


def test_an_update_after_a_change_starts_a_new_history_and_the_old_one_stops_gating(tmp_path):
    # the simulation: 10 starts of the old build, then one of a new build 5 % faster; a 3 %
    # regression of the new build must not be judged against the old build's history
    path = tmp_path / "baselines.json"
    _store(path, [100.0 + 0.01 * i for i in range(10)], "GPU-a")
    said = _store(path, [105.0], "GPU-a", vllm=NEW, update=True)
    assert "--specgate-update-baselines: a deliberate change accepted" in said[0]
    assert "its previous one (10 start(s)) is kept, superseded, and no longer gates" in said[0]
    found = histories(load_baselines(path), *KEY)
    assert [len(h.starts) for h in found] == [10, 1]
    assert found[0].superseded and found[0].superseded.startswith("by the history started ")
    current = gating_history(found, "GPU-a")
    assert current is found[1] and current.level_history == [105.0]
    assert not StartHistory(tuple(current.level_history)).usable  # one start: no history decides yet


def test_a_start_of_another_build_never_extends_the_history(tmp_path):
    path = tmp_path / "baselines.json"
    _store(path, [100.0, 100.1, 100.2], "GPU-a")
    said = _store(path, [103.0], "GPU-a", vllm=NEW)  # build-history after an upgrade: regen, not update
    assert "the build changed: vLLM 0.26.0, config" in said[0] and "-> vLLM 0.27.0" in said[0]
    found = histories(load_baselines(path), *KEY)
    assert [h.level_history for h in found] == [[100.0, 100.1, 100.2], [103.0]]
    assert {h.build.vllm_version for h in found} == {OLD, NEW}


def test_a_history_refuses_starts_of_two_machines():
    a, b = _start(100.0, "GPU-a"), _start(101.0, "GPU-b")
    with pytest.raises(ValueError, match="starts of several machines or builds in one history"):
        BaselineEntry.model_validate({**a.model_dump(), "starts": [*a.model_dump()["starts"],
                                                                   *b.model_dump()["starts"]]})


def test_a_history_of_an_unknown_machine_never_gates_and_is_never_appended_to():
    found: list[BaselineEntry] = []
    for level in (100.0, 100.1, 100.2):
        found, said = place_start(found, _start(level, None), new_history=False, when="2026-12-04")
    assert "never gates" in said
    assert [len(h.starts) for h in found] == [1, 1, 1]
    assert gating_history(found, None) is None and gating_history(found, "GPU-a") is None


def test_a_schema_1_file_is_read_as_one_history_per_window(tmp_path):
    path = tmp_path / "baselines.json"
    path.write_text(json.dumps({"schema_version": 1, "rigs": {"rig-a": {"no_spec": {"coding": {"1": {
        "decode_tokens_per_s": [30.0, 31.0], "median": 30.5, "mad": 0.5, "n": 2, "level_history": [30.1, 30.5],
        "host_canary_us": [25.0], "fingerprint": {"accelerator": "cpu", "vllm_version": "0.32.0",
                                                  "date": "2026-12-01", "commit": "c6b2a5d"}}}}}}}))
    entry = lookup(load_baselines(path), *KEY)
    assert [(s.level, s.canary_us, s.date) for s in entry.starts] == [(30.1, None, None), (30.5, 25.0, "2026-12-01")]
    assert entry.machine is None  # stored before machines were recorded: it never gates


def test_the_committed_lab_history_names_no_machine_so_it_never_gates():
    store = load_baselines(ROOT / "baselines.json")
    entry = lookup(store, "h200-wide15b-history", "no_spec", "coding", 1)
    assert len(entry.starts) == 10 and entry.machine is None
    assert lookup(store, "h200-wide15b-history", "no_spec", "coding", 1, machine="GPU-any") is None


def test_change_points_find_the_step_of_a_carried_history():
    # the mixed history: 10 starts at ~119.8 then 3 at ~117.6 (another lease's machine)
    levels = [119.65, 119.85, 119.7, 119.8, 119.75, 119.78, 119.72, 119.8, 119.69, 119.83, 117.6, 117.58, 117.62]
    assert change_points(levels) == [10]
    assert "a step (at start 11 119.8 -> 117.6 tok/s (-1.8 %))" in history_steps(levels)
    assert change_points(levels[:10]) == []


# -- the level gate's error rates with the prediction interval alone (simulated, the gate's own code)
def _fail_rate(rig, true_ratio: float, *, starts: int, sd: float, runs: int, seed: int) -> float:
    rng = random.Random(seed)
    failed = 0
    for _ in range(runs):
        levels = [100.0 * math.exp(rng.gauss(0, sd)) for _ in range(starts)]
        stored = BaselineEntry(decode_tokens_per_s=[levels[-1]], median=levels[-1], mad=0.0, n=1,
                               starts=[StoredStart(level=v) for v in levels])
        window = level_window(rig, 100.0 * true_ratio * math.exp(rng.gauss(0, sd)))
        result = check_throughput(gate_settings(rig, window), window, stored)
        failed += result.outcome is Outcome.FAIL
    return failed / runs


def test_the_level_gate_fails_2_5_percent_at_its_threshold_and_catches_a_slowdown_beyond_it(monkeypatch):
    # The gate's words on steps in the stored levels (a change-point search in every call, four fifths
    # of this simulation's time) go into its message only: the outcomes counted here do not read them.
    import specgate.decide.gates

    monkeypatch.setattr(specgate.decide.gates, "_steps", lambda baseline: None)
    rig = load_rig("h200-wide15b-history", ROOT / "fixtures")
    threshold = 1 - rig.gates.throughput_tolerance  # the rig sets no level_tolerance of its own
    sd, starts = 0.005, 10  # 0.5 % start-to-start spread, a 10-start history
    at_threshold = _fail_rate(rig, threshold, starts=starts, sd=sd, runs=1200, seed=1)
    # exact under normal levels: t(n-1) x s x sqrt(1 + 1/n) is the 95 % prediction interval, one side 2.5 %
    assert 0.012 <= at_threshold <= 0.038, at_threshold  # 2.5 % within ~3 binomial SEs at 1,200 runs
    assert _fail_rate(rig, 1.0, starts=starts, sd=sd, runs=300, seed=2) == 0.0  # A/A: never red
    # power: a slowdown of the tolerance plus four spreads is caught nearly always
    assert _fail_rate(rig, threshold * math.exp(-4 * sd), starts=starts, sd=sd, runs=300, seed=3) >= 0.9


def test_the_history_command_shows_the_committed_lab_history(tmp_path, capsys):
    from specgate.cli import main

    assert main(["history", "--rig", "h200-wide15b-history", f"--out={tmp_path}"]) == 0
    out = capsys.readouterr().out
    assert "no_spec / coding / concurrency 1: unknown machine, vLLM 0.26.0" in out and "never gates" in out
    assert out.count("\n     ") >= 9  # a row per stored start (the table's rows)
    assert "10 stored starts, start-to-start spread 0.05 %" in out and "catches a true level ratio <= 0.968" in out
    png = tmp_path / "history-h200-wide15b-history.png"
    assert f"plot: {png}" in out and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_history_command_shows_a_one_start_history():
    """A window's history of one start (the committed cpu-smollm2 figures) is shown, not a crash: its
    spread needs two starts, and its sittings are said without one."""
    from specgate.report.history_view import history_text

    text = history_text(load_baselines(ROOT / "baselines.json"), load_rig("cpu-smollm2", ROOT / "fixtures"))
    assert "1 start(s), " in text and "the level gate uses a history from 3 on" in text


def test_the_history_command_refuses_an_unknown_rig_and_a_missing_file(tmp_path, capsys):
    from specgate.cli import main

    assert main(["history", "--rig", "no-such-rig", f"--out={tmp_path}"]) == 4
    assert main(["history", "--rig", "h200-wide15b-history", f"--baselines={tmp_path / 'none.json'}"]) == 4
    assert "none.json: no such baselines file" in capsys.readouterr().err


def test_a_backfire_across_two_starts_allows_for_both_modes_stored_spread():
    # Windows one after the other (one server at a time: the Kimi plan at 512 GiB): each mode's start
    # lands as far off as its stored history spreads on this machine, and the gate allows for both.
    import dataclasses
    import gzip

    from specgate.decide.gates import check_backfire, stored_start_histories

    rig = load_rig("cpu-smollm2", ROOT / "fixtures")
    report = json.loads(gzip.decompress((ROOT / "fixtures/recorded/cpu/reports/run2-plain.json.gz").read_bytes()))
    windows = {m["mode"]: ClassMeasurement.from_dict(m) for m in report["measurements"]
               if m["prompt_class"] == "coding"}
    ngram, no_spec = (dataclasses.replace(windows[mode], partner=None) for mode in ("ngram", "no_spec"))
    store = load_baselines(ROOT / "baselines.json").model_copy(deep=True)
    for mode, levels in (("ngram", [20.0, 20.4, 19.8, 20.2]), ("no_spec", [30.0, 30.3, 29.8])):
        store.rigs["cpu-smollm2"][mode]["coding"]["1"] = [_start(v, "GPU-a") for v in levels[:1]]
        for v in levels[1:]:
            found, _ = place_start(store.rigs["cpu-smollm2"][mode]["coding"]["1"], _start(v, "GPU-a"),
                                   new_history=False, when="2026-12-04")
            store.rigs["cpu-smollm2"][mode]["coding"]["1"] = found
    starts = stored_start_histories(store, gate_settings(rig, ngram), ngram, "GPU-a")
    assert starts is not None and [h.starts for h in starts] == [4, 3]
    # another machine's: the rig's noise
    assert stored_start_histories(store, gate_settings(rig, ngram), ngram, "GPU-b") is None
    plain = check_backfire(gate_settings(rig, ngram), ngram, no_spec)
    allowed = check_backfire(gate_settings(rig, ngram), ngram, no_spec, starts)
    assert allowed.details["ratio"] == pytest.approx(plain.details["ratio"])
    assert "the two starts' offsets from this machine's stored histories (4 and 3 starts" in said(allowed)
    assert "start noise 10 % added" in said(plain)
    assert allowed.details["ci_high"] - allowed.details["ci_low"] < plain.details["ci_high"] - plain.details["ci_low"]


def test_the_arrangement_option_runs_the_rig_one_server_at_a_time_as_the_plan_says(tmp_path):
    # the Kimi plan at 512 GiB picks one server at a time; one flag runs it, the rig's file and its
    # stored figures unchanged
    from specgate.plugin.resolve import SessionOptions
    from specgate.plugin.session import SpecgateSession

    def session(arrangement):
        return SpecgateSession(SessionOptions(
            rig_name="kimi-k25-int4-8x-rtx6000", fixtures_dir=ROOT / "fixtures", baselines_path=tmp_path / "b.json",
            run_dir=tmp_path / "run", repo_root=ROOT, arrangement=arrangement))

    assert session(None).settings.rig.arrangement.name == "alternation"
    chosen = session("sequential").settings.rig
    assert chosen.arrangement.name == "sequential" and chosen.path == session(None).settings.rig.path
