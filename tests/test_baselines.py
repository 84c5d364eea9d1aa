"""Tests for specgate.store.baselines: validation on load, merge, and the atomic write (including a
writer SIGKILLed mid-write)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specgate.errors import ConfigError
from specgate.store.baselines import (
    SCHEMA_VERSION,
    AcceptanceEntry,
    BaselineEntry,
    Fingerprint,
    atomic_write_json,
    load_baselines,
    lookup,
    merge_updates,
)

pytestmark = pytest.mark.fast


def _entry(samples: list[float], **extra: object) -> BaselineEntry:
    ordered = sorted(samples)
    return BaselineEntry(decode_tokens_per_s=samples, median=ordered[len(ordered) // 2], mad=0.5,
                         n=len(samples), **extra)


def _valid_file() -> dict:
    return {
        "schema_version": SCHEMA_VERSION,
        "rigs": {"cpu-smollm2": {"ngram": {"coding": {"1": [{
            "decode_tokens_per_s": [20.0, 21.0], "sample_keys": ["a#0", "b#0"], "median": 20.5, "mad": 0.5,
            "n": 2, "acceptance": {"mean_acceptance_length": 1.8, "acceptance_rate": 0.16},
            "fingerprint": {"accelerator": "cpu", "accelerator_count": 2},
            "starts": [{"level": 20.5, "machine": "machine-id a1"}]}]}}}},
    }


def _tmp_leftovers(folder: Path, name: str) -> list[Path]:
    return sorted(folder.glob(f".{name}.*.tmp"))


# --------------------------------------------------------------------------- load / merge


def test_missing_file_is_an_empty_store(tmp_path: Path) -> None:
    store = load_baselines(tmp_path / "baselines.json")
    assert store.schema_version == SCHEMA_VERSION
    assert store.rigs == {}
    assert lookup(store, "cpu-smollm2", "ngram", "coding", 1) is None
    assert not (tmp_path / "baselines.json").exists()  # loading never creates it


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "baselines.json"
    entry = _entry([20.0, 22.5, 21.0], sample_keys=["a#0", "b#0", "c#0"],
                   acceptance=AcceptanceEntry(mean_acceptance_length=2.5, acceptance_rate=0.3,
                                              per_position_rates=[0.6, 0.4, 0.2]),
                   fingerprint=Fingerprint(accelerator="cpu", accelerator_count=2, vllm_version="0.32.0",
                                           speculative_config={"method": "ngram", "k": 5}, date="2025-01-01"))
    returned, _ = merge_updates(path, {("cpu-smollm2", "ngram", "coding", 1): entry})
    assert lookup(returned, "cpu-smollm2", "ngram", "coding", 1) == entry
    loaded = load_baselines(path)
    assert lookup(loaded, "cpu-smollm2", "ngram", "coding", 1) == entry
    assert loaded == returned
    # Concurrency levels are stored as string keys; lookup takes the int.
    assert list(json.loads(path.read_text())["rigs"]["cpu-smollm2"]["ngram"]["coding"]) == ["1"]
    assert _tmp_leftovers(tmp_path, path.name) == []


def test_merge_keeps_other_entries(tmp_path: Path) -> None:
    path = tmp_path / "baselines.json"
    path.write_text(json.dumps(_valid_file()))
    other = _entry([70.0, 75.0])
    merge_updates(path, {("kimi", "no_spec", "math", 1): other,
                         ("cpu-smollm2", "ngram", "coding", 4): _entry([30.0])})
    store = load_baselines(path)
    kept = lookup(store, "cpu-smollm2", "ngram", "coding", 1)
    assert kept is not None
    assert kept.decode_tokens_per_s == [20.0, 21.0] and kept.sample_keys == ["a#0", "b#0"]
    assert lookup(store, "kimi", "no_spec", "math", 1) == other
    assert lookup(store, "cpu-smollm2", "ngram", "coding", 4) == _entry([30.0])
    # An update to an existing key replaces just that entry.
    merge_updates(path, {("cpu-smollm2", "ngram", "coding", 1): _entry([99.0])})
    store = load_baselines(path)
    assert lookup(store, "cpu-smollm2", "ngram", "coding", 1) == _entry([99.0])
    assert lookup(store, "kimi", "no_spec", "math", 1) == other


def test_merge_rereads_the_file_on_disk(tmp_path: Path) -> None:
    """An edit made by someone else between two merges survives the second merge."""
    path = tmp_path / "baselines.json"
    merge_updates(path, {("a", "m", "c", 1): _entry([1.0])})
    merge_updates(path, {("b", "m", "c", 1): _entry([2.0])})  # a different process, say
    merge_updates(path, {("a", "m", "c", 2): _entry([3.0])})
    store = load_baselines(path)
    assert set(store.rigs) == {"a", "b"}
    assert set(store.rigs["a"]["m"]["c"]) == {"1", "2"}


finite = st.floats(min_value=0.01, max_value=1e6, allow_nan=False, allow_infinity=False)
names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_.", min_size=1, max_size=12)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(updates=st.dictionaries(
    st.tuples(names, names, names, st.integers(min_value=1, max_value=64)),
    st.lists(finite, min_size=1, max_size=6), min_size=1, max_size=5))
def test_merge_then_load_is_identity(tmp_path: Path, updates: dict) -> None:
    path = tmp_path / "prop.json"
    path.unlink(missing_ok=True)
    entries = {key: _entry(samples) for key, samples in updates.items()}
    merge_updates(path, entries)
    store = load_baselines(path)
    for (rig, mode, prompt_class, level), entry in entries.items():
        assert lookup(store, rig, mode, prompt_class, level) == entry


# --------------------------------------------------------------------------- invalid files


def test_invalid_json_names_line_column_and_path(tmp_path: Path) -> None:
    path = tmp_path / "baselines.json"
    path.write_text('{\n  "schema_version": 1,\n  oops\n}\n')
    before = path.read_bytes()
    with pytest.raises(ConfigError) as info:
        load_baselines(path)
    message = str(info.value)
    assert str(path) in message
    assert "line 3, column 3" in message
    assert "not valid JSON" in message
    assert path.read_bytes() == before


def _corrupt(data: dict, how: str) -> dict:
    entry = data["rigs"]["cpu-smollm2"]["ngram"]["coding"]["1"][0]
    if how == "n":
        entry["n"] = 3
    elif how == "median":
        entry["median"] = -1.0
    elif how == "extra":
        entry["medain"] = 20.0
    elif how == "version":
        data["schema_version"] = 3
    elif how == "version-text":
        data["schema_version"] = "2"
    elif how == "median-text":
        entry["median"] = "20.5"
    elif how == "rate":
        entry["acceptance"]["acceptance_rate"] = 1.5
    elif how == "type":
        entry["decode_tokens_per_s"] = "fast"
    elif how == "keys":
        entry["sample_keys"] = ["only-one"]
    elif how == "canary":
        entry["starts"][0]["canary_us"] = -1.0
    return data


@pytest.mark.parametrize(("how", "key", "words"), [
    ("n", "rigs.cpu-smollm2.ngram.coding.1.0", "n=3 but 2 samples"),
    ("median", "rigs.cpu-smollm2.ngram.coding.1.0.median", "greater than 0"),
    ("median-text", "rigs.cpu-smollm2.ngram.coding.1.0.median", "valid number"),  # no coercion
    ("extra", "rigs.cpu-smollm2.ngram.coding.1.0.medain", "Extra inputs are not permitted"),
    ("version", None, "schema_version 3 is not supported"),
    ("version-text", "schema_version", "valid integer"),
    ("rate", "rigs.cpu-smollm2.ngram.coding.1.0.acceptance.acceptance_rate", "less than or equal to 1"),
    ("type", "rigs.cpu-smollm2.ngram.coding.1.0.decode_tokens_per_s", "list"),
    ("keys", "rigs.cpu-smollm2.ngram.coding.1.0", "one key per sample"),
    ("canary", "rigs.cpu-smollm2.ngram.coding.1.0.starts.0.canary_us", "greater than 0"),
])
def test_schema_errors_name_the_dotted_key(tmp_path: Path, how: str, key: str | None, words: str) -> None:
    path = tmp_path / "baselines.json"
    path.write_text(json.dumps(_corrupt(_valid_file(), how), indent=2))
    before = path.read_bytes()
    with pytest.raises(ConfigError) as info:
        load_baselines(path)
    err = info.value
    assert err.path == str(path)
    assert err.key == key
    assert str(err).startswith(f"{path}: {key}: " if key else f"{path}: ")
    assert words in str(err)
    assert path.read_bytes() == before


def test_merge_refuses_to_overwrite_an_invalid_file(tmp_path: Path) -> None:
    path = tmp_path / "baselines.json"
    path.write_text(json.dumps(_corrupt(_valid_file(), "median")))
    before = path.read_bytes()
    with pytest.raises(ConfigError):
        merge_updates(path, {("x", "y", "z", 1): _entry([1.0])})
    assert path.read_bytes() == before
    assert _tmp_leftovers(tmp_path, path.name) == []


def test_the_valid_sample_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "baselines.json"
    path.write_text(json.dumps(_valid_file()))
    entry = lookup(load_baselines(path), "cpu-smollm2", "ngram", "coding", 1)
    assert entry is not None and entry.acceptance is not None
    assert entry.acceptance.mean_acceptance_length == 1.8
    assert entry.fingerprint.accelerator == "cpu"


# --------------------------------------------------------------------------- atomic write


@pytest.mark.parametrize("exc_type", [RuntimeError, KeyboardInterrupt])
def test_crash_mid_write_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            exc_type: type[BaseException]) -> None:
    path = tmp_path / "baselines.json"
    atomic_write_json(path, {"old": True})
    before = path.read_bytes()

    def dump_then_crash(obj: object, handle, **kwargs: object) -> None:
        handle.write('{"new": [1, 2, ')
        handle.flush()
        raise exc_type("disk on fire")

    monkeypatch.setattr(json, "dump", dump_then_crash)
    with pytest.raises(exc_type, match="disk on fire"):
        atomic_write_json(path, {"new": [1, 2, 3]})
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert json.loads(path.read_text()) == {"old": True}
    assert _tmp_leftovers(tmp_path, path.name) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["baselines.json"]


def test_crash_in_replace_leaves_no_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "baselines.json"
    atomic_write_json(path, {"old": True})

    def failing_replace(src: str, dst: object) -> None:
        raise OSError("EXDEV")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="EXDEV"):
        atomic_write_json(path, {"new": True})
    monkeypatch.undo()
    assert json.loads(path.read_text()) == {"old": True}
    assert _tmp_leftovers(tmp_path, path.name) == []


def test_write_creates_and_replaces(tmp_path: Path) -> None:
    path = tmp_path / "report.json"
    atomic_write_json(path, {"a": 1})
    atomic_write_json(path, {"a": 2, "b": [1.5, None]})
    assert json.loads(path.read_text()) == {"a": 2, "b": [1.5, None]}
    assert path.read_text().endswith("\n")


def test_write_keeps_the_file_mode(tmp_path: Path) -> None:
    path = tmp_path / "baselines.json"
    path.write_text("{}")
    path.chmod(0o644)
    atomic_write_json(path, {"a": 1})
    assert path.stat().st_mode & 0o777 == 0o644


# The writer: one interpreter (imports are the slow part) forks one child per file. Each child
# merges a large entry, whose every sample is the iteration number, into its file forever and
# says "IDX ready" before its first write. A "mid" child stops half-way through its first write
# (flushed to the temp file) and says "IDX midwrite", to be killed right there.
WRITER = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    from specgate.store.baselines import BaselineEntry, merge_updates

    def say(*words):  # one write(2) per line: lines of several processes never interleave
        os.write(1, (" ".join(map(str, words)) + "\\n").encode())

    def child(idx, kind, path, size):
        if kind == "mid":
            def half_dump(obj, handle, **kw):
                text = json.dumps(obj, **kw)
                handle.write(text[: len(text) // 2])
                handle.flush()
                os.fsync(handle.fileno())
                say(idx, "midwrite")
                time.sleep(60)
            json.dump = half_dump
        say(idx, "ready")
        i = 0
        while True:
            i += 1
            entry = BaselineEntry(decode_tokens_per_s=[float(i)] * size, median=float(i), mad=0.0, n=size)
            merge_updates(path, {("cpu-smollm2", "ngram", "coding", 1): entry})

    size = int(sys.argv[1])
    pids = []
    for idx, spec in enumerate(sys.argv[2:]):
        kind, path = spec.split(":", 1)
        pid = os.fork()
        if pid == 0:
            try:
                child(idx, kind, Path(path), size)
            finally:
                os._exit(1)
        pids.append(pid)
        say(idx, "pid", pid)
    for pid in pids:
        os.waitpid(pid, 0)
""")

SIZE = 40_000  # samples per entry: ~0.5 MB of JSON, so most of a writer's time is inside a write
INITIAL: dict[Path, str] = {}


def _seed(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_valid_file()))
    merge_updates(path, {("kimi", "no_spec", "math", 1): _entry([70.0, 75.0])})
    INITIAL[path] = path.read_text()


def _check_old_or_new(path: Path) -> int:
    """The file parses and is either the initial content (0) or one full update (its iteration)."""
    raw = path.read_text()
    json.loads(raw)  # valid JSON, not a torn write
    store = load_baselines(path)
    assert lookup(store, "kimi", "no_spec", "math", 1) == _entry([70.0, 75.0])  # never lost
    entry = lookup(store, "cpu-smollm2", "ngram", "coding", 1)
    assert entry is not None
    if entry.decode_tokens_per_s == [20.0, 21.0]:
        assert raw == INITIAL[path]
        return 0
    i = entry.median
    assert entry.decode_tokens_per_s == [i] * SIZE and entry.n == SIZE and i == int(i) and i >= 1
    return int(i)


class _Writers:
    """The forked writers of WRITER; every child is SIGKILLed on exit whatever happens."""

    def __init__(self, specs: list[tuple[str, Path]]) -> None:
        args = [f"{kind}:{path}" for kind, path in specs]
        # A session of its own: cleanup kills the whole group, even children not yet announced.
        self.proc = subprocess.Popen([sys.executable, "-c", WRITER, str(SIZE), *args],
                                     stdout=subprocess.PIPE, text=True, start_new_session=True)
        self.pids: dict[int, int] = {}
        self.said: dict[int, set[str]] = {}

    def expect(self, idx: int, what: str) -> None:
        """Read lines until child ``idx`` has said ``what`` and its pid is known."""
        assert self.proc.stdout is not None
        while what not in self.said.get(idx, ()) or idx not in self.pids:
            line = self.proc.stdout.readline()
            assert line, f"writer ended before child {idx} said {what!r}"
            i, word, *rest = line.split()
            if word == "pid":
                self.pids[int(i)] = int(rest[0])
            else:
                self.said.setdefault(int(i), set()).add(word)

    def kill(self, idx: int) -> None:
        os.kill(self.pids[idx], signal.SIGKILL)

    def __enter__(self) -> _Writers:
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


@pytest.mark.timeout(60)
def test_sigkill_mid_write_leaves_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "baselines.json"
    _seed(path)
    with _Writers([("mid", path)]) as writers:
        writers.expect(0, "midwrite")
        leftovers = _tmp_leftovers(tmp_path, path.name)
        assert len(leftovers) == 1 and leftovers[0].stat().st_size > 0  # a half-written temp file
        writers.kill(0)
    assert _check_old_or_new(path) == 0
    assert path.read_text() == INITIAL[path]


@pytest.mark.timeout(60)
def test_sigkill_at_random_moments_never_tears_the_file(tmp_path: Path) -> None:
    """Four writers looping on four files, each SIGKILLed at a different moment."""
    delays = (0.0, 0.07, 0.19, 0.33)
    paths = [tmp_path / f"run{i}" / "baselines.json" for i in range(len(delays))]
    for path in paths:
        _seed(path)
    with _Writers([("loop", path) for path in paths]) as writers:
        for idx in range(len(paths)):
            writers.expect(idx, "ready")
        started = time.monotonic()
        for idx, delay in enumerate(delays):
            time.sleep(max(0.0, started + delay - time.monotonic()))
            writers.kill(idx)
    for path in paths:
        _check_old_or_new(path)


# --------------------------------------------------------------------------- fingerprint


def test_fingerprint_differences_ignore_date_commit_and_note() -> None:
    a = Fingerprint(accelerator="H200", accelerator_count=1, driver="570", vllm_version="0.26.0",
                    model="smollm2-135m", speculative_config={"method": "ngram"},
                    date="2025-01-01", commit="abc123", note="first")
    b = a.model_copy(update={"date": "2026-06-30", "commit": "def456", "note": "second"})
    assert a.differences(b) == []
    c = b.model_copy(update={"driver": "575", "speculative_config": {"method": "ngram", "k": 3}})
    diffs = a.differences(c)
    assert len(diffs) == 2
    assert diffs[0] == "driver: stored '570', now '575'"
    assert diffs[1].startswith("speculative_config: stored {'method': 'ngram'}")


@given(field=st.sampled_from(["accelerator", "driver", "vllm_version", "model"]), value=names)
def test_fingerprint_any_speed_field_change_is_reported(field: str, value: str) -> None:
    a = Fingerprint(accelerator="H200", driver="570", vllm_version="0.26.0", model="m")
    b = a.model_copy(update={field: value})
    diffs = a.differences(b)
    if getattr(a, field) == value:
        assert diffs == []
    else:
        assert len(diffs) == 1 and diffs[0].startswith(f"{field}: ")


def test_fingerprint_counts_servers_measuring_side_by_side() -> None:
    # Serial lab baselines vs an xdist run with one server per GPU: reported, and older baseline
    # files (no such key) read as serial.
    serial = Fingerprint.model_validate({"accelerator": "NVIDIA H200", "accelerator_count": 1})
    assert serial.concurrent_servers == 1
    spread = serial.model_copy(update={"concurrent_servers": 2})
    assert serial.differences(spread) == ["concurrent_servers: stored 1, now 2"]


def test_fingerprint_commit_says_dirty_and_honours_the_override(tmp_path: Path, monkeypatch) -> None:
    from specgate.store.fingerprint import git_commit

    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "baselines.json").write_text("{}")
    subprocess.run([*git, "-C", str(tmp_path), "add", "."], check=True)
    subprocess.run([*git, "-C", str(tmp_path), "commit", "-qm", "x"], check=True)
    monkeypatch.delenv("SPECGATE_COMMIT", raising=False)
    clean = git_commit(tmp_path)
    assert clean and len(clean) >= 7 and not clean.endswith("-dirty")
    (tmp_path / "baselines.json").write_text('{"changed": 1}')
    assert git_commit(tmp_path) == f"{clean}-dirty"  # the tree that ran is not that commit
    monkeypatch.setenv("SPECGATE_COMMIT", "abc1234")  # a copied tree (the GPU lab) names its commit
    assert git_commit(tmp_path) == "abc1234"
