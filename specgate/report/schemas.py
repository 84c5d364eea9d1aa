"""JSON schemas of ``report.json`` and ``baselines.json`` (``python -m specgate schema --out
docs/schemas``; the fast tier checks the committed ones are current). The report's models name the
keys a reader can rely on and leave the rest open (``extra="allow"``): a report gains keys as
specgate grows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from specgate.store.baselines import BaselineFile


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class RequestRecord(_Open):
    """One request (``specgate.measure.client.RequestRecord``); times are the client's
    perf_counter seconds."""

    request_id: str = Field(description="mode/prompt class/prompt id#repeat")
    mode: str
    prompt_class: str
    prompt_id: str
    concurrency: int
    started_at: float
    first_token_at: float | None
    last_token_at: float | None
    finished_at: float
    chunk_times: list[float] = Field(
        description="receive time of each chunk that carried generated text")
    prompt_tokens: int
    completion_tokens: int
    text: str
    finish_reason: str | None
    ttft_s: float | None = None
    tpot_s: float | None = None
    decode_tokens_per_s: float | None = Field(
        default=None, description="the rate every speed gate compares")
    e2e_tokens_per_s: float | None = None
    spec_decode: dict[str, Any] | None = Field(
        default=None, description="vLLM's own acceptance of this request "
        "(--per-request-spec-decode-metrics); absent without it")
    empty_chunks: int = Field(default=0, description="chunks that carried no text (each an engine "
                              "step all the same); absent in reports before 2026-12-06")


class Measurement(_Open):
    """One window: (mode, prompt class, concurrency) on one server, with its partner's window when
    two servers were measured together."""

    rig: str
    mode: str
    prompt_class: str
    concurrency: int
    wall_s: float
    aggregate_tokens_per_s: float | None = None
    server_decode_tokens_per_s: float | None = Field(
        default=None, description="vLLM's own decode rate (TPOT)")
    server_metric_source: str | None = None
    server_decode_steps: float | None = Field(
        default=None, description="vLLM's decode steps for the window's requests (its "
        "inter-token latency observations); absent: not exported")
    acceptance: dict[str, Any] | None = Field(
        default=None, description="speculative acceptance; None without speculation")
    records: list[RequestRecord]
    arrangement: str | None = Field(default=None, description="solo, duet or alternation")
    design: str | None = Field(
        default=None, description="arrangement's name in reports before 2026-12-05")
    role: str | None = Field(
        default=None, description="subject or partner: the window's role in its duet")
    ab_side: str | None = Field(
        default=None, description="in an A/B: candidate or reference; None outside one")
    side: str | None = Field(
        default=None, description="reports before 2026-12-05: subject, partner or reference")
    partner: Measurement | None = None
    groups: list[dict[str, Any]] | None = None
    pairs: list[dict[str, Any]] | None = Field(
        default=None, description="groups' key in reports before 2026-12-05")
    first_look_share: float | None = None
    follow_up: str | None = Field(
        default=None, description="why the window got follow-up rounds; None: none")
    follow_up_skipped: str | None = None


class GateResult(_Open):
    """One gate's verdict on one window."""

    gate: str = Field(description="throughput, backfire, acceptance, ab, stored_ratio, level, ...")
    mode: str
    prompt_class: str
    concurrency: int
    outcome: str | None = Field(default=None, description="see specgate.decide.outcome.Outcome")
    passed: bool | None
    verdict: str | None = None
    message: str
    declared: Any = None
    details: dict[str, Any] = Field(
        default_factory=dict, description="the comparison: ratio, interval, n, ...")
    gating: Literal["gate", "report"] | None = Field(
        default=None, description="gate: it could fail the run (an undecided one too); report: it "
        "never could; absent: no gating set, the outcome policy alone (specgate.decide.outcome)")
    gating_reason: str | None = Field(
        default=None, description="why it gated the run or was reported only")


class Failure(_Open):
    """A window that could not be measured."""

    mode: str
    prompt_class: str
    concurrency: int
    error: str


class RigSummary(_Open):
    name: str
    tier: str
    model: str
    reference_mode: str | None = None
    protocol: dict[str, Any]
    modes: dict[str, Any] = Field(
        description="mode -> its speculative_config (None: no speculation)")


class ReportFile(_Open):
    """``report.json``: written by every perf session (``.specgate/runs/<run>/report.json``)."""

    model_config = ConfigDict(extra="allow", title="specgate report.json")

    specgate_report: Literal[1] = Field(description="the format's version")
    complete: bool = Field(
        description="False: the session was interrupted; what it measured is kept")
    written_at: str
    rig: RigSummary
    attached: bool = Field(
        description="measured a server specgate did not start (--specgate-vllm-url)")
    fingerprints: dict[str, dict[str, Any]] = Field(
        description="mode -> what its numbers were measured on")
    servers: dict[str, Any]
    measurements: list[Measurement]
    failures: list[Failure]
    gates: list[GateResult]
    worker: str | None = None
    deferred: list[list[Any]] = Field(
        default=[], description="windows whose gates waited for a later test")
    deferred_tests: dict[str, list[Any]] = Field(
        default={}, description="test id -> [gate, mode, prompt class, concurrency]")
    undecided: list[dict[str, Any]] = []
    outcome_policy: dict[str, str] | None = Field(
        default=None, description="gate -> how an undecided verdict counts")
    breakeven: list[dict[str, Any]] | None = Field(
        default=None, description="derived: renderers recompute it")
    gating: dict[str, str] | None = Field(
        default=None, description="gate -> auto | gate | report, where set")
    family: dict[str, Any] | None = Field(
        default=None, description="the gates with an interval that can fail the run "
        "(gating_decisions), each one's confidence and one-sided false-alarm level, the session's "
        "Bonferroni bound, family_false_alarm if set")
    start_order: dict[str, Any] | None = Field(
        default=None,
        description="an A/B's start order: seed, and first: mode -> the side started first")
    red_runs: dict[str, Any] | None = Field(
        default=None, description="the chance of a red run with nothing changed (a FAIL, or an "
        "undecided gate that gates): bound, fail_bound, gates_counted, confidence, limit (gating "
        "= auto), the largest gates' chances")


SCHEMAS = {"report": ReportFile, "baselines": BaselineFile}


def schema(name: str) -> dict[str, Any]:
    """The JSON schema (draft 2020-12) of ``report`` or ``baselines``."""
    model = SCHEMAS[name]
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **model.model_json_schema()}


def schema_text(name: str) -> str:
    return json.dumps(schema(name), indent=2, sort_keys=True) + "\n"


def write_schemas(folder: Path) -> list[Path]:
    """``<folder>/report.schema.json`` and ``<folder>/baselines.schema.json``."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in SCHEMAS:
        path = folder / f"{name}.schema.json"
        path.write_text(schema_text(name))
        paths.append(path)
    return paths
