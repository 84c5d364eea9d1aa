"""Servers taking turns on the same GPUs (arrangement "alternation", specgate.serve.sleep): the plan by block,
the automatic arrangement choice, the sleep level, swaps checked and timed outside every request's
timing, a failed swap's message, and the arrangement named in the verdicts. Stand-in servers replay
recorded vLLM responses and implement /sleep, /wake_up, /is_sleeping and /collective_rpc."""

import asyncio
import itertools
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from standins import StandInServer, gate_settings
from words import said

from specgate.config.arrangement import arrangement_of, drafter_in, gpu_memory_utilization, loads_drafter
from specgate.config.rig import AB, Side, check_sleep_level, load_rig
from specgate.decide.gates import check_backfire
from specgate.errors import ConfigError, ServerStartError
from specgate.measure.duet import alternation_block, plan, swaps_in
from specgate.measure.protocol import Duet, Measurer
from specgate.serve.server import ServerSpec, spec_for_mode
from specgate.serve.sleep import SleepController, SleepError, choose_level, weights_gib_from_log, with_sleep_mode

pytestmark = pytest.mark.fast
pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent


class SleepyStandIn(StandInServer):
    """A recorded vLLM server of ``mode`` with sleep mode: refuses generations while asleep;
    every request, sleep and wake goes into the shared ``journal``."""

    def __init__(self, mode: str, journal: list, *, asleep_after_wake: bool = False, stays_awake: bool = False,
                 argv: tuple[str, ...] = ()):
        super().__init__(mode, journal)
        self.sleeping = False
        self.asleep_after_wake, self.stays_awake = asleep_after_wake, stays_awake
        self.spec = ServerSpec(label=mode, argv=argv, served_model_name="m", log_path=Path("/nonexistent"))
        self.stopped = False

    async def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/is_sleeping":
            return httpx.Response(200, json={"is_sleeping": self.sleeping})
        if path == "/sleep":
            self.journal.append(("sleep", self.label, request.url.params.get("level")))
            self.sleeping = not self.stays_awake
            return httpx.Response(200)
        if path == "/wake_up":
            self.journal.append(("wake", self.label, request.url.params.get("tags")))
            self.sleeping = self.asleep_after_wake
            return httpx.Response(200)
        if path == "/collective_rpc":
            self.journal.append(("rpc", self.label, json.loads(request.content)["method"]))
            return httpx.Response(200, json={"results": [None]})
        assert path == "/metrics" or not self.sleeping, f"{self.label} got a generation while asleep"
        return await super().handle(request)

    def log_tail(self, lines=20):
        return f"INFO {self.label}: the last line of its log"

    def stop(self):
        self.stopped = True


@pytest.fixture(scope="module")
def rig():
    rig = load_rig("cpu-smollm2", ROOT / "fixtures")
    return rig.model_copy(update={
        "protocol": rig.protocol.model_copy(update={"warmup_requests": 1, "settle_s": 0.0, "repeats": 2}),
        "gates": rig.gates.model_copy(update={"client_server_tolerance": None}),
        "arrangement_key": "alternation", "sleep_host_memory_gib": 10.0})


def controller(rig, **kwargs):
    kwargs.setdefault("available_gib", lambda: 100.0)
    kwargs.setdefault("gpu_free", lambda gpus: None)
    return SleepController(rig, **kwargs)


def started(sleeper, *servers):
    """Start ``servers`` as the fixtures do: the awake one sleeps before the next starts."""
    for server in servers:
        asyncio.run(sleeper.make_room())
        sleeper.add(server)


# -- the plan ------------------------------------------------------------------------------------
def test_blocks_alternate_abba_by_block_and_swap_once_per_pair_of_turns():
    keys = list(range(12))
    steps = plan(keys, keys, concurrency=1, seed=0, block=4)
    assert [len(t.items) for t in steps] == [4] * 6
    assert [t.group for t in steps] == [0, 0, 1, 1, 2, 2]
    sides = [t.side for t in steps]
    assert sides[0] != sides[1] and sides[1] == sides[2] and sides[3] == sides[4]  # ABBAAB
    assert swaps_in(steps) == 3
    # each group's two turns carry the same keys: a pair per key
    assert all(steps[2 * g].items == steps[2 * g + 1].items for g in range(3))
    assert {plan(keys, keys, concurrency=1, seed=s, block=4)[0].side for s in range(20)} == {"subject", "partner"}
    # an alternation starts with the side that is awake, whatever the seed
    for side in ("subject", "partner"):
        assert {plan(keys, keys, concurrency=1, seed=s, block=4, first=side)[0].side for s in range(20)} == {side}
    with pytest.raises(ValueError, match="first must be one of"):
        plan(keys, keys, concurrency=1, seed=0, first="reference")


def test_a_block_is_a_multiple_of_the_concurrency():
    with pytest.raises(ValueError, match="multiple of the concurrency"):
        plan(list(range(8)), list(range(8)), concurrency=4, seed=0, block=6)
    steps = plan(list(range(16)), list(range(16)), concurrency=4, seed=0, block=8)
    assert [len(t.items) for t in steps] == [8] * 4


def test_the_default_block_keeps_swaps_a_small_share_of_the_window():
    # the lab: a 128-token request 1.1 s, a swap 1.6 s: 7 keys per turn -> 1.6 / (2 * 7 * 1.1 + 1.6) = 9.4 %
    block = alternation_block(request_s=1.1, swap_s=1.6, concurrency=1, keys=40)
    assert block == 7 and 1.6 / (2 * block * 1.1 + 1.6) <= 0.10
    assert alternation_block(request_s=1.1, swap_s=1.6, concurrency=4, keys=40) % 4 == 0
    assert alternation_block(request_s=0.01, swap_s=1.6, concurrency=1, keys=5) == 5  # capped at the round
    assert alternation_block(request_s=100, swap_s=1.6, concurrency=2, keys=40) == 2
    # turns of equal size: the H200 window of 6 prompts needing ~5 per turn is one turn of 6, not 5 + 1
    # (a turn of one request would pay a whole swap), and 12 keys needing 5 are two turns of 6
    assert alternation_block(request_s=1.45, swap_s=1.6, concurrency=1, keys=6) == 6
    assert alternation_block(request_s=1.45, swap_s=1.6, concurrency=1, keys=12) == 6
    assert alternation_block(request_s=1.1, swap_s=1.6, concurrency=1, keys=16) == 8
    assert alternation_block(request_s=1.1, swap_s=0.0, concurrency=2, keys=6) == 2  # free swaps: the smallest turn
    # a block's groups are as equal as whole rounds allow: 7 keys in blocks of 3 are 2 + 2 + 3, not 3 + 3 + 1
    def turn_sizes(keys, **kwargs):
        return [len(t.items) for t in plan(list(range(keys)), list(range(keys)), seed=0, **kwargs)][::2]

    assert turn_sizes(7, concurrency=1, block=3) == [2, 2, 3]
    assert turn_sizes(10, concurrency=2, block=4) == [2, 4, 4]


# -- the arrangement -------------------------------------------------------------------------------
def test_auto_picks_duet_when_two_fit_and_alternation_when_they_do_not():
    wide = load_rig("h200-wide15b-dummy", ROOT / "fixtures")
    auto = wide.model_copy(update={"arrangement_key": "auto"})
    assert arrangement_of(auto).name == "duet" and "0.4 fit" in arrangement_of(auto).reason
    alternate = load_rig("h200-wide15b-alternate", ROOT / "fixtures")
    choice = alternate.arrangement
    assert choice.name == "alternation" and "0.6 do not fit" in choice.reason and "1.20 > 0.95" in choice.reason
    assert alternate.comparing == "duet"  # the reference is kept for the session; its servers take turns
    cpu = load_rig("cpu-smollm2-concurrency", ROOT / "fixtures")
    assert cpu.arrangement.name == "duet" and "VLLM_CPU_KVCACHE_SPACE" in cpu.arrangement.reason
    assert load_rig("h200-wide15b-dummy", ROOT / "fixtures").arrangement.name == "duet"  # duet = true still works
    assert load_rig("h200x2-smollm2-pp2", ROOT / "fixtures").comparing == "sequential"


def test_the_typical_swap_counts_only_swaps_between_two_servers(rig):
    # a server's first sleep copies its weights, a sleep before a start wakes nobody, and a wake with
    # nobody to put to sleep is half a swap: none of them is what a swap between turns costs
    sleeper = SleepController(rig)
    sleeper.swaps = [
        {"from": "a", "to": None, "sleep_s": 16.0, "wake_s": 0.0, "first_sleep": True, "before_start": True},
        {"from": None, "to": "b", "sleep_s": 0.0, "wake_s": 0.9, "first_sleep": False},
        {"from": "b", "to": "a", "sleep_s": 0.7, "wake_s": 0.9, "first_sleep": False},
        {"from": "a", "to": "b", "sleep_s": 0.7, "wake_s": 1.1, "first_sleep": False},
    ]
    assert sleeper.typical_swap_s() == pytest.approx(1.7)


def fixtures_with_rig(tmp_path, name: str, text: str) -> Path:
    """A fixtures folder (the project's modes and prompts) holding the rig ``name`` written as ``text``;
    returns the folder, for load_rig."""
    fixtures = tmp_path / "fixtures"
    (fixtures / "rigs").mkdir(parents=True, exist_ok=True)
    for file in ("modes.toml", "prompts.toml"):
        (fixtures / file).write_text((ROOT / "fixtures" / file).read_text())
    (fixtures / "rigs" / f"{name}.toml").write_text(text)
    return fixtures


def project_rig(name: str) -> str:
    return (ROOT / "fixtures" / "rigs" / f"{name}.toml").read_text()


def test_a_cpu_rig_cannot_alternate_and_the_arrangement_must_agree_with_duet(tmp_path):
    cpu = project_rig("cpu-smollm2")
    # the key, and its older spelling
    for name, key in (("alt", 'arrangement = "alternation"'), ("older", 'design = "alternate"')):
        fixtures = fixtures_with_rig(tmp_path, name, cpu.replace("duet = true", key))
        with pytest.raises(ConfigError, match="no sleep mode"):
            load_rig(name, fixtures)
    fixtures_with_rig(tmp_path, "twice", cpu.replace("duet = true", 'arrangement = "duet"\ndesign = "duet"'))
    with pytest.raises(ConfigError, match="older spelling of arrangement"):
        load_rig("twice", fixtures)
    fixtures_with_rig(tmp_path, "both", cpu.replace("duet = true", 'duet = true\ndesign = "sequential"'))
    with pytest.raises(ConfigError, match="contradicts duet = true"):
        load_rig("both", fixtures)


def test_the_kimi_rig_alternates_and_takes_an_ab_sides_python():
    kimi = load_rig("kimi-k25-int4-8x-rtx6000", ROOT / "fixtures")
    assert kimi.arrangement.name == "alternation" and kimi.sleep_host_memory_gib
    assert kimi.argv_prefix[0] == sys.executable
    spec = spec_for_mode(kimi, kimi.mode("ngram"), log_dir=Path("/tmp"), side=Side(python="/opt/next/bin/python"),
                         side_name="candidate")
    assert spec.argv[:4] == ["/opt/next/bin/python", "-m", "vllm.entrypoints.cli.main", "serve"]
    sleepy = with_sleep_mode(spec)
    assert "--enable-sleep-mode" in sleepy.argv and sleepy.env["VLLM_SERVER_DEV_MODE"] == "1"
    assert gpu_memory_utilization(sleepy.argv) == 0.92


# -- the level -------------------------------------------------------------------------------------
def test_sleep_level_1_when_the_host_holds_the_weights_else_sleep_level_2():
    assert choose_level(28.9, 200.0)[0] == 1
    level, why = choose_level(600.0, 300.0)
    assert level == 2 and "600.0 GiB" in why and "300 GiB available" in why
    assert choose_level(600.0, 300.0, forced=1)[0] == 1
    assert choose_level(None, 10.0)[0] == 1
    log = "(Worker_TP0) INFO Model loading took 70.1 GiB memory\n(Worker_TP1) INFO Model loading took 70.3 GiB memory\n"
    assert weights_gib_from_log(log, 8) == pytest.approx(70.3 * 8)


def test_a_wake_at_sleep_level_2_reloads_the_weights_between_its_two_wakes(rig):
    journal = []
    a, b = SleepyStandIn("no_spec", journal), SleepyStandIn("ngram", journal)
    sleeper = controller(rig, available_gib=lambda: 4.0)  # 10 GiB of weights do not fit
    started(sleeper, a, b)
    asyncio.run(sleeper.activate(a))
    assert [e for e in journal if e[1] == "no_spec"] == [
        ("sleep", "no_spec", "2"), ("wake", "no_spec", "weights"), ("rpc", "no_spec", "reload_weights"),
        ("wake", "no_spec", "kv_cache")]
    assert sleeper.swaps[-1]["level"] == 2


def test_sleep_level_2_is_refused_for_dummy_weights(rig):
    # vLLM 0.26 cannot reload --load-format dummy weights, and woken without them the H200's server generated no
    # text (docs/journal/lab/2026-12-03-h200-same-lease.md): no decode rate, so no gate could decide
    journal = []
    a = SleepyStandIn("no_spec", journal, argv=("--load-format", "dummy"))
    sleeper = controller(rig, available_gib=lambda: 4.0)
    started(sleeper, a)
    with pytest.raises(SleepError, match="weights are dummy") as failed:
        asyncio.run(sleeper.make_room())
    assert "generates no text" in str(failed.value) and "level 1 would keep" in str(failed.value)
    assert not [e for e in journal if e[0] == "sleep"] and a.stopped


LEVEL_TWO_RIG = """
description = "two servers at 0.6 of one GPU, level 2 forced"
tier = "gpu"
model = "/models/m"
server_command = ["vllm", "serve"]
extra_args = ["--gpu-memory-utilization", "0.6"{rig_args}]
arrangement = "alternation"
sleep_level = 2
classes = ["coding"]
[modes.no_spec]
[modes.ngram]
extra_args = [{mode_args}]
{more}
"""


@pytest.mark.parametrize(("rig_args", "mode_args", "more", "where"), [
    (', "--load-format", "dummy"', "", "", "(extra_args sets them; mode no_spec)"),
    ("", '"--load-format=dummy"', "", "(modes.ngram.extra_args sets them; mode ngram)"),
    (', "--load-format", "dummy"', '"--load-format", "auto"', "", "(extra_args sets them; mode no_spec)"),
    ("", "", '[ab.candidate]\nextra_args = ["--load-format", "dummy"]', "(ab.candidate.extra_args sets them"),
    ("", "", "[modes.eagle3]\nspeculative_config = { model = \"/models/head\" }", "mode eagle3 has one"),
])
def test_a_rig_forcing_sleep_level_2_on_servers_that_cannot_wake_from_it_is_refused_when_it_loads(
        tmp_path, rig_args, mode_args, more, where):
    text = LEVEL_TWO_RIG.format(rig_args=rig_args, mode_args=mode_args, more=more)
    fixtures = fixtures_with_rig(tmp_path, "l2", text)
    with pytest.raises(ConfigError, match="sleep_level") as refused:
        load_rig("l2", fixtures)
    assert where in str(refused.value) and "set sleep_level = 1" in str(refused.value)


def test_sleep_level_2_is_allowed_for_ngram_and_refused_for_the_command_lines_sides_that_cannot_wake(tmp_path):
    # n-gram speculation loads no weights of its own: level 2 brings back all it has (the seed's Kimi case)
    fixtures = fixtures_with_rig(tmp_path, "l2", LEVEL_TWO_RIG.format(rig_args="", mode_args="", more=""))
    rig = load_rig("l2", fixtures)
    assert rig.sleep_level == 2 and not loads_drafter(rig.mode("ngram").speculative_config)
    ab_from = " (the --specgate-ab-* options)"
    dummy = AB(candidate=Side(extra_args=("--load-format", "dummy")))
    with pytest.raises(ConfigError, match=r"ab.candidate.extra_args sets them; mode no_spec, the A/B's candidate side "
                                          r"\(the --specgate-ab-\* options\)"):
        check_sleep_level(rig.model_copy(update={"ab": dummy}), ab_from=ab_from)
    # a side's speculative keys can turn n-gram into a method with a drafter
    eagle = AB(candidate=Side(speculative={"method": "eagle3", "model": "/models/head"}))
    with pytest.raises(ConfigError, match=r"mode ngram, the A/B's candidate side \(the --specgate-ab-\* options\) has"):
        check_sleep_level(rig.model_copy(update={"ab": eagle}), ab_from=ab_from)


@pytest.mark.parametrize(("config", "drafter"), [
    ({"method": "ngram"}, False), ({"method": "suffix"}, False), ({"method": "eagle3"}, True),
    ({"method": "mtp"}, True), ({"method": "deepseek_mtp"}, True), ({"model": "/draft"}, True), (None, False)])
def test_only_prompt_lookup_speculation_loads_no_drafter(config, drafter):
    assert loads_drafter(config) is drafter
    argv = ["serve"] + (["--speculative-config", json.dumps(config)] if config is not None else [])
    assert drafter_in(argv) is drafter
    assert drafter_in(["--speculative-config", "{not json"])  # unreadable: the safe side


def test_sleep_level_2_names_the_kept_servers_that_hold_host_memory(rig, monkeypatch):
    # on the H200 (docs/alternation.md) three kept 15.5 B servers asleep at level 1 held 91 GiB of the host's 123,
    # so a new server of the rig slept at level 2; the message says which kept servers to stop
    from specgate.serve import registry
    mine = SimpleNamespace(name="mine", pid=11, sleep_level=1, alive=lambda: True)
    elsewhere = SimpleNamespace(name="h200__draft1l_al10_async__ab12", pid=12, sleep_level=1, alive=lambda: True)
    gone = SimpleNamespace(name="gone", pid=13, sleep_level=1, alive=lambda: False)
    monkeypatch.setattr(registry, "load_all", lambda folder=None: [mine, elsewhere, gone])
    journal, lines = [], []
    a, b = SleepyStandIn("no_spec", journal), SleepyStandIn("ngram", journal)
    a.kept = mine
    sleeper = controller(rig, available_gib=lambda: 4.0, progress=lines.append,
                       kept_asleep=registry.asleep_at_sleep_level_1)
    started(sleeper, a, b)
    [level_line] = [line for line in lines if "sleeps at sleep level 2" in line]
    assert "h200__draft1l_al10_async__ab12" in level_line and "servers --stop NAME" in level_line
    assert "mine" not in level_line.split("kept servers")[1] and "gone" not in level_line


def test_an_ngram_server_sleeps_at_sleep_level_2_when_the_host_is_short_and_a_forced_sleep_level_names_the_rig(rig):
    journal = []
    ngram = SleepyStandIn("ngram", journal, argv=("--speculative-config", '{"method": "ngram"}'))
    sleeper = controller(rig, available_gib=lambda: 4.0)  # 10 GiB of weights do not fit
    started(sleeper, ngram)
    asyncio.run(sleeper.make_room())
    assert ("sleep", "ngram", "2") in journal
    # a level the rig forces: the message says to change the rig, not to free host memory
    # the recorded n-gram stand-in with an EAGLE-3 server's argv (the argv is what the level reads)
    eagle = SleepyStandIn("ngram", journal, argv=("--speculative-config", '{"method": "eagle3"}'))
    sleeper = controller(rig.model_copy(update={"sleep_level": 2}))
    started(sleeper, eagle)
    with pytest.raises(SleepError) as failed:
        asyncio.run(sleeper.make_room())
    assert f"Set sleep_level = 1 or leave it unset in {rig.path}" in str(failed.value)
    assert "Free host memory" not in str(failed.value)


def test_sleep_level_2_is_refused_for_a_drafters_server(rig):
    journal = []
    a = SleepyStandIn("ngram", journal, argv=("--speculative-config", '{"method": "eagle3", "model": "/h"}'))
    sleeper = controller(rig, available_gib=lambda: 4.0)
    started(sleeper, a)
    with pytest.raises(SleepError, match="drafter's weights would not come back") as failed:
        asyncio.run(sleeper.make_room())
    assert "the last line of its log" in str(failed.value) and a.stopped


# -- swaps -----------------------------------------------------------------------------------------
def test_a_server_that_says_it_is_still_awake_fails_the_swap_with_its_log(rig):
    journal = []
    a, b = SleepyStandIn("no_spec", journal, stays_awake=True), SleepyStandIn("ngram", journal)
    sleeper = controller(rig)
    with pytest.raises(SleepError, match="GET /is_sleeping says it is awake") as failed:
        started(sleeper, a, b)
    assert "the last line of its log" in str(failed.value)


def test_memory_that_did_not_come_free_stops_the_wake(rig):
    journal = []
    argv = ("--gpu-memory-utilization", "0.6")
    a, b = SleepyStandIn("no_spec", journal, argv=argv), SleepyStandIn("ngram", journal, argv=argv)
    sleeper = controller(rig, gpu_free=lambda gpus: [("0", 0.38)])
    started(sleeper, a, b)
    with pytest.raises(SleepError, match="GPU 0 38 % free"):
        asyncio.run(sleeper.activate(a))
    assert not any(kind == "wake" for kind, *_ in journal)
    assert a.stopped and b.stopped  # both torn down
    with pytest.raises(SleepError, match="an earlier swap"):
        asyncio.run(sleeper.activate(b))


def test_a_kept_server_goes_to_sleep_when_its_last_turn_is_over(rig):
    """--specgate-keep-servers on an alternation of three servers: a mode's server that stays
    running after its last test sleeps before it leaves the turns, so the next mode's server starts
    on free GPUs; a server about to be stopped is not put to sleep first."""
    journal = []
    a, b, c = SleepyStandIn("no_spec", journal), SleepyStandIn("ngram", journal), SleepyStandIn("ngram", journal)
    sleeper = controller(rig)
    started(sleeper, a, b)
    asyncio.run(sleeper.leave(b, stays_running=True))
    assert b.sleeping and journal[-1] == ("sleep", "ngram", "1") and sleeper.awake is None
    started(sleeper, c)  # nothing awake to make room from
    assert [t.server for t in sleeper.sleepers] == [a, c] and sleeper.awake is c
    asyncio.run(sleeper.leave(c, stays_running=False))
    assert not c.sleeping and sleeper.awake is None
    assert [e for e in journal if e[0] == "sleep"] == [("sleep", "no_spec", "1"), ("sleep", "ngram", "1")]


def test_a_leaving_server_that_died_or_cannot_sleep_ends_only_its_own_turns(rig):
    """--specgate-keep-servers: a mode's server that died in its last test leaves quietly, and one
    that cannot go to sleep is stopped on its own; the alternation goes on for the others."""
    from specgate.errors import ServerDiedError

    journal = []
    reference, dead, stubborn = (SleepyStandIn("no_spec", journal), SleepyStandIn("ngram", journal),
                                 SleepyStandIn("ngram", journal, stays_awake=True))

    def died():
        raise ServerDiedError("vLLM server for mode ngram exited with code -9")

    dead.check_alive = died
    sleeper = controller(rig)
    started(sleeper, reference, dead)
    asyncio.run(sleeper.leave(dead, stays_running=True))
    assert sleeper.failure is None and [t.server for t in sleeper.sleepers] == [reference]
    started(sleeper, stubborn)
    with pytest.raises(SleepError, match=r"it was leaving the alternation.*it was stopped"):
        asyncio.run(sleeper.leave(stubborn, stays_running=True))
    assert stubborn.stopped and not reference.stopped and sleeper.failure is None
    assert asyncio.run(sleeper.activate(reference))["to"] == "no_spec"  # the reference takes its turn


def test_a_start_in_an_alternation_needs_only_its_own_share_of_the_gpu(rig):
    # servers asleep keep ~1 GiB each (2.6 GB of 143 GB with two kept ones on the H200): a start needs
    # its --gpu-memory-utilization free, not an empty GPU
    spec = ServerSpec(label="ngram", argv=("vllm", "--gpu-memory-utilization", "0.6"), served_model_name="m",
                      log_path=Path("/nonexistent"))
    controller(rig, gpu_free=lambda gpus: [("0", 0.98)]).require_room(spec)
    with pytest.raises(ServerStartError, match=r"refusing to start ngram: it needs 60 % .* GPU 0 41 % free"):
        controller(rig, gpu_free=lambda gpus: [("0", 0.41)]).require_room(spec)
    controller(rig, gpu_free=lambda gpus: None).require_room(spec)  # no NVML: nothing to check


# -- a window --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def window(rig):
    journal = []
    reference, ngram = SleepyStandIn("no_spec", journal), SleepyStandIn("ngram", journal)
    sleeper = controller(rig)
    started(sleeper, reference, ngram)
    coding = next(c for c in rig.prompt_classes if c.name == "coding")
    m = Measurer(rig).measure_duet(Duet(ngram, reference, rig.mode("ngram"), rig.mode("no_spec")), coding, 1,
                                   sleeper=sleeper)
    return m, journal, coding


def test_an_alternation_window_swaps_only_between_requests(window, rig):
    m, journal, coding = window
    awake = None
    in_flight = 0
    for kind, label, _ in journal:
        if kind == "start":
            assert label == awake or (awake is None and label == "ngram")
            in_flight += 1
        elif kind == "end":
            in_flight -= 1
        elif kind in ("sleep", "wake"):
            assert in_flight == 0  # never inside a request's timing
            awake = label if kind == "wake" else None
    assert m.arrangement == m.partner.arrangement == "alternation"
    info = m.extra["alternation"]
    assert info["block"] >= 1 and info["swaps"] and all(s["sleep_s"] >= 0 and s["wake_s"] >= 0 for s in info["swaps"])
    assert len(m.records) == len(m.partner.records) == rig.protocol.repeats * len(coding.prompts)
    assert m.sample_keys == m.partner.sample_keys


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_a_window_on_warm_servers_swaps_only_where_its_turns_change_sides(rig, seed):
    """Once both servers are warm, a window swaps only before a turn of the other side: it starts
    with the side that is awake, whatever its seed, and makes no swap to warm up a server that
    needs no warm-up (each swap is ~1.5 s on the H200)."""
    rig = rig.model_copy(update={"protocol": rig.protocol.model_copy(update={"seed": seed})})
    journal = []
    reference, ngram = SleepyStandIn("no_spec", journal), SleepyStandIn("ngram", journal)
    sleeper = controller(rig)
    started(sleeper, reference, ngram)
    coding = next(c for c in rig.prompt_classes if c.name == "coding")
    measurer = Measurer(rig)
    measure = lambda: measurer.measure_duet(Duet(ngram, reference, rig.mode("ngram"), rig.mode("no_spec")),  # noqa: E731
                                            coding, 1, sleeper=sleeper)
    measure()
    del journal[:]
    reference.metric_calls = ngram.metric_calls = 0  # the recorded counters again: a window of its own
    awake = sleeper.awake.label
    second = measure()
    sides = [label for kind, label, _ in journal if kind == "start"]
    changes = sum(a != b for a, b in itertools.pairwise(sides))
    wakes = sum(kind == "wake" for kind, _, _ in journal)
    assert sides[0] == awake and changes >= 1
    assert wakes == len(second.extra["alternation"]["swaps"]) == changes


def test_a_server_that_never_slept_takes_its_first_sleep_before_the_window(rig):
    # on the H200 a just-started server's first sleep (17.6 s) fell between two turns, 40 % of the
    # window's time, and that server's one turn before any sleep read 1.8 % under its turn after a wake
    # (docs/journal/lab/2026-12-03-h200-same-lease.md): every measured turn now follows a wake
    no_warm_up = rig.model_copy(update={"protocol": rig.protocol.model_copy(update={"warmup_requests": 0})})
    journal = []
    reference, ngram = SleepyStandIn("no_spec", journal), SleepyStandIn("ngram", journal)
    sleeper = controller(no_warm_up)
    started(sleeper, reference, ngram)  # no_spec asleep, ngram just started: awake, never slept
    coding = next(c for c in rig.prompt_classes if c.name == "coding")
    m = Measurer(no_warm_up).measure_duet(Duet(ngram, reference, rig.mode("ngram"), rig.mode("no_spec")), coding, 1,
                                          sleeper=sleeper)
    first_request = next(i for i, entry in enumerate(journal) if entry[0] == "start")
    assert ("sleep", "ngram", "1") in journal[:first_request]
    assert journal[first_request][1] == "no_spec"  # the window starts on the side the first sleep woke
    assert not any(s["first_sleep"] for s in m.extra["alternation"]["swaps"])
    assert any(s["first_sleep"] and s["from"] == "ngram" for s in sleeper.swaps)
    [before] = m.extra["alternation"]["before_window"]
    assert before["from"] == "ngram" and before["for"] == "the window's first turn"


def test_a_just_started_partner_warms_up_first_so_one_swap_wakes_the_subject_for_its_warm_up(rig):
    # the awake server warms up first: the partner's first sleep then wakes the subject for its own
    # warm-up, and the window needs no swap before it (the other order made two)
    journal = []
    reference, ngram = SleepyStandIn("no_spec", journal), SleepyStandIn("ngram", journal)
    sleeper = controller(rig)
    started(sleeper, ngram, reference)  # ngram asleep, no_spec just started: awake, never slept
    del journal[:]
    coding = next(c for c in rig.prompt_classes if c.name == "coding")
    m = Measurer(rig).measure_duet(Duet(ngram, reference, rig.mode("ngram"), rig.mode("no_spec")), coding, 1,
                                   sleeper=sleeper)
    starts = [i for i, entry in enumerate(journal) if entry[0] == "start"]
    assert [journal[i][1] for i in starts[:2]] == ["no_spec", "ngram"]  # the warm-ups, awake one first
    swaps_before = [e[:2] for e in journal[:starts[2]] if e[0] in ("sleep", "wake")]
    assert swaps_before == [("sleep", "no_spec"), ("wake", "ngram")]
    # that swap holds no_spec's first sleep: the report keeps it (on the H200 it is 17-24 s)
    [before] = m.extra["alternation"]["before_window"]
    assert before["from"] == "no_spec" and before["first_sleep"] and before["for"] == "ngram's warm-up"
    assert "a swap before it (no_spec's first sleep, " in said(check_backfire(gate_settings(rig, m), m, m.partner))


def test_a_server_outside_the_window_sleeps_before_it(rig):
    journal = []
    reference, ngram, outsider = (SleepyStandIn("no_spec", journal), SleepyStandIn("ngram", journal),
                                  SleepyStandIn("ngram", journal))
    outsider.label = "outsider"  # the recorded n-gram server, a third server of the alternation
    no_warm_up = rig.model_copy(update={"protocol": rig.protocol.model_copy(update={"warmup_requests": 0})})
    sleeper = controller(no_warm_up)
    started(sleeper, reference, ngram, outsider)
    coding = next(c for c in rig.prompt_classes if c.name == "coding")
    m = Measurer(no_warm_up).measure_duet(Duet(ngram, reference, rig.mode("ngram"), rig.mode("no_spec")), coding, 1,
                                          sleeper=sleeper)
    [before] = m.extra["alternation"]["before_window"]
    assert before["from"] == "outsider" and before["first_sleep"] and before["to"] == "no_spec"
    assert before["for"] == "the window's first turn"
    assert not any(s["first_sleep"] for s in m.extra["alternation"]["swaps"])
    result = check_backfire(gate_settings(no_warm_up, m), m, m.partner)
    assert "a swap before it (outsider's first sleep, " in said(result)


def test_an_alternation_window_makes_no_settle_pauses(rig, monkeypatch):
    # protocol.settle_s lets a duet's partner go idle before the other side's turn; in an alternation
    # the swap puts it to sleep, and the plan counts swaps only
    import specgate.measure.protocol as measure_mod

    settled, real_sleep = [], asyncio.sleep

    async def sleep(delay, *args, **kwargs):
        if delay == 3.0:
            settled.append(delay)
        return await real_sleep(0 if delay == 3.0 else delay, *args, **kwargs)

    monkeypatch.setattr(measure_mod.asyncio, "sleep", sleep)
    settling = rig.model_copy(update={"protocol": rig.protocol.model_copy(update={"settle_s": 3.0})})
    journal = []
    reference, ngram = SleepyStandIn("no_spec", journal), SleepyStandIn("ngram", journal)
    sleeper = controller(settling)
    started(sleeper, reference, ngram)
    coding = next(c for c in rig.prompt_classes if c.name == "coding")
    m = Measurer(settling).measure_duet(Duet(ngram, reference, rig.mode("ngram"), rig.mode("no_spec")), coding, 1,
                                        sleeper=sleeper)
    assert m.extra["alternation"]["swaps"] and settled == []


def test_the_backfire_verdict_names_the_alternation_and_why(window, rig):
    m, _, _ = window
    result = check_backfire(gate_settings(rig, m), m, m.partner)
    assert "alternation with no speculation" in result.details["compared"]
    assert "one server awake at a time" in said(result)
    assert "chosen: the rig asks for it (alternation)" in said(result)


def test_a_side_that_fails_to_wake_fails_the_window_with_its_log(rig):
    journal = []
    reference, ngram = SleepyStandIn("no_spec", journal, asleep_after_wake=True), SleepyStandIn("ngram", journal)
    sleeper = controller(rig)
    started(sleeper, reference, ngram)
    coding = next(c for c in rig.prompt_classes if c.name == "coding")
    with pytest.raises(SleepError, match="still sleeps") as failed:
        Measurer(rig).measure_duet(Duet(ngram, reference, rig.mode("ngram"), rig.mode("no_spec")), coding, 1,
                                   sleeper=sleeper)
    assert "no_spec: the last line of its log" in str(failed.value)
    assert reference.stopped and ngram.stopped


# -- the plugin ------------------------------------------------------------------------------------


def test_an_alternation_rig_sets_up_each_server_once_with_its_turns(pytester):
    from fixture_copy import copy_fixtures

    copy_fixtures(pytester.path / "fixtures")
    pytester.makepyfile(test_perf=(ROOT / "perf_tests" / "test_speculative_perf.py").read_text())
    pytester.makeini("[pytest]\nmarkers =\n    perf: p\n    cpu: c\n    gpu: g\n    speculative_only: s\n")
    result = pytester.runpytest("--setup-plan", "-m", "gpu", "--specgate-rig", "h200-wide15b-alternate",
                                "-p", "no:cacheprovider")
    out = result.stdout.str()
    assert sum("SETUP    S vllm_server" in line for line in result.outlines) == 5, out
    assert sum("SETUP    S sleep_controller" in line for line in result.outlines) == 1, out
    modes = [line.split("[")[1].split("]")[0] for line in result.outlines if "SETUP    S mode[" in line]
    assert modes[-1] == "Mode('no_spec')"  # the reference starts first (partner_server) and its tests come last
