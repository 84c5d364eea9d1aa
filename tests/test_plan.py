"""specgate.plan.estimate: what a session costs before it starts, from the rig and the stored figures; and
``python -m specgate plan`` on the command line."""

from pathlib import Path

import pytest

from specgate.config.rig import load_rig
from specgate.durations import format_elapsed
from specgate.plan.estimate import SESSION_OVERHEAD_S, STOP_S, WINDOW_OVERHEAD_S, Conditions, plan_session, stored_rates
from specgate.serve.host_memory import PIN_GIB_PER_S
from specgate.store.baselines import StoredStart, load_baselines

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent


def _rig_and_rates(name: str):
    rig = load_rig(name, ROOT / "fixtures")
    return rig, stored_rates(load_baselines(ROOT / "baselines.json"), name)


def _first_token_s(rig, prompt_class: str) -> float:
    """The rig's time to a first token, scaled to the class's mean prompt length (per 500 characters)."""
    prompts = next(c for c in rig.prompt_classes if c.name == prompt_class).prompts
    return rig.estimate.first_token_s * sum(len(p.text) for p in prompts) / len(prompts) / 500


def _all_windows(rig, modes):
    return [(m, c.name, n) for m in modes for c in rig.prompt_classes for n in rig.protocol.concurrency]


def test_the_kimi_rig_costs_its_loads_and_its_windows_at_the_stored_rates():
    rig, rates = _rig_and_rates("kimi-k25-int4-8x-rtx6000")
    # the two servers take turns on the 8 GPUs (sleep mode): every window is an alternation of both
    # on a host that holds both servers' weights at level 1 (1.5 TB): swaps of ~2 s
    plan = plan_session(rig, _all_windows(rig, ["ngram", "no_spec"]), rates, Conditions(host_gib=1536))
    assert plan.arrangement == "alternation"
    assert [(s.label, s.startup_s) for s in plan.servers] == [("no_spec", 1800.0), ("ngram", 5400.0)]
    assert len(plan.windows) == 4 and plan.requests == 4 * 36 and plan.tokens == 4 * 36 * 512
    coding = plan.window(("ngram", "coding", 1))
    # 18 requests of 512 tokens per side at the stored 46.4 and 62.6 tok/s, each with the rig's 1 s
    # to a first token, and its swaps: at ~12 s a request, turns of one request keep a swap (2 s) under
    # 10 % of its pair of turns, so each of the 3 passes over 6 prompts swaps 6 times
    first_token = _first_token_s(rig, "coding")
    assert first_token == pytest.approx(1.0 * 533 / 500, abs=0.01)  # coding's prompts: ~533 characters
    decoding = 18 * (512 / 46.4 + first_token) + 18 * (512 / 62.6 + first_token)
    assert coding.swaps == 18 and rig.estimate.swap_s == 2.0
    assert coding.seconds == pytest.approx(decoding + 18 * 2.0 + WINDOW_OVERHEAD_S)
    assert coding.rate_source == "stored"
    # each server's first level-1 sleep copies its 560 GiB to host memory, counted with the starts
    first_sleeps = 2 * 560 / PIN_GIB_PER_S
    assert plan.first_sleeps_s == pytest.approx(first_sleeps)
    assert plan.total_s == pytest.approx(1800 + 5400 + 2 * STOP_S + first_sleeps + plan.measuring_s
                                         + SESSION_OVERHEAD_S)
    assert 2.5 * 3600 < plan.total_s < 2.8 * 3600  # 2 h of loads, 16 min of first sleeps, ~25 min of windows
    text = plan.render()
    assert "ngram (start ~90m00s)" in text and f"about {format_elapsed(plan.total_s)}" in text and "take turns" in text
    assert "no_spec sleep level 1" in text and "ngram sleep level 1" in text


def test_an_alternation_window_counts_the_swaps_its_turns_make():
    # the lab's 15.5 B rig: 12 pairs of ~1.1-1.6 s requests in turns of the class's 6 prompts, each
    # pass starting on the awake side: 2 swaps a window, as the H200 measured (2026-12-03-h200-reuse.md)
    rig = load_rig("h200-wide15b-alternate", ROOT / "fixtures")
    rates = {("draft1l_al30_async", "coding", 1): 300.0, ("no_spec", "coding", 1): 121.0}
    plan = plan_session(rig, [("draft1l_al30_async", "coding", 1)], rates)
    [window] = plan.windows
    assert window.arrangement == "alternation" and window.swaps == 2 and "(2 swaps)" in plan.render()
    slow = rig.model_copy(update={"estimate": rig.estimate.model_copy(update={"swap_s": 30.0})})
    slow_window = plan_session(slow, [("draft1l_al30_async", "coding", 1)], rates).windows[0]
    assert slow_window.swaps == 2  # a turn holds at most the class's prompts
    assert rig.estimate.swap_s == 1.6  # as measured on the H200
    assert slow_window.seconds == pytest.approx(window.seconds + 2 * (30.0 - 1.6))
    assert "[estimate] swap_s" in plan.render()
    assert "copies its weights to host memory" in plan.render()
    # at level 2 no weights go to host memory: every wake reloads them, inside the swaps counted
    at_sleep_level_2 = rig.model_copy(update={"sleep_level": 2})
    note = plan_session(at_sleep_level_2, [("draft1l_al30_async", "coding", 1)], rates).render()
    assert "every wake reloads the weights" in note and "copies its weights to host memory" not in note


def test_cpu_smollm2_counts_duets_once_with_their_settle_pauses_and_follow_up_bound():
    rig, rates = _rig_and_rates("cpu-smollm2")
    # a duet rig runs the speculative mode first; the reference's windows are the duets' other side
    plan = plan_session(rig, _all_windows(rig, ["ngram", "no_spec"]), rates)
    assert [s.label for s in plan.servers] == ["no_spec", "ngram"]
    assert [w.key[0] for w in plan.windows] == ["ngram"] * 6
    extraction = plan.window(("ngram", "extraction", 1))
    assert extraction.arrangement == "duet" and extraction.requests == 24 and extraction.partner == "no_spec"
    first_token = _first_token_s(rig, "extraction")  # long documents: ~2.6x coding's prefill
    assert first_token > 2.5 * rig.estimate.first_token_s
    per_request = [64 / rates[("ngram", "extraction", 1)] + first_token,
                   64 / rates[("no_spec", "extraction", 1)] + first_token]
    decoding = 12 * sum(per_request)
    # ABBA order: one switch per pair within a round, none between pairs; 6 per round, 2 rounds
    assert extraction.seconds == pytest.approx(decoding + 1.2 * 6 * 2 + WINDOW_OVERHEAD_S)
    # 8 follow-up rounds after 2: four times the first look's requests
    assert extraction.follow_up_seconds == pytest.approx((extraction.seconds - WINDOW_OVERHEAD_S) * 4)
    assert plan.warmup_requests == 4


def test_a_reference_window_without_its_duet_is_measured_alone():
    rig, rates = _rig_and_rates("cpu-smollm2")
    plan = plan_session(rig, [("no_spec", "coding", 1)], rates)
    assert [(w.key, w.arrangement, w.requests) for w in plan.windows] == [(("no_spec", "coding", 1), "solo", 12)]


def test_without_stored_figures_the_rig_stated_rate_is_used_else_the_duration_is_unknown():
    rig, _ = _rig_and_rates("cpu-smollm2")
    unstated = rig.model_copy(update={"estimate": rig.estimate.model_copy(update={"tokens_per_s": None})})
    unknown = plan_session(unstated, [("ngram", "coding", 1)], {})
    assert unknown.total_s is None and "duration unknown" in unknown.render()
    stated = rig.model_copy(update={"estimate": rig.estimate.model_copy(update={"tokens_per_s": 16.0})})
    known = plan_session(stated, [("ngram", "coding", 1)], {})
    assert known.windows[0].rate_source == "rig's [estimate]"
    first_token = _first_token_s(rig, "coding")
    assert known.windows[0].seconds == pytest.approx(24 * (64 / 16 + first_token) + 1.2 * 12 + WINDOW_OVERHEAD_S)


def test_kept_servers_and_attached_ones_cost_no_start():
    rig, rates = _rig_and_rates("kimi-k25-int4-8x-rtx6000")
    windows = _all_windows(rig, ["ngram", "no_spec"])
    reused = plan_session(rig, windows, rates, Conditions(reused=["no_spec", "ngram"]))
    assert reused.startup_s == 0 and "kept, reused" in reused.render()
    attached = plan_session(rig, [("no_spec", "coding", 1)], rates, Conditions(attached=True))
    assert attached.servers == () and attached.startup_s == 0


def test_an_ab_with_its_reference_kept_starts_only_the_candidate_and_says_so():
    # the pre-merge path: main's build kept loaded from an earlier session, each candidate loads alone
    from specgate.config.rig import AB, Side

    rig = load_rig("cpu-smollm2-eagle3", ROOT / "fixtures")
    ab = rig.model_copy(update={"ab": AB(candidate=Side(env={"SPECGATE_SLOWDOWN": "0.0"}))})
    window = [("eagle3", "coding", 1)]
    kept = plan_session(ab, window, {}, Conditions(reused=["eagle3@reference"]))
    assert [(s.label, s.side, s.reused) for s in kept.servers] == [
        ("eagle3@candidate", "candidate", False), ("eagle3@reference", "reference", True)]
    assert kept.startup_s == rig.estimate.startup_for(True) + STOP_S
    text = kept.render()
    assert "reference kept: 0 starts (eagle3@reference reused live); starting: eagle3@candidate" in text
    assert "total: 1 server start(s)" in text
    # nothing kept: both sides start, and no such line
    fresh = plan_session(ab, window, {}).render()
    assert "reference kept" not in fresh and "total: 2 server start(s)" in fresh
    # a one-server rig: the kept reference waits asleep (vLLM sleep mode) for its turns
    alternating = load_rig("h200-wide15b-alternate", ROOT / "fixtures")
    assert alternating.ab is None and alternating.arrangement.name == "alternation"
    slept = alternating.model_copy(update={"ab": AB(candidate=Side(env={"SPECGATE_GPU_SLOWDOWN": "0.05"}))})
    text = plan_session(slept, [("draft1l_al30_async", "coding", 1)], {},
                        Conditions(reused=["draft1l_al30_async@reference"])).render()
    assert "reference kept: 0 starts (draft1l_al30_async@reference reused asleep)" in text


def test_the_plan_command_prints_the_estimate_of_a_selection_and_starts_nothing(capsys, monkeypatch):
    from specgate.cli import main
    from specgate.serve.server import VLLMServer

    def no_server(server):
        raise AssertionError(f"the plan started a server: {server.spec}")

    monkeypatch.setattr(VLLMServer, "start", no_server)
    monkeypatch.chdir(ROOT)
    assert main(["plan", "--rig", "cpu-smollm2", "-k", "extraction"]) == 0
    out = capsys.readouterr().out
    assert "rig cpu-smollm2 (duet): 2 server(s), 1 window(s)" in out
    assert "ngram / extraction / c1" in out and "coding" not in out
    assert "about " in out


@pytest.mark.parametrize("gib", ["-1", "-0.5", "nan", "lots"])
def test_a_host_memory_that_is_not_an_amount_is_a_usage_error(capsys, gib):
    from specgate.cli import main

    with pytest.raises(SystemExit) as refused:
        main(["plan", "--rig", "kimi-k25-int4-8x-rtx6000", f"--host-memory-gib={gib}"])
    assert refused.value.code == 4  # argparse's own would be 2, pytest's "interrupted"
    assert f"--host-memory-gib: {gib!r} is not an amount of memory in GiB (a number, 0 or more)" in \
        capsys.readouterr().err


def test_stored_figures_count_only_at_this_hosts_pace_where_the_rig_states_a_rate():
    """The cpu rig's stored figures carry no CPU canary and came from a 1.7x slower machine whose
    fingerprint reads the same: where the rig states a rate, the plan sets them aside for it."""
    from specgate.plan.estimate import estimate_rates

    store = load_baselines(ROOT / "baselines.json")
    rig = load_rig("cpu-smollm2", ROOT / "fixtures")
    rates, note = estimate_rates(store, rig, canary_us=25.0)
    assert rates == {} and "12 with no host pace recorded" in note and "tokens_per_s (20)" in note
    plan = plan_session(rig, [("ngram", "coding", 1)], rates, Conditions(rate_note=note))
    assert plan.windows[0].rate_source == "rig's [estimate]" and f"note: {note}" in plan.render()
    # figures stored at this host's pace (canary within host_pace_tolerance, 25 %) are used; others not
    def paced(entry, *canaries):
        return entry.model_copy(update={"starts": [StoredStart(level=entry.median, canary_us=c) for c in canaries]})

    entry = store.rigs["cpu-smollm2"]["ngram"]["coding"]["1"][-1]
    store.rigs["cpu-smollm2"]["ngram"]["coding"]["1"] = [paced(entry, 24.0, 26.0)]
    store.rigs["cpu-smollm2"]["ngram"]["math"]["1"] = [paced(store.rigs["cpu-smollm2"]["ngram"]["math"]["1"][-1], 40.0)]
    rates, note = estimate_rates(store, rig, canary_us=25.0)
    assert rates == {("ngram", "coding", 1): entry.median}
    assert "10 with no host pace recorded and 1 at another host pace" in note
    # a rig that states no rate keeps every stored figure: they are all the plan has
    unstated = rig.model_copy(update={"estimate": rig.estimate.model_copy(update={"tokens_per_s": None})})
    rates, note = estimate_rates(store, unstated, canary_us=None)
    assert len(rates) == 12 and note is None


def test_the_estimate_adds_the_share_of_follow_up_rounds_the_rig_expects():
    shipped = load_rig("cpu-smollm2", ROOT / "fixtures")
    assert shipped.estimate.follow_up_share == 0  # its gated classes have not wanted theirs (0 of 19)
    rig = shipped.model_copy(update={"estimate": shipped.estimate.model_copy(update={"follow_up_share": 0.4})})
    plan = plan_session(rig, [("ngram", "extraction", 1), ("ngram", "summarization", 1)], {})
    assert plan.follow_up_share == 0.4 and plan.follow_up_s > 0
    # a declared backfire class (coding on this rig) gets no follow-up rounds: none to plan
    declared = plan_session(rig, [("ngram", "coding", 1)], {})
    assert declared.follow_up_s == 0 and declared.expected_s == declared.total_s
    assert plan.expected_s == pytest.approx(plan.total_s + 0.4 * plan.follow_up_s)
    text = plan.render()
    assert "with 40% of the follow-up rounds" in text
    for seconds in (plan.expected_s, plan.total_s, plan.total_s + plan.follow_up_s):
        assert format_elapsed(seconds) in text
