"""specgate.serve.host_memory: one host-memory rule for sleep mode, the level each server gets, and the
refusal of a server that cannot wake from level 2, before anything starts (plan and session)."""

import os
import re
from pathlib import Path

import pytest

from specgate.cli import main
from specgate.config.rig import AB, Side, load_rig
from specgate.durations import format_elapsed
from specgate.plan.estimate import (
    SESSION_OVERHEAD_S,
    STOP_S,
    WINDOW_OVERHEAD_S,
    Conditions,
    arrangements,
    choose_arrangement,
    paths,
    plan_session,
    stored_rates,
)
from specgate.serve.host_memory import (
    HOST_MARGIN,
    HOST_RESERVE_GIB,
    PIN_GIB_PER_S,
    Sleeper,
    choose_levels,
    sleep_level_1_need_gib,
)
from specgate.store.baselines import load_baselines

pytestmark = pytest.mark.fast
pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent
KIMI = "kimi-k25-int4-8x-rtx6000"
WEIGHTS = 560.0  # the Kimi rig's sleep_host_memory_gib


def _kimi(ab: bool = False):
    rig = load_rig(KIMI, ROOT / "fixtures")
    if ab:
        rig = rig.model_copy(update={"ab": AB(candidate=Side(python="/venvs/next/bin/python"))})
    windows = [(m, c.name, 1) for m in ("ngram", "no_spec") for c in rig.prompt_classes]
    return rig, windows, stored_rates(load_baselines(ROOT / "baselines.json"), KIMI)


def test_the_rule_is_the_weights_of_every_server_asleep_at_once_with_margin_and_reserve():
    assert sleep_level_1_need_gib([WEIGHTS, WEIGHTS]) == pytest.approx(HOST_MARGIN * 2 * WEIGHTS + HOST_RESERVE_GIB)
    assert sleep_level_1_need_gib([]) == 0.0


@pytest.mark.parametrize(("host_gib", "levels", "short"), [
    (512, {"no_spec": 2, "ngram": 2}, "728 GiB short"),  # 1,240 needed: neither fits, both level 2
    (1536, {"no_spec": 1, "ngram": 1}, None),  # 1.5 TB holds both
])
def test_the_kimi_plain_run_at_512_gib_and_1_5_tb(host_gib, levels, short):
    rig, windows, rates = _kimi()
    plan = plan_session(rig, windows, rates, Conditions(host_gib=host_gib))
    assert dict(plan.sleep_levels) == levels
    line = plan.host_lines[0]
    assert "needs 1,240 GiB" in line and f"{host_gib:,} GiB available" in line
    assert (short in line) if short else ("short" not in line)
    if short:
        assert "0 of 2 sleep at sleep level 1 (one alone needs 624 GiB)" in line
    if 2 in levels.values():
        # a level-2 wake reads the 560 GiB again at the rig's 0.31 GiB/s: ~30 min, and turns grow to
        # a whole pass per side (the fewest swaps) instead of one request
        assert plan.sleep_level_2_wake_s == pytest.approx(WEIGHTS / 0.31)
        assert "wake ~30m" in plan.host_lines[1]
        at_sleep_level_1 = plan_session(rig, windows, rates, Conditions(host_gib=1536))
        assert plan.window(("ngram", "coding", 1)).swaps < at_sleep_level_1.window(("ngram", "coding", 1)).swaps
    assert plan.refusal is None  # n-gram and no speculation can wake from level 2


def test_an_ab_keeps_its_reference_at_sleep_level_1_first_and_the_paths_stand_side_by_side():
    rig, windows, rates = _kimi(ab=True)
    every = plan_session(rig, windows, rates, Conditions(host_gib=1536, keep_servers=True))
    levels = dict(every.sleep_levels)
    # four servers loaded at once (--specgate-keep-servers) need 2,472 GiB; 1.5 TB holds two: the
    # reference side's, which a later session reuses
    assert levels == {"ngram@candidate": 2, "ngram@reference": 1, "no_spec@candidate": 2, "no_spec@reference": 1}
    lines = paths(rig, windows, rates, host_gib=1536)
    plain, ab, kept = lines[1:]
    assert plain.startswith("  plain run, stored figures, taking turns: 2 start(s)")
    assert "catches nothing useful until 3+" in plain
    assert ab.startswith("  A/B, fresh reference, one mode at a time (the cheapest A/B): 4 start(s)")
    assert "sleep level 1 for 4, sleep level 2 for 0" in ab
    assert kept.startswith("  A/B, reference kept, one candidate at a time: 2 start(s), reference kept (2 server(s), "
                           "0 starts)")
    # two kept references and one candidate loaded at once need 1,856 GiB: the candidates sleep at level 2
    assert "sleep level 2 for 2" in kept and "(1,856 GiB for sleep level 1 of the 3 loaded at once)" in kept
    assert "with 1,856 GiB available every server sleeps at sleep level 1: about 3h02m" in kept
    # at 512 GiB the reference would sleep at level 2 and start again: no kept path there
    assert "not on this host" in paths(rig, windows, rates, host_gib=512)[3]


def test_the_kept_reference_ab_loads_one_candidate_at_a_time_and_is_the_cheapest_where_the_host_holds_three():
    """Issue 62, build item 7: the kept references stay asleep and each candidate loads for its own mode's
    windows only (not every server loaded, which took 8h45m with two candidates at sleep level 2)."""
    rig, windows, rates = _kimi(ab=True)
    kept = plan_session(rig, windows, rates, Conditions(host_gib=2048, reused=["no_spec@reference", "ngram@reference"],
                                                        keep_servers=False))
    assert kept.loaded_at_once == 3 and set(dict(kept.sleep_levels).values()) == {1}
    assert [s.label for s in kept.servers if not s.reused] == ["ngram@candidate", "no_spec@candidate"]
    assert kept.expected_s <= 3.5 * 3600  # the candidates' two loads (30 and 90 min), first sleeps and windows
    lines = paths(rig, windows, rates, host_gib=2048)
    assert lines[3].startswith("  A/B, reference kept, one candidate at a time (the cheapest A/B): 2 start(s)")
    assert f"about {format_elapsed(kept.expected_s)}" in lines[3] and "sleep level 2 for 0" in lines[3]


def test_a_drafter_that_would_need_level_2_is_refused_naming_the_memory_that_allows_it():
    sleepers = [Sleeper("no_spec", WEIGHTS), Sleeper("eagle3", WEIGHTS, "a drafter's weights would not come back")]
    at_512 = choose_levels(sleepers, 512)
    assert at_512.refused == ("eagle3",)
    message = at_512.refusal(sleepers)
    assert "eagle3 cannot sleep at sleep level 2" in message and "takes 624 GiB" in message
    assert "512 GiB available" in message
    at_700 = choose_levels(sleepers, 700)  # the drafter first at level 1, no_spec at level 2
    assert at_700.levels == {"no_spec": 2, "eagle3": 1} and at_700.refusal(sleepers) is None


def test_one_mode_at_a_time_each_server_gets_sleep_level_1_beside_those_loaded_with_it():
    # three modes: the reference stays loaded, each mode's server stops after its windows
    sleepers = [Sleeper("no_spec", WEIGHTS), Sleeper("ngram", WEIGHTS), Sleeper("eagle3", WEIGHTS, "a drafter")]
    at_once = [["no_spec", "ngram"], ["no_spec", "eagle3"]]
    choice = choose_levels(sleepers, 700, at_once=at_once)
    # the drafter first beside the reference (then at level 2); ngram is never loaded beside the drafter
    assert choice.levels == {"no_spec": 2, "ngram": 1, "eagle3": 1} and choice.refused == ()
    assert choice.need_all_gib == sleep_level_1_need_gib([WEIGHTS, WEIGHTS]) and choice.at_once == 2
    assert sorted(choose_levels(sleepers, 700).levels.values()) == [1, 2, 2]  # all three at once


def _request_s(rig, rate: float, prompt_class: str) -> float:
    """A request at ``rate``, with the rig's time to a first token for the class's prompts (plan's rule)."""
    prompts = next(c for c in rig.prompt_classes if c.name == prompt_class).prompts
    return rig.protocol.max_tokens / rate + rig.estimate.first_token_s * sum(len(p.text) for p in prompts) / len(
        prompts) / 500


def test_the_kimi_plain_run_at_512_gib_runs_one_server_at_a_time_in_its_two_loads_and_its_windows(monkeypatch, capsys):
    rig, windows, rates = _kimi()
    turns, one_by_one = options = arrangements(rig, windows, rates, conditions=Conditions(host_gib=512))
    # taking turns would sleep both at sleep level 2 (each wake reads 560 GiB again): listed, not chosen
    assert choose_arrangement(options) is one_by_one and set(dict(turns.plan.sleep_levels).values()) == {2}
    plan = one_by_one.plan
    assert plan.arrangement == "sequential" and plan.sleep_levels == () and plan.first_sleeps_s == 0
    assert [s.label for s in plan.servers] == ["no_spec", "ngram"]  # the reference first
    # its two loads, eight windows of one server, each server's warm-up on its first class
    loads = rig.estimate.startup_for(False) + rig.estimate.startup_for(True) + 2 * STOP_S
    windows_s = sum(18 * _request_s(rig, rates[key], key[1]) + WINDOW_OVERHEAD_S for key in windows)
    warmup_s = sum(2 * _request_s(rig, rates[(mode, "coding", 1)], "coding") for mode in ("no_spec", "ngram"))
    assert rig.protocol.repeats * 6 == 18 and rig.protocol.warmup_requests == 2  # 6 prompts a class
    assert plan.expected_s == pytest.approx(loads + windows_s + warmup_s + SESSION_OVERHEAD_S)
    assert turns.plan.expected_s > plan.expected_s + 5 * 3600  # the level-2 wakes: hours

    monkeypatch.chdir(ROOT)
    assert main(["plan", "--rig", KIMI, "--host-memory-gib", "512"]) == 0
    out = capsys.readouterr().out
    session, _, rest = out.partition("\narrangements")
    assert f"rig {KIMI} (sequential): 2 server(s), 8 window(s)" in session
    assert f"about {format_elapsed(plan.expected_s)}" in session and "sleep level 2" not in session
    assert "one after the other (chosen): 2 start(s), 8 window(s)" in rest
    assert f"taking turns: 2 start(s), 4 window(s), 12 swap(s), about {format_elapsed(turns.plan.expected_s)}" in rest
    assert ("to run the chosen one: pytest -m gpu --specgate-rig=kimi-k25-int4-8x-rtx6000 "
            "--specgate-arrangement=sequential"
            in rest)


def _candidate_python(folder: Path) -> str:
    """A candidate python that passes the session's `import vllm` check."""
    python = folder / "python"
    python.write_text("#!/bin/sh\nexit 0\n")
    python.chmod(0o755)
    return str(python)


def test_the_kimi_ab_at_1_5_tb_takes_turns_one_mode_at_a_time_every_server_at_sleep_level_1(tmp_path, monkeypatch,
                                                                                           capsys):
    rig, windows, rates = _kimi(ab=True)
    options = arrangements(rig, windows, rates, conditions=Conditions(host_gib=1536))
    chosen = choose_arrangement(options)
    (every,) = [o for o in options if o is not chosen]
    assert chosen.name == "taking turns, one mode at a time"
    assert dict(chosen.plan.sleep_levels) == {f"{mode}@{side}": 1 for mode in ("ngram", "no_spec")
                                              for side in ("candidate", "reference")}
    # one mode's two sides need 1,240 GiB of the 1,536; all four at once would need 2,472
    assert chosen.plan.loaded_at_once == 2
    assert chosen.plan.sleep_level_1_need_gib == sleep_level_1_need_gib([WEIGHTS] * 2)
    assert set(every.at_sleep_level_2) == {"ngram@candidate", "no_spec@candidate"}
    assert chosen.plan.first_sleeps_s == pytest.approx(4 * WEIGHTS / PIN_GIB_PER_S)

    monkeypatch.chdir(ROOT)
    assert main(["plan", "--rig", KIMI, "--host-memory-gib", "1536",
                 f"--specgate-ab-candidate-python={_candidate_python(tmp_path)}"]) == 0
    out = capsys.readouterr().out
    session, _, rest = out.partition("\narrangements")
    assert "sleep level 1 for the 2 server(s) loaded at once" in session and "sleep level 2" not in session
    assert f"about {format_elapsed(chosen.plan.expected_s)}" in session
    assert "taking turns, one mode at a time (chosen): 4 start(s), 8 window(s)" in rest
    assert "every server at sleep level 1" in rest
    # and the selection's chance of a red A/A (issue 62, specgate.decide.red_runs)
    assert "\nRED A/A: at most " in rest and "of runs go red with nothing changed" in rest


def test_the_seeds_ab_keeps_its_ngram_reference_at_1_5_tb_every_server_at_sleep_level_1(tmp_path, monkeypatch,
                                                                                       capsys):
    # issue 62: one mode per session, its reference kept asleep and one candidate loaded: 2 copies on the host
    monkeypatch.chdir(ROOT)
    assert main(["plan", "--rig", KIMI, "--host-memory-gib", "1536", "--specgate-keep-servers", "-k", "ngram",
                 f"--specgate-ab-candidate-python={_candidate_python(tmp_path)}"]) == 0
    (kept,) = [line for line in capsys.readouterr().out.splitlines() if "A/B, reference kept" in line]
    assert "(the cheapest A/B): 1 start(s), reference kept (1 server(s), 0 starts)" in kept
    assert "sleep level 1 for 2, sleep level 2 for 0" in kept
    hours, minutes = map(int, re.search(r"about (\d+)h(\d+)m", kept).groups())
    assert hours * 60 + minutes <= 3 * 60 + 30, kept


EAGLE_MODE = """
[modes.eagle3]
speculative_config = { model = "/models/kimi-k2.5-eagle3", num_speculative_tokens = 3 }
"""


def _kimi_with_eagle(tmp_path: Path, server_command: str | None = None) -> Path:
    text = (ROOT / "fixtures" / "rigs" / f"{KIMI}.toml").read_text()
    if server_command is not None:
        text = text.replace('server_command = ["${python}", "-m", "vllm.entrypoints.cli.main", "serve"]',
                            f'server_command = ["{server_command}"]')
    fixtures = tmp_path / "fixtures"
    (fixtures / "rigs").mkdir(parents=True)
    for name in ("modes.toml", "prompts.toml"):
        (fixtures / name).write_text((ROOT / "fixtures" / name).read_text())
    (fixtures / "rigs" / "kimi-eagle.toml").write_text(text + EAGLE_MODE)
    return fixtures


@pytest.mark.parametrize(("is_ab", "refused"), [(False, "eagle3 cannot"),
                                                (True, "eagle3@candidate, eagle3@reference cannot")])
def test_the_plan_exits_4_when_it_refuses_a_mode(tmp_path, monkeypatch, capsys, is_ab, refused):
    # 512 GiB cannot hold the drafter's weights at sleep level 1, and it cannot wake from sleep level 2
    fixtures = _kimi_with_eagle(tmp_path)
    ab = [f"--specgate-ab-candidate-python={_candidate_python(tmp_path)}"] if is_ab else []
    rig = ["--rig", str(fixtures / "rigs" / "kimi-eagle.toml"), f"--specgate-fixtures={fixtures}"]
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("SPECGATE_HOST_MEMORY_GIB", raising=False)
    code = main(["plan", *rig, "--host-memory-gib", "512", *ab])
    err = capsys.readouterr().err
    assert code == 4, err
    assert f"{refused} sleep at sleep level 2" in err and "checked before any server starts" in err
    assert "SPECGATE_HOST_MEMORY_GIB" not in os.environ  # the stand-in for the planned host is put back
    # a host that holds the drafter and the server loaded with it: nothing refused
    assert main(["plan", *rig, "--host-memory-gib", "1536", *ab, "-k", "eagle3"]) == 0


def test_the_session_refuses_a_drafter_mode_before_any_server_starts(perf_project, tmp_path, monkeypatch):
    # the Kimi rig with an EAGLE-3 mode, planned for a host of 512 GiB (SPECGATE_HOST_MEMORY_GIB): its
    # server would need level 2; the session must stop at collection, and the "server" (a script that
    # leaves a mark when started) must never run. A whole pytest run of the perf tests, in-process.
    mark = tmp_path / "started"
    server = tmp_path / "server.sh"
    server.write_text(f"#!/bin/sh\ntouch {mark}\nsleep 60\n")
    server.chmod(0o755)
    fixtures = _kimi_with_eagle(tmp_path, str(server))
    monkeypatch.setenv("SPECGATE_HOST_MEMORY_GIB", "512")
    run = perf_project.runpytest_inprocess("-m", "gpu", "--specgate-rig=kimi-eagle", f"--specgate-fixtures={fixtures}",
                                           f"--specgate-run-dir={tmp_path / 'run'}", "-p", "no:cacheprovider",
                                           "-k", "coding")
    out = run.stdout.str() + run.stderr.str()
    assert run.ret == 4, out
    assert "eagle3 cannot sleep at sleep level 2" in out and "checked before any server starts" in out
    assert "kimi-eagle.toml" in out
    assert not mark.exists()


def test_a_level_stored_on_another_host_of_the_same_kind_is_another_machine():
    from specgate.store.baselines import OTHER_MACHINE, SAME, Fingerprint, comparability

    here = Fingerprint(accelerator="NVIDIA H200", accelerator_count=1, machine="GPU-aaaa")
    assert comparability(here, here.model_copy()).kind == SAME
    other = comparability(here, here.model_copy(update={"machine": "GPU-bbbb"}))
    assert other.kind == OTHER_MACHINE and "machine: stored 'GPU-aaaa', now 'GPU-bbbb'" in other.differences[0]
    # an entry stored before the key existed is not another machine (unknown is no difference)
    assert comparability(here.model_copy(update={"machine": None}), here).kind == SAME
