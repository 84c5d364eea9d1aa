"""`python -m specgate adopt-baselines REPORT`: keep what an interrupted --specgate-update-baselines run
measured. Exercised on the real report of such a run (GPU lab, pipeline-parallel rig, cut short
while its third mode hung vLLM)."""

import gzip
import json
import shutil
from pathlib import Path

import pytest
from old_reports import with_old_mode_name

from specgate.cli import main
from specgate.store.baselines import histories, load_baselines, lookup

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
INTERRUPTED = ROOT / "fixtures" / "recorded" / "gpu" / "reports" / "pp2-update-interrupted.json.gz"


@pytest.fixture
def baselines(tmp_path: Path) -> Path:
    path = tmp_path / "baselines.json"
    shutil.copy(ROOT / "baselines.json", path)
    return path


def test_adopts_the_finished_windows_of_an_interrupted_run(baselines: Path, capsys) -> None:
    before = load_baselines(baselines)
    report = json.loads(gzip.decompress(INTERRUPTED.read_bytes()))
    assert report["complete"] is False

    assert main(["adopt-baselines", str(INTERRUPTED), "--baselines", str(baselines)]) == 0

    out = capsys.readouterr().out
    assert "did not finish" in out and "4 baseline(s) written" in out
    store = load_baselines(baselines)
    for m in report["measurements"]:
        entry = lookup(store, "h200x2-smollm2-pp2", m["mode"], m["prompt_class"], 1)
        samples = [r["decode_tokens_per_s"] for r in m["records"] if r["decode_tokens_per_s"] is not None]
        assert entry is not None and sorted(entry.decode_tokens_per_s) == sorted(samples)
        assert entry.fingerprint.accelerator == "NVIDIA H200"
    assert store.rigs["h200-smollm2"] == before.rigs["h200-smollm2"]  # other rigs untouched


def test_modes_subset(baselines: Path, capsys) -> None:
    before = load_baselines(baselines).rigs.get("h200x2-smollm2-pp2", {})
    assert main(["adopt-baselines", str(INTERRUPTED), "--baselines", str(baselines), "--modes", "no_spec_pp2"]) == 0
    assert "2 baseline(s) written" in capsys.readouterr().out
    after = load_baselines(baselines).rigs["h200x2-smollm2-pp2"]
    assert after.get("no_spec") == before.get("no_spec")  # the mode left out is untouched
    report = json.loads(gzip.decompress(INTERRUPTED.read_bytes()))
    adopted = {m["prompt_class"]: sorted(r["decode_tokens_per_s"] for r in m["records"])
               for m in report["measurements"] if m["mode"] == "no_spec_pp2"}
    assert {c: sorted(after["no_spec_pp2"][c]["1"][-1].decode_tokens_per_s) for c in adopted} == adopted


def test_a_report_from_before_the_rename_is_adopted_under_no_spec(baselines: Path, tmp_path: Path, capsys) -> None:
    """A report.json whose no-speculation mode is still called "baseline": its windows are stored
    as no_spec's (where the rig's tests look them up), with a note; --modes takes the old name."""
    old = tmp_path / "old-report.json"
    old.write_text(json.dumps(with_old_mode_name(json.loads(gzip.decompress(INTERRUPTED.read_bytes())))))
    assert '"mode": "baseline"' in old.read_text()
    assert main(["adopt-baselines", str(old), "--baselines", str(baselines), "--modes", "baseline"]) == 0
    out = capsys.readouterr().out
    assert "names the no-speculation mode by its old name 'baseline'; its windows are adopted as 'no_spec'" in out
    assert "h200x2-smollm2-pp2 / no_spec / coding / c1" in out and "2 baseline(s) written" in out
    assert "baseline" not in load_baselines(baselines).rigs["h200x2-smollm2-pp2"]


@pytest.mark.parametrize(("content", "message"), [
    (None, "cannot read report"),
    ("{not json", "cannot read report"),
    ('{"rigs": {}}', "is not a specgate report.json"),
])
def test_bad_report_is_named_and_baselines_untouched(tmp_path: Path, baselines: Path, capsys, content, message):
    report = tmp_path / "report.json"
    if content is not None:
        report.write_text(content)
    before = baselines.read_bytes()
    assert main(["adopt-baselines", str(report), "--baselines", str(baselines)]) == 4  # usage error
    err = capsys.readouterr().err
    assert message in err and str(report) in err
    assert baselines.read_bytes() == before


def test_no_window_of_the_asked_modes(baselines: Path, capsys) -> None:
    before = baselines.read_bytes()
    assert main(["adopt-baselines", str(INTERRUPTED), "--baselines", str(baselines), "--modes", "ngram"]) == 4
    assert "holds no measured window of modes ['ngram']" in capsys.readouterr().err
    assert baselines.read_bytes() == before


def test_an_old_duet_report_is_stored_apart_from_the_stored_history(baselines: Path, tmp_path: Path, capsys) -> None:
    """A real lab report from before the rename (GPU-bound rig, duet windows against "baseline"):
    the stored ratio's reference becomes no_spec (where the rig's gates find it). The report names no
    machine, so its window is a history of its own: the stored history (of no named machine either)
    is kept as it was, never appended to (issue 51: no command appends across machines)."""
    import gzip

    report = tmp_path / "s3.json"
    report.write_bytes(gzip.decompress((DATA / "lab/2026-12-01-h200-draft4l/s3/report.json.gz").read_bytes()))
    assert '"mode": "baseline"' in report.read_text()
    key = ("h200-llama8b-dummy", "draft_al30", "coding", 1)
    before = histories(load_baselines(baselines), *key)
    assert main(["adopt-baselines", str(report), "--baselines", str(baselines), "--modes", "draft_al30"]) == 0
    assert "stored as a history of its own (this machine is unknown: it never gates)" in capsys.readouterr().out
    after = histories(load_baselines(baselines), *key)
    assert after[:-1] == before and len(after[-1].starts) == 1
    assert after[-1].ratio_to_reference.reference_mode == "no_spec" and len(after[-1].ratio_history) == 1
