"""specgate.host_memory: one host-memory rule for sleep mode, the level each server gets, and the
refusal of a server that cannot wake from level 2, before anything starts (plan and session)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from specgate.baselines import load_baselines
from specgate.config import AB, Side, load_rig
from specgate.host_memory import HOST_MARGIN, HOST_RESERVE_GIB, Sleeper, choose_levels, level1_need_gib
from specgate.plan import paths, plan_session, stored_rates

pytestmark = pytest.mark.fast

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
    assert level1_need_gib([WEIGHTS, WEIGHTS]) == pytest.approx(HOST_MARGIN * 2 * WEIGHTS + HOST_RESERVE_GIB)
    assert level1_need_gib([]) == 0.0


@pytest.mark.parametrize(("host_gib", "levels", "short"), [
    (512, {"no_spec": 2, "ngram": 2}, "728 GiB short"),  # 1,240 needed: neither fits, both level 2
    (1536, {"no_spec": 1, "ngram": 1}, None),  # 1.5 TB holds both
])
def test_the_kimi_plain_run_at_512_gib_and_1_5_tb(host_gib, levels, short):
    rig, windows, rates = _kimi()
    plan = plan_session(rig, windows, rates, host_gib=host_gib)
    assert dict(plan.sleep_levels) == levels
    line = plan.host_lines[0]
    assert "needs 1,240 GiB" in line and f"{host_gib:,} GiB available" in line
    assert (short in line) if short else ("short" not in line)
    if short:
        assert "0 of 2 fit at level 1 (one alone needs 624 GiB)" in line
    if 2 in levels.values():
        # a level-2 wake reads the 560 GiB again at the rig's 0.31 GiB/s: ~30 min, and turns grow to
        # a whole pass per side (the fewest swaps) instead of one request
        assert plan.level2_wake_s == pytest.approx(WEIGHTS / 0.31)
        assert "wake ~30m" in plan.host_lines[1]
        level1 = plan_session(rig, windows, rates, host_gib=1536)
        assert plan.window(("ngram", "coding", 1)).swaps < level1.window(("ngram", "coding", 1)).swaps
    assert plan.refusal is None  # n-gram and no speculation can wake from level 2


def test_an_ab_keeps_its_reference_at_level_1_first_and_the_paths_stand_side_by_side():
    rig, windows, rates = _kimi(ab=True)
    fresh = plan_session(rig, windows, rates, host_gib=1536)
    levels = dict(fresh.sleep_levels)
    # four servers need 2,472 GiB; 1.5 TB holds two: the reference side's, which a later session reuses
    assert levels == {"ngram@candidate": 2, "ngram@reference": 1, "no_spec@candidate": 2, "no_spec@reference": 1}
    lines = paths(rig, windows, rates, host_gib=1536)
    plain, ab, kept = lines[1:]
    assert plain.startswith("  plain run, stored figures: 2 start(s)") and "catches nothing useful until 3+" in plain
    assert ab.startswith("  A/B, fresh reference: 4 start(s)")
    assert kept.startswith("  A/B, reference kept: 2 start(s), reference kept (2 server(s), 0 starts)")
    # at 512 GiB the reference would sleep at level 2 and start again: no kept path there
    assert "not on this host" in paths(rig, windows, rates, host_gib=512)[3]


def test_a_drafter_that_would_need_level_2_is_refused_naming_the_memory_that_allows_it():
    sleepers = [Sleeper("no_spec", WEIGHTS), Sleeper("eagle3", WEIGHTS, "a drafter's weights would not come back")]
    at_512 = choose_levels(sleepers, 512)
    assert at_512.refused == ("eagle3",)
    message = at_512.refusal(sleepers)
    assert "eagle3 cannot sleep at level 2" in message and "takes 624 GiB" in message and "512 GiB available" in message
    at_700 = choose_levels(sleepers, 700)  # the drafter first at level 1, no_spec at level 2
    assert at_700.levels == {"no_spec": 2, "eagle3": 1} and at_700.refusal(sleepers) is None


EAGLE_MODE = """
[modes.eagle3]
speculative_config = { model = "/models/kimi-k2.5-eagle3", num_speculative_tokens = 3 }
"""


def test_the_session_refuses_a_drafter_mode_before_any_server_starts(tmp_path):
    # the Kimi rig with an EAGLE-3 mode, planned for a host of 512 GiB (SPECGATE_HOST_MEMORY_GIB): its
    # server would need level 2; the session must stop at collection, and the "server" (a script that
    # leaves a mark when started) must never run
    mark = tmp_path / "started"
    server = tmp_path / "server.sh"
    server.write_text(f"#!/bin/sh\ntouch {mark}\nsleep 60\n")
    server.chmod(0o755)
    text = (ROOT / "fixtures" / "rigs" / f"{KIMI}.toml").read_text()
    text = text.replace('server_command = ["${python}", "-m", "vllm.entrypoints.cli.main", "serve"]',
                        f'server_command = ["{server}"]') + EAGLE_MODE
    fixtures = tmp_path / "fixtures"
    (fixtures / "rigs").mkdir(parents=True)
    for name in ("modes.toml", "prompts.toml"):
        (fixtures / name).write_text((ROOT / "fixtures" / name).read_text())
    (fixtures / "rigs" / "kimi-eagle.toml").write_text(text)
    env = {**os.environ, "SPECGATE_HOST_MEMORY_GIB": "512"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "--specgate-rig=kimi-eagle",
                          f"--specgate-fixtures={fixtures}", f"--specgate-run-dir={tmp_path / 'run'}",
                          "-p", "no:cacheprovider", "-k", "coding", str(ROOT / "perf_tests")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    out = run.stdout + run.stderr
    assert run.returncode == 4, out
    assert "eagle3 cannot sleep at level 2" in out and "checked before any server starts" in out
    assert "kimi-eagle.toml" in out
    assert not mark.exists()


def test_a_level_stored_on_another_host_of_the_same_kind_is_another_machine():
    from specgate.baselines import OTHER_MACHINE, SAME, Fingerprint, comparability

    here = Fingerprint(accelerator="NVIDIA H200", accelerator_count=1, machine="GPU-aaaa")
    assert comparability(here, here.model_copy()).kind == SAME
    other = comparability(here, here.model_copy(update={"machine": "GPU-bbbb"}))
    assert other.kind == OTHER_MACHINE and "machine: stored 'GPU-aaaa', now 'GPU-bbbb'" in other.differences[0]
    # an entry stored before the key existed is not another machine (unknown is no difference)
    assert comparability(here.model_copy(update={"machine": None}), here).kind == SAME
