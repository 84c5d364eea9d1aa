"""benchmarks/stats_validation.py on tiny synthetic runs: no false alarm when nothing changed, every
comparison fails when the measured side is twice as slow, and the derived decisions agree with
direct compare_ratio calls."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.fast

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "stats_validation.py"


def _load() -> ModuleType:
    name = "specgate_stats_validation_script"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


sv = _load()

# Two modes, six prompts each, a few percent apart from prompt to prompt.
SAMPLES = {
    ("baseline", "coding", "1"): [30.0, 30.3, 30.6, 30.9, 31.2, 31.5],
    ("ngram", "coding", "1"): [40.0, 40.4, 40.8, 41.2, 41.6, 42.0],
}
FAST = {"trials": 20, "check_trials": 3, "n_resamples": 100}


def _run(label: str) -> object:
    windows = {
        sv.WindowKey(*key): {f"p{i}#0": value for i, value in enumerate(values)}
        for key, values in SAMPLES.items()
    }
    return sv.Run(label=label, windows=windows, rig="tiny")


def test_identical_runs_never_fail_and_a_halving_is_always_caught() -> None:
    result = sv.validate([_run("a"), _run("b")], tolerance=0.15, slowdowns=(0.5,), **FAST)
    keys = [s.key for s in result.settings]
    assert keys == ["real", "pool", "model", "model-r2", "half-r2", "noshift", "noshift-r2"]
    for setting in result.settings:
        failures, n = setting.false_alarms(0.15)
        assert n > 0
        assert failures == 0, setting.key
        assert setting.detection(0.15, 0.5) == 1.0, setting.key
    assert result.mismatches == 0
    assert sum(s.checked for s in result.settings) > 0
    assert result.setting("real").n == 4  # 2 windows x 2 orientations


def test_script_end_to_end_on_tiny_reports(tmp_path: Path) -> None:
    paths = []
    for run in ("one", "two"):
        measurements = [
            {
                "mode": mode,
                "prompt_class": cls,
                "concurrency": int(conc),
                "records": [
                    {"request_id": f"{mode}/{cls}/p{i}#0", "prompt_id": f"p{i}", "decode_tokens_per_s": value}
                    for i, value in enumerate(values)
                ],
            }
            for (mode, cls, conc), values in SAMPLES.items()
        ]
        report = {
            "complete": True,
            "rig": {"name": "tiny", "tier": "cpu", "protocol": {"repeats": 1}},
            "fingerprints": {"baseline": {"accelerator": "Test CPU", "accelerator_count": 2}},
            "measurements": measurements,
        }
        path = tmp_path / f"{run}.json"
        path.write_text(json.dumps(report))
        paths.append(str(path))
    printed: list[str] = []
    argv = [*paths, "--trials", "10", "--check-trials", "1", "--n-resamples", "50"]
    assert sv.main(argv, out=printed.append) == 0
    text = printed[0]
    assert "## False alarms (A/A)" in text
    assert "Test CPU, 2 cores" in text
    assert "0 disagreements" in text
