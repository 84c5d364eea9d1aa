"""specgate.decide.settings: one window's gate settings, resolved once (WindowSettings, window_settings), and
the run's (RunSettings: every window's, at the family's confidence once the selection is known). The
gating (can_decide, resolve_gating) is tested in test_gating.py."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
from fixture_copy import copy_fixtures, quick_rig_with_a_declared_backfire

from specgate.config.rig import AB, Gates, load_rig
from specgate.decide.outcome import GATES, Family
from specgate.decide.settings import WindowSettings, window_settings
from specgate.plugin.resolve import SessionOptions
from specgate.plugin.session import SpecgateSession

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent
RIG = "cpu-smollm2-quick"  # two classes; ngram's backfire on coding is declared


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    return load_rig(RIG, quick_rig_with_a_declared_backfire(copy_fixtures(tmp_path_factory.mktemp("q") / "fixtures")))


def _edited_rig(tmp_path: Path, old: str, new: str) -> Path:
    """A copy of fixtures/ whose quick rig has ``old`` replaced by ``new`` (once)."""
    fixtures = quick_rig_with_a_declared_backfire(copy_fixtures(tmp_path / "fixtures"))
    rig_file = fixtures / "rigs" / f"{RIG}.toml"
    text = rig_file.read_text()
    assert old in text, f"{rig_file} no longer contains {old!r}: update this test"
    rig_file.write_text(text.replace(old, new, 1))
    return fixtures


def _session(tmp_path: Path, fixtures: Path, **options) -> SpecgateSession:
    return SpecgateSession(SessionOptions(rig_name=RIG, fixtures_dir=fixtures, baselines_path=tmp_path / "b.json",
                                          run_dir=tmp_path / "run", repo_root=ROOT, **options))


def test_the_settings_of_a_window_are_frozen_and_name_it(rig):
    ngram = window_settings(rig, "ngram", "extraction", 4)
    assert (ngram.rig, ngram.mode, ngram.prompt_class, ngram.concurrency) == (RIG, "ngram", "extraction", 4)
    assert ngram.reference_mode == "no_spec" and ngram.speculative
    assert not window_settings(rig, "no_spec", "extraction").speculative
    assert ngram.comparing == "duet" and ngram.arrangement == rig.arrangement
    assert ngram.gating == {} and ngram.gating_of("backfire") is None  # the session fills the gating in
    with pytest.raises(dataclasses.FrozenInstanceError):
        ngram.mode = "no_spec"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        ngram.thresholds = Gates()  # type: ignore[misc]


def test_an_ab_rig_compares_its_windows_as_an_ab(rig):
    assert window_settings(rig.model_copy(update={"ab": AB()}), "ngram", "coding").comparing == "ab"


def test_the_outcome_policy_is_the_rigs_unless_one_is_given(rig):
    assert window_settings(rig, "ngram", "coding").outcome_policy == rig.gates.outcome_policy
    given = {"undecided": "fail", "not_stored": "skip", "other_machine": "skip", "not_run": "skip"}
    assert window_settings(rig, "ngram", "coding", outcome_policy=given).outcome_policy == given


def test_a_class_override_in_the_rig_applies_to_its_class_only(tmp_path):
    fixtures = _edited_rig(tmp_path, "[gates]\n", "[gates.classes.coding]\nthroughput_tolerance = 0.08\n"
                                                  "min_speedup = 0.9\nttft_tolerance = 0.3\n\n[gates]\n")
    rig = load_rig(RIG, fixtures)
    coding = window_settings(rig, "ngram", "coding").thresholds
    extraction = window_settings(rig, "ngram", "extraction").thresholds
    assert (coding.throughput_tolerance, coding.min_speedup, coding.ttft_tolerance) == (0.08, 0.9, 0.3)
    assert (extraction.throughput_tolerance, extraction.min_speedup, extraction.ttft_tolerance) == (0.04, 1.0, 0.1)
    # what the class leaves unset stays the rig's
    assert coding.level_tolerance == extraction.level_tolerance == 0.25
    assert coding.acceptance_tolerance == extraction.acceptance_tolerance == 0.05
    # the override reaches the tolerance rule: the duet ratio's is the class's throughput_tolerance
    assert window_settings(rig, "ngram", "coding").tolerance_for(duet_ratio=True) == 0.08


def test_with_family_raises_the_confidence_and_leaves_the_rest(rig):
    own = window_settings(rig, "ngram", "extraction")
    held = own.with_family(0.99)
    assert held.confidence == 0.99 and held.thresholds.confidence == 0.99
    assert own.confidence == 0.95  # the rig's own settings are left as they were
    assert held.thresholds.model_dump(exclude={"confidence"}) == own.thresholds.model_dump(exclude={"confidence"})
    assert dataclasses.replace(held, thresholds=own.thresholds) == own
    assert own.with_family(own.confidence) is own


@pytest.mark.parametrize("level", [None, 0.25])
@pytest.mark.parametrize("ab", [None, 0.02])
def test_the_tolerances_follow_the_one_rule(rig, level, ab):
    gates = Gates(throughput_tolerance=0.04, level_tolerance=level, ab_tolerance=ab)
    duet = dataclasses.replace(window_settings(rig, "ngram", "extraction"), thresholds=gates)
    level_tolerance = level if level is not None else 0.04
    ab_tolerance = ab if ab is not None else 0.04
    assert (duet.level_tolerance, duet.ab_tolerance) == (level_tolerance, ab_tolerance)
    assert duet.tolerance_for(duet_ratio=True) == 0.04  # a stored duet ratio: throughput_tolerance
    assert duet.tolerance_for(duet_ratio=False) == level_tolerance


SPEED_TOLERANCES = {"throughput_tolerance", "level_tolerance", "ab_tolerance", "level_gate_tolerance",
                    "ab_gate_tolerance"}


def test_the_gates_read_the_speed_tolerances_from_the_window_settings_only():
    # one rule (WindowSettings.tolerance_for and its properties): a gate that read [gates] itself would
    # miss a rule the settings apply (a duet ratio's tolerance, ab_tolerance over throughput_tolerance)
    tree = ast.parse((ROOT / "specgate" / "decide" / "gates.py").read_text())
    found = [f"gates.py:{node.lineno}: {ast.unparse(node)}" for node in ast.walk(tree)
             if isinstance(node, ast.Attribute) and node.attr in SPEED_TOLERANCES
             and not (isinstance(node.value, ast.Name) and node.value.id == "settings")]
    assert found == []


def test_a_declared_backfire_is_set_for_the_modes_and_classes_it_covers_only(rig):
    declared = window_settings(rig, "ngram", "coding").declared_backfire
    assert declared is not None and declared.reason.startswith("break-even on 2 CPU cores")
    assert window_settings(rig, "ngram", "extraction").declared_backfire is None
    assert window_settings(rig, "no_spec", "coding").declared_backfire is None


def test_the_run_resolves_every_windows_settings_once(tmp_path):
    session = _session(tmp_path, ROOT / "fixtures", undecided_policy={"undecided": "fail"})
    run = session.settings
    assert session.settings is run  # resolved once
    first = run.window("ngram", "extraction", 1)
    assert isinstance(first, WindowSettings)
    assert run.window("ngram", "extraction", 1) is first
    assert run.window("ngram", "coding", 1) is not first
    assert set(run.windows) == {(m.name, c.name, 1) for m in run.rig.modes for c in run.rig.prompt_classes}
    # the run's own parts: each gate's gating, the option's outcome policy over the rig's
    assert set(first.gating) == set(GATES)
    assert first.gating["backfire"] == (None, "no gating set: the outcome policy ([gates] undecided)")
    assert first.gating_of("backfire") is None
    assert first.outcome_policy == run.outcome_policy == {**run.rig.gates.outcome_policy, "undecided": "fail"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.family = None  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        session.options.update = "regen"  # type: ignore[misc]
    with pytest.raises(TypeError):
        run.windows[("ngram", "extraction", 1)] = first  # type: ignore[index]


def test_after_plan_family_the_settings_are_resolved_again_at_the_familys_confidence(tmp_path):
    fixtures = _edited_rig(tmp_path, "[gates]\n", '[gates]\ngating = "gate"\nfamily_false_alarm = 0.05\n')
    session = _session(tmp_path, fixtures)
    before = session.settings.window("ngram", "extraction", 1)
    assert before.confidence == 0.95
    # backfire gates on both classes, one of them a declared backfire (never fails): one gate in the family
    session.plan_family([("backfire", "ngram", "extraction", 1), ("backfire", "ngram", "coding", 1),
                         ("throughput", "ngram", "extraction", 1)])
    assert session.settings.family.gating == 2
    after = session.settings.window("ngram", "extraction", 1)
    assert after.confidence == pytest.approx(session.settings.family.confidence)
    assert after.confidence == pytest.approx(1 - 2 * 0.05 / 2)
    assert after is session.settings.window("ngram", "extraction", 1)
    assert session.settings.rig.gates.confidence == 0.95  # the rig itself is not swapped


def test_a_family_below_the_rigs_confidence_never_lowers_it(tmp_path):
    fixtures = _edited_rig(tmp_path, "[gates]\n", "[gates]\nconfidence = 0.99\n")
    session = _session(tmp_path, fixtures)
    # e.g. a worker's family absorbed by the xdist controller: a looser family never loosens a window
    looser = session.settings.with_family(Family(gating=3, confidence=0.95, controlled=None))
    assert looser.window("ngram", "extraction", 1).confidence == 0.99
    tighter = session.settings.with_family(Family(gating=3, confidence=0.999, controlled=0.0015))
    assert tighter.window("ngram", "extraction", 1).confidence == 0.999
    assert session.settings.window("ngram", "extraction", 1).confidence == 0.99  # frozen: each is a new one
