"""Issue 62, build item 1: the run's settings carry the chance of a red A/A of the selection (``auto``
chooses its gating by it) for every committed rig; ``plan`` prints it (tests/test_host_memory.py, the Kimi
A/B's plan)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specgate.config.rig import load_rig
from specgate.decide.outcome import GATES
from specgate.decide.red_runs import AUTO_RED_BOUND
from specgate.decide.settings import RunSettings
from specgate.report.red_runs import red_run_lines
from specgate.store.baselines import load_baselines

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent
RIGS = sorted(p.stem for p in (ROOT / "fixtures" / "rigs").glob("*.toml"))


def _every_gate(rig) -> list[tuple[str, str, str, int]]:
    return [(gate, m.name, c.name, n) for m in rig.modes for c in rig.prompt_classes for n in rig.protocol.concurrency
            for gate in GATES]


@pytest.mark.parametrize("gating", [None, "auto"])
def test_every_committed_rig_has_a_red_run_bound_and_auto_holds_it_at_5_percent(gating):
    store = load_baselines(ROOT / "baselines.json")
    for name in RIGS:
        rig = load_rig(name, ROOT / "fixtures")
        run = RunSettings.resolve(rig, store, machine=None, gating={g: gating for g in GATES} if gating else None)
        chosen = run.for_selection(_every_gate(rig))
        assert chosen.red_runs is not None and red_run_lines(chosen.red_runs.to_dict()), name
        if gating == "auto":
            assert chosen.red_runs.bound <= AUTO_RED_BOUND + 1e-12, (name, chosen.red_runs.to_dict())
            assert chosen.family.gating == chosen.red_runs.family.gating

