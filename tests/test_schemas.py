"""The JSON schemas of report.json and baselines.json in docs/schemas/: current with the models
(``python -m specgate schema --out docs/schemas`` writes them), and the files specgate keeps or
writes validate against them."""

from __future__ import annotations

import functools
import gzip
import json
from pathlib import Path

import jsonschema
import pytest
from test_report import _session

from specgate.cli import main
from specgate.report.schemas import SCHEMAS, schema_text

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "docs" / "schemas"
RECORDED = sorted((ROOT / "fixtures" / "recorded").glob("*/reports/*.json.gz"))


@functools.cache  # the schema read and checked once per process (checking it: ~40 ms), not per file validated
def _validator(name: str) -> jsonschema.protocols.Validator:
    schema = json.loads((COMMITTED / f"{name}.schema.json").read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _errors(name: str, data: object) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
            for e in _validator(name).iter_errors(data)][:5]


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_the_committed_schema_is_the_models(name: str) -> None:
    path = COMMITTED / f"{name}.schema.json"
    assert path.read_text() == schema_text(name), (
        f"{path.relative_to(ROOT)} is not what the models generate: run python -m specgate schema --out docs/schemas")


def test_the_schema_command_writes_what_is_committed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema", "--out", str(tmp_path)]) == 0
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {
        p.name: p.read_text() for p in COMMITTED.glob("*.schema.json")}
    capsys.readouterr()
    assert main(["schema", "baselines"]) == 0
    assert capsys.readouterr().out == (COMMITTED / "baselines.schema.json").read_text()


def test_the_committed_baselines_validate() -> None:
    assert not _errors("baselines", json.loads((ROOT / "baselines.json").read_text()))


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_the_recorded_reports_validate(path: Path) -> None:
    assert not _errors("report", json.loads(gzip.decompress(path.read_bytes())))


def test_a_report_this_code_writes_validates(tmp_path: Path) -> None:
    report = json.loads(_session(tmp_path).write_report(complete=True).read_text())
    assert report["gates"] and report["measurements"]
    assert not _errors("report", report)


def test_the_schemas_catch_a_malformed_file() -> None:
    assert _errors("report", {"specgate_report": 2, "complete": "yes"})
    assert _errors("baselines", {"schema_version": 1, "rigs": {"r": {"m": {"c": {"1": {"n": "twelve"}}}}}})
