"""The calibration's bookkeeping (specgate_lab.calibrate): which windows count as false alarms and
detections at each tolerance, the exact binomial intervals, and the files it writes. The figures
themselves come from real runs (docs/statistics.md); these windows are hand-made."""

import json
from pathlib import Path

import pytest

from specgate.config.rig import load_rig
from specgate_lab.calibrate import WindowResult, binomial_interval, load_windows, summarize, write_outputs

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[2]


def window(level, ci_high, design="duet", tpot=None):
    return WindowResult(0, level, "coding", design, ci_high - 0.01, ci_high - 0.02, ci_high, 12, tpot, "t")


def test_a_window_fails_iff_its_upper_end_is_below_one_minus_the_tolerance():
    assert window(0.1, 0.94).fails(0.05)
    assert not window(0.1, 0.96).fails(0.05)
    assert not WindowResult(0, 0.1, "c", "duet", 0.9, None, None, 3, None, "t").fails(0.05)


def test_rates_per_level_and_tolerance_with_exact_intervals():
    results = [window(0.0, 1.02), window(0.0, 0.99), window(0.1, 0.93, tpot=1.1), window(0.1, 0.96, tpot=1.12)]
    rows = {row["injected slowdown"]: row for row in summarize(results, [0.05])}
    assert rows["0 %"]["fail @ tol 5 %"].startswith("0/2")
    assert rows["10 %"]["fail @ tol 5 %"].startswith("1/2")
    assert rows["10 %"]["server TPOT x"].startswith("1.110")
    lo, hi = binomial_interval(0, 30)
    assert lo == 0 and hi == pytest.approx(0.116, abs=0.001)  # 0 of 30 shows <= 11.6 %, not <= 1 %


def test_outputs_render_again_from_windows_jsonl(tmp_path):
    rig = load_rig("cpu-smollm2", __import__("pathlib").Path(__file__).resolve().parents[2] / "fixtures")
    results = [window(0.0, 1.01), window(0.2, 0.85, tpot=1.2), window(0.0, 1.03, design="sequential")]
    (tmp_path / "windows.jsonl").write_text("".join(json.dumps(r.__dict__) + "\n" for r in results))
    assert load_windows(tmp_path / "windows.jsonl") == results
    meta = {"started": "a", "finished": "b", "mode": "no_spec", "classes": ["coding"], "rounds": 1,
            "concurrency": 1, "machine": "m"}
    path = write_outputs(rig, tmp_path, results, [0.05], meta)
    text = path.read_text()
    assert "| duet" in text and "| sequential" in text and "fail @ tol 5 %" in text
    assert (tmp_path / "power.png").stat().st_size > 1000


def test_several_runs_render_as_one_set_with_every_start_its_own(tmp_path):
    from specgate_lab.calibrate import load_runs, save_windows

    def run(folder, starts, mode="no_spec", machine="m1", started="2026-12-02T00:00:00"):
        folder.mkdir()
        save_windows(folder / "windows.jsonl", [
            WindowResult(i, 0.1, "coding", "duet", 0.9, 0.88, 0.92, 12, 1.1, "t", start=i) for i in range(starts)])
        meta = {"started": started, "finished": started, "mode": mode, "classes": ["coding"], "rounds": starts,
                "concurrency": 1, "machine": machine, "fresh_servers": True}
        (folder / "summary.json").write_text(json.dumps({"meta": meta, "rows": []}))
        return folder

    a, b = run(tmp_path / "a", 3), run(tmp_path / "b", 2, machine="m2", started="2026-12-02T05:00:00")
    results, meta = load_runs([a, b])
    assert [(r.round, r.start) for r in results] == [(0, 0), (1, 1), (2, 2), (3, 3), (4, 4)]
    assert meta["rounds"] == 5 and meta["machine"] == "m1; m2" and meta["runs"] == [str(a), str(b)]
    assert (meta["started"], meta["finished"]) == ("2026-12-02T00:00:00", "2026-12-02T05:00:00")
    rows = summarize(results, [0.03], shipped=0.03)
    assert rows[0]["server starts"] == 5
    # runs of another mode measure something else: refused, naming both folders
    c = run(tmp_path / "c", 1, mode="ngram")
    with pytest.raises(ValueError, match=r"c measured mode 'ngram', .*a 'no_spec'"):
        load_runs([a, c])
    # a run still going (no summary.json yet) joins any: its mode and classes are not known to differ
    unfinished = run(tmp_path / "d", 1, mode="ngram")
    (unfinished / "summary.json").unlink()
    assert len(load_runs([a, unfinished])[0]) == 4
    with pytest.raises(FileNotFoundError, match=r"windows\.jsonl"):
        load_runs([a, tmp_path / "missing"])
    # windows of another size (--repeats) are another statistic: refused too; one size is kept
    one, two = run(tmp_path / "e", 1), run(tmp_path / "f", 1)
    for folder, repeats in ((one, 1), (two, 2)):
        summary = json.loads((folder / "summary.json").read_text())
        summary["meta"]["repeats"] = repeats
        (folder / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(ValueError, match=r"f measured repeats 2, .*e 1"):
        load_runs([one, two])
    assert load_runs([one, one])[1]["repeats"] == 1
    assert "repeats" not in load_runs([one, a])[1]  # a run that did not record it: unknown, not 1


def test_runs_with_another_injector_are_refused_and_an_unrecorded_one_says_so(tmp_path):
    """--injector none and gpu measure different A/As: never pooled. A run that died before its
    tables keeps its meta (meta.json), so its render still says what it measured."""
    from specgate_lab.calibrate import load_runs, render_markdown, save_windows

    rig = load_rig("cpu-smollm2", Path(__file__).resolve().parents[2] / "fixtures")

    def run(folder, meta_file, **meta):
        folder.mkdir()
        save_windows(folder / "windows.jsonl", [WindowResult(0, 0.0, "coding", "duet", 1.0, 0.99, 1.01, 6, 1.0, "t")])
        base = {"started": "s", "finished": "f", "mode": "no_spec", "classes": ["coding"], "rounds": 1,
                "concurrency": 1, "machine": "m", **meta}
        if meta_file == "summary.json":
            (folder / meta_file).write_text(json.dumps({"meta": base, "rows": []}))
        elif meta_file == "meta.json":
            (folder / meta_file).write_text(json.dumps(base))
        return folder

    gpu = run(tmp_path / "gpu", "summary.json", injector="gpu", repeats=1)
    crashed = run(tmp_path / "crashed", "meta.json", injector="none", repeats=1)
    with pytest.raises(ValueError, match=r"crashed measured injector 'none', .*gpu 'gpu'"):
        load_runs([gpu, crashed])
    results, meta = load_runs([crashed])
    text = render_markdown(rig, summarize(results, [0.03]), meta)
    assert "No injector on either side" in text and "1 repeat(s)" in text and "own difference" in text
    bare = run(tmp_path / "bare", None)  # no meta at all: joins, and the injector is not claimed
    results, meta = load_runs([crashed, bare])
    assert "injector" not in meta and "repeats" not in meta
    text = render_markdown(rig, summarize(results, [0.03]), meta)
    assert "Injector: not recorded" in text and "repeats not recorded" in text


@pytest.mark.parametrize("follow_up", [False, True])
def test_a_calibration_writes_every_window_and_its_requests(tmp_path, monkeypatch, follow_up):
    """run_calibration end to end on two stand-in servers replaying a real recorded vLLM stream:
    windows.jsonl, the requests of each window with their telemetry, and calibration.md. The
    stand-ins' timings are whatever the event loop gives, so whether a first look is undecided is
    set here: never (one look), or always (the follow-up rounds run and both looks are kept)."""
    import contextlib
    import gzip

    from standins import StandInServer

    from specgate.serve import server
    from specgate_lab import calibrate

    root = Path(__file__).resolve().parents[2]
    rig = load_rig("cpu-smollm2", root / "fixtures")
    rig = rig.model_copy(update={"protocol": rig.protocol.model_copy(update={
        "warmup_requests": 0, "settle_s": 0.0, "follow_up_repeats": 2 if follow_up else 0})})
    journal: list = []
    real_decide = calibrate.decide

    def decide(candidate, reference, **kwargs):  # the first look (12 pairs) always undecided at 5 %
        ratio, lo, hi, n = real_decide(candidate, reference, **kwargs)
        return (1.0, 0.90, 0.99, n) if n == 12 else (ratio, lo, hi, n)

    if follow_up:
        monkeypatch.setattr(calibrate, "decide", decide)

    starts: list[str] = []

    @contextlib.contextmanager
    def stand_in(spec, progress=None):
        starts.append(spec.label)
        yield StandInServer("ngram", journal)  # same recorded stream on both sides: an A/A
        starts.append(f"stop {spec.label}")

    monkeypatch.setattr(server, "VLLMServer", stand_in)
    monkeypatch.setattr(calibrate, "plot_power", lambda results, tolerances, path: path)  # drawn elsewhere
    path = calibrate.run_calibration(rig, tmp_path, rounds=1, levels=[0.0], classes=["coding"], progress=lambda _: None)
    windows = load_windows(tmp_path / "windows.jsonl")
    pairs = 24 if follow_up else 12
    assert path.exists() and [(w.level, w.design, w.n) for w in windows] == [(0.0, "duet", pairs)]
    assert len(starts) == 4  # one start of each server for the whole calibration
    assert (windows[0].first_ci_low, windows[0].first_ci_high) == ((0.90, 0.99) if follow_up else (None, None))
    with gzip.open(tmp_path / "measurements.jsonl.gz", "rt") as handle:
        saved = [json.loads(line) for line in handle]
    assert len(saved) == 1 and saved[0]["level"] == 0.0 and len(saved[0]["records"]) == pairs
    assert len(saved[0]["partner"]["records"]) == pairs
    assert bool(saved[0]["follow_up"]) is follow_up
    assert saved[0]["telemetry"]["requests"] and "cpu_busy_pct" in saved[0]["telemetry"]["window"]



def test_two_looks_follow_the_gates_rule_at_every_tolerance():
    # First look 0.90-0.965, last look 0.925-0.945 (repeated intervals). At tolerance 2 % (0.98) the
    # first look is decided (0.965 < 0.98: fails there); at 5 % (0.95) it is undecided (0.90 < 0.95
    # <= 0.965, wider than the 5 % margin), so the last look decides: fails; at 10 % (0.90) the
    # first look's lower end is at the threshold, "not slower": decided, passes, whatever came later.
    r = WindowResult(0, 0.1, "coding", "duet", 0.935, 0.925, 0.945, 24, None, "t", first_ci_low=0.90,
                     first_ci_high=0.965)
    assert r.fails(0.02) and r.fails(0.05) and not r.fails(0.10)
    # a first look that fails decides, even if the last look would not have
    early = WindowResult(0, 0.1, "coding", "duet", 0.97, 0.95, 0.99, 24, None, "t", first_ci_low=0.92,
                         first_ci_high=0.94)
    assert early.fails(0.05)
    (row,) = summarize([r, early], [0.05])
    assert row["follow-ups"] == 2 and row["fail @ tol 5 %"].startswith("2/2")


def test_a_calibration_never_appends_to_another_ones_windows(tmp_path):
    from specgate_lab import calibrate

    rig = load_rig("cpu-smollm2", Path(__file__).resolve().parents[2] / "fixtures")
    (tmp_path / "windows.jsonl").write_text(json.dumps(window(0.0, 1.01).__dict__) + "\n")
    with pytest.raises(ValueError, match=r"windows\.jsonl already holds another calibration's windows"):
        calibrate.run_calibration(rig, tmp_path, rounds=1, levels=[0.0], progress=lambda _: None)
    assert len((tmp_path / "windows.jsonl").read_text().splitlines()) == 1  # untouched


@pytest.mark.parametrize("fresh", [False, True])
def test_fresh_servers_start_both_servers_again_for_every_round(tmp_path, monkeypatch, fresh):
    """--fresh-servers: each round's windows come from their own start of both servers (the
    previous pair stopped first, one server after the other), and say which start measured them."""
    import contextlib

    from standins import StandInServer

    from specgate.serve import server
    from specgate_lab import calibrate

    rig = load_rig("cpu-smollm2", Path(__file__).resolve().parents[2] / "fixtures")
    rig = rig.model_copy(update={"protocol": rig.protocol.model_copy(update={
        "warmup_requests": 0, "settle_s": 0.0, "follow_up_repeats": 0})})
    events: list[str] = []
    logs: list[str] = []

    @contextlib.contextmanager
    def stand_in(spec, progress=None):
        events.append(f"start {spec.label}")
        logs.append(spec.log_path.relative_to(tmp_path).as_posix())
        yield StandInServer("no_spec", [])  # a recorded no-speculation server: the mode both sides run
        events.append(f"stop {spec.label}")

    monkeypatch.setattr(server, "VLLMServer", stand_in)
    monkeypatch.setattr(calibrate, "plot_power", lambda results, tolerances, path: path)
    calibrate.run_calibration(rig, tmp_path, rounds=2, levels=[0.0], classes=["coding"], fresh_servers=fresh,
                              progress=lambda _: None)
    duets = [w for w in load_windows(tmp_path / "windows.jsonl") if w.design == "duet"]
    pair = ["start no_spec@reference", "start no_spec@candidate", "stop no_spec@candidate", "stop no_spec@reference"]
    if fresh:
        assert events == pair + pair and [w.start for w in duets] == [0, 1]
        assert logs == ["server-no_spec-reference.log", "server-no_spec-candidate.log",
                        "servers-2/server-no_spec-reference.log", "servers-2/server-no_spec-candidate.log"]
    else:
        assert events == pair and [w.start for w in duets] == [0, 0]
    meta = json.loads((tmp_path / "summary.json").read_text())
    assert meta["meta"]["fresh_servers"] is fresh
    (row,) = [r for r in meta["rows"] if r["design"] == "duet"]
    assert row["server starts"] == (2 if fresh else 1)


@pytest.mark.parametrize("injector", ["gpu", "none"])
def test_injector_none_loads_no_slowdown_on_either_side(tmp_path, monkeypatch, injector):
    """--injector none: a true A/A, neither server's environment names a slowdown file (with gpu the
    candidate's does); a level above 0 is refused before any server starts."""
    import contextlib

    from standins import StandInServer

    from specgate.serve import server
    from specgate_lab import calibrate
    from specgate_lab.inject import ENV_FILE, ENV_GPU_FILE

    rig = load_rig("cpu-smollm2", Path(__file__).resolve().parents[2] / "fixtures")
    rig = rig.model_copy(update={"protocol": rig.protocol.model_copy(update={
        "warmup_requests": 0, "settle_s": 0.0, "follow_up_repeats": 0})})
    envs: dict[str, set[str]] = {}

    @contextlib.contextmanager
    def stand_in(spec, progress=None):
        envs[spec.label] = set(spec.env) & {ENV_FILE, ENV_GPU_FILE}
        yield StandInServer("no_spec", [])

    monkeypatch.setattr(server, "VLLMServer", stand_in)
    monkeypatch.setattr(calibrate, "plot_power", lambda results, tolerances, path: path)
    with pytest.raises(ValueError, match="A/A only"):
        calibrate.run_calibration(rig, tmp_path / "refused", rounds=1, levels=[0.0, 0.05], injector="none")
    assert not envs and not (tmp_path / "refused" / "windows.jsonl").exists()
    calibrate.run_calibration(rig, tmp_path / "run", rounds=1, levels=[0.0], classes=["coding"], injector=injector,
                              progress=lambda _: None)
    assert envs == {"no_spec@reference": set(),
                    "no_spec@candidate": {ENV_GPU_FILE} if injector == "gpu" else set()}
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["meta"]["injector"] == injector
    said = {"gpu": "enqueues GPU work", "none": "No injector on either side"}[injector]
    assert said in (tmp_path / "run" / "calibration.md").read_text()


def test_the_normal_model_extrapolates_from_how_far_the_upper_ends_sit_from_the_threshold():
    from specgate_lab.calibrate import normal_model_rate

    def windows(highs, level=0.0):
        return [WindowResult(i, level, "coding", "duet", h - 0.02, h - 0.04, h, 12, None, "t", start=i)
                for i, h in enumerate(highs)]

    # A/A: upper ends 1.00-1.04, far above 0.95 against their spread: a tiny rate, bounded above.
    aa = windows([1.00, 1.01, 1.02, 1.03, 1.04, 1.02, 1.01, 1.03])
    estimate, bound = normal_model_rate(aa, 0.05)
    assert 0 <= estimate < bound < 0.01
    # More windows with the same spread tighten the bound (mean and SD known better).
    _, bound16 = normal_model_rate(windows([1.00, 1.01, 1.02, 1.03, 1.04, 1.02, 1.01, 1.03] * 2), 0.05)
    assert bound16 < bound
    # A real 10 % slowdown: upper ends ~0.91-0.93, below 0.95: detection near certain, bounded below.
    slow = windows([0.91, 0.92, 0.93, 0.915, 0.925, 0.92], level=0.1)
    estimate, bound = normal_model_rate(slow, 0.05)
    assert 0.9 < bound < estimate <= 1.0
    # Upper ends straddling the threshold: about half fail, and the model says so.
    half = windows([0.94, 0.96, 0.945, 0.955, 0.95, 0.94, 0.96])
    assert 0.3 < normal_model_rate(half, 0.05)[0] < 0.7
    assert normal_model_rate(aa[:4], 0.05) is None  # too few windows to fit a spread
    # Upper ends ~100 SDs above the line (the H200 duet's A/A: ~60), past the root finder's bracket. The
    # bound is then the bracket's own (a rate of 0 to double precision), not an error after the run.
    tight = windows([0.9910, 0.9913, 0.9907, 0.9911, 0.9909, 0.9912, 0.9908, 0.9910])
    assert normal_model_rate(tight, 0.03) == (0.0, 0.0)
    slowed = windows([h - 0.05 for h in (0.9910, 0.9913, 0.9907, 0.9911, 0.9909)], level=0.05)
    assert normal_model_rate(slowed, 0.03) == (1.0, 1.0)  # far below the line: detection certain
    # It uses the interval that decides: a first look decided at 0.95 keeps its own upper end.
    decided = [WindowResult(i, 0.0, "coding", "duet", 1.0, 0.97, 1.01, 24, None, "t", first_ci_low=0.96,
                            first_ci_high=1.02 + i / 100, start=i) for i in range(6)]
    assert [w.deciding_high(0.05) for w in decided] == [1.02 + i / 100 for i in range(6)]


def test_the_normal_model_bound_is_exact_at_its_confidence():
    # The bound is the exact one-sided 95 % bound on a normal tail probability: windows whose
    # standardized distance from the line sits exactly at the 95th percentile of its sampling
    # distribution (noncentral t) for a true distance z give back exactly Phi(-z) as the bound, on
    # either side: an upper bound on false alarms (A/A above the line), a lower bound on detection
    # (a slowdown below it). Seeded simulations of 400 calibrations per case covered the true rate
    # 94.5-95.0 % of the time (docs/statistics.md, "The normal model's bound").
    import math
    import statistics

    from scipy import stats

    from specgate_lab.calibrate import normal_model_rate

    threshold, sd = math.log(0.97), 0.02
    unit = [i - 4.5 for i in range(10)]
    unit = [u / statistics.stdev(unit) for u in unit]  # mean 0, sample SD 1
    for level, z_true in ((0.0, 2.5), (0.1, 1.8)):
        distance = stats.nct.ppf(0.95, 9, math.sqrt(10) * z_true) / math.sqrt(10) * sd
        centre = threshold + distance if level == 0 else threshold - distance
        group = [WindowResult(i, level, "coding", "duet", math.exp(centre + sd * u), 0.9, math.exp(centre + sd * u),
                              12, None, "t", start=i) for i, u in enumerate(unit)]
        estimate, bound = normal_model_rate(group, 0.03)
        tail = stats.norm.cdf(-z_true)
        assert bound == pytest.approx(tail if level == 0 else 1 - tail, rel=1e-4)
        assert (estimate < bound) if level == 0 else (estimate > bound)


def test_the_normal_model_on_stop_27s_real_windows():
    # docs/journal/calibration/cpu-2026-12-02.md: ten fresh-start rounds of the shipped A/B rule. The earlier
    # bound (mean and SD each at its own 95 % bound) read 7.6 % and 87.6 %; the exact one 4.86 % and 91.35 %.
    from specgate_lab.calibrate import normal_model_rate

    windows = load_windows(ROOT / "tests" / "data" / "calibration" / "cpu-2026-12-02" / "calibration" / "windows.jsonl")
    duet = [w for w in windows if w.design == "duet"]
    aa = normal_model_rate([w for w in duet if w.level == 0], 0.03)
    slow = normal_model_rate([w for w in duet if w.level == 0.1], 0.03)
    assert aa == pytest.approx((0.001683, 0.04861), abs=5e-6)
    assert slow == pytest.approx((0.99338, 0.91346), abs=5e-5)


def test_the_table_shows_server_starts_and_the_normal_model_at_the_shipped_tolerance():
    results = [WindowResult(i, 0.0, "coding", "duet", 1.0, 0.97, 1.02 + i / 200, 12, 1.0, "t", start=i)
               for i in range(6)] + [window(0.0, 1.2, design="sequential")]
    rows = {row["design"]: row for row in summarize(results, [0.05], shipped=0.05)}
    assert rows["duet"]["server starts"] == 6
    assert rows["duet"]["normal model @ 5 %"].startswith(("0", "<")) and "(<= " in rows["duet"]["normal model @ 5 %"]
    assert rows["sequential"]["server starts"] == "-" and "normal model @ 5 %" not in rows["sequential"]


def test_calibrate_refuses_tolerances_that_are_not_fractions(capsys):
    from specgate_lab.cli import main

    assert main(["calibrate", "--tolerances", "5"]) == 2
    assert "--tolerances '5'" in capsys.readouterr().err
    # --injector none with a slowdown level: refused as an argument error, before anything starts
    assert main(["calibrate", "--injector", "none", "--levels", "0,0.05"]) == 2
    assert "--injector none measures the A/A only" in capsys.readouterr().err


def test_an_interrupted_calibration_stops_its_servers_and_writes_the_tables_of_what_it_measured(tmp_path, monkeypatch):
    import contextlib

    from standins import StandInServer

    from specgate.measure.protocol import Measurer
    from specgate.serve import server
    from specgate_lab import calibrate

    rig = load_rig("cpu-smollm2", Path(__file__).resolve().parents[2] / "fixtures")
    rig = rig.model_copy(update={"protocol": rig.protocol.model_copy(update={
        "warmup_requests": 0, "settle_s": 0.0, "follow_up_repeats": 0})})
    events: list[str] = []

    @contextlib.contextmanager
    def stand_in(spec, progress=None):
        events.append(f"start {spec.label}")
        try:
            yield StandInServer("no_spec", [])
        finally:
            events.append(f"stop {spec.label}")

    real = Measurer.measure_duet
    calls = []

    def measure_duet(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # Ctrl-C (or SIGTERM through the CLI) during round 2's window
        return real(self, *args, **kwargs)

    monkeypatch.setattr(server, "VLLMServer", stand_in)
    monkeypatch.setattr(Measurer, "measure_duet", measure_duet)
    monkeypatch.setattr(calibrate, "plot_power", lambda results, tolerances, path: path)
    with pytest.raises(calibrate.CalibrationStopped) as stopped:
        calibrate.run_calibration(rig, tmp_path, rounds=3, levels=[0.0], classes=["coding"], progress=lambda _: None)
    assert stopped.value.path == tmp_path / "calibration.md"
    assert "stopped during round 2 of 3; 1 complete round(s)" in stopped.value.path.read_text()
    assert json.loads((tmp_path / "summary.json").read_text())["meta"]["rounds"] == 1
    assert [w.round for w in load_windows(tmp_path / "windows.jsonl")] == [0]
    assert events[-2:] == ["stop no_spec@candidate", "stop no_spec@reference"]


def test_repeats_sets_the_window_size_the_tables_name(tmp_path, monkeypatch, capsys):
    from specgate.serve import model_prep
    from specgate_lab import calibrate
    from specgate_lab.cli import main

    seen = {}

    def record(rig, out, **kwargs):
        seen["repeats"] = rig.protocol.repeats
        path = out / "calibration.md"
        out.mkdir(parents=True, exist_ok=True)
        path.write_text(calibrate.render_markdown(rig, [], {**calibrate.UNKNOWN_META, "repeats": rig.protocol.repeats}))
        return path

    monkeypatch.setattr(model_prep, "prepare_model", lambda *a, **k: None)
    monkeypatch.setattr(calibrate, "run_calibration", record)
    assert main(["calibrate", "--repeats", "1", f"--out={tmp_path}"]) == 0
    assert seen["repeats"] == 1 and "protocol: 1 repeat(s)" in capsys.readouterr().out
    assert main(["calibrate", "--repeats", "0", f"--out={tmp_path}"]) == 2
    assert "--repeats 0" in capsys.readouterr().err


def test_the_cli_says_where_a_stopped_calibrations_windows_and_tables_are(tmp_path, monkeypatch, capsys):
    from specgate.serve import model_prep
    from specgate_lab import calibrate
    from specgate_lab.cli import main

    (tmp_path / "calibration.md").write_text("# Calibration of rig cpu-smollm2\n")

    def stopped(*args, **kwargs):
        raise calibrate.CalibrationStopped(tmp_path / "calibration.md")

    monkeypatch.setattr(model_prep, "prepare_model", lambda *a, **k: None)
    monkeypatch.setattr(calibrate, "run_calibration", stopped)
    assert main(["calibrate", f"--out={tmp_path}"]) == 130
    captured = capsys.readouterr()
    assert "# Calibration of rig cpu-smollm2" in captured.out
    assert f"stopped; the windows measured are in {tmp_path / 'windows.jsonl'}" in captured.err


def test_the_table_counts_detection_among_windows_really_slowed_by_the_level():
    # A start of the candidate that came up faster than the reference's makes an injected 10 % a real
    # 6.5 % (vLLM's TPOT x 1.065, stop 26's round 24): the extra column counts only the windows whose
    # TPOT ratio reached 1 + level.
    def slowed(i: int, tpot: float, high: float) -> WindowResult:
        return WindowResult(i, 0.1, "coding", "duet", high - 0.03, high - 0.06, high, 24, tpot, "t", start=i)

    results = [slowed(0, 1.065, 0.983), slowed(1, 1.12, 0.93), slowed(2, 1.10, 0.95), slowed(3, 1.13, 0.975),
               slowed(4, 1.11, 0.94)]
    (row,) = summarize(results, [0.04], shipped=0.04)
    assert row["fail @ tol 4 %"].startswith("3/5")
    assert row["caught @ 4 %, TPOT x >= 1.1"] == "3/4"


def test_a_rate_near_certainty_never_rounds_to_100_percent():
    from specgate_lab.calibrate import _rate

    assert _rate(0.99996) == "99.996 %" and _rate(0.9974) == "99.74 %" and _rate(0.5) == "50 %"
    assert _rate(0.0005763) == "0.058 %" and _rate(1e-6) == "< 0.001 %" and _rate(0.9999999) == "> 99.999 %"
