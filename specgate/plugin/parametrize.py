"""Parametrization of the perf tests on the rig's modes, classes and concurrencies, and the
deselection of speculative-only gates on the no-speculation mode."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable

import pytest

from specgate.errors import ConfigError
from specgate.plugin.cost import gate_key
from specgate.plugin.session import SpecgateSession


def parametrize_perf_test(metafunc: pytest.Metafunc, session: SpecgateSession) -> None:
    try:
        rig = session.settings.rig
        modes = session.modes_to_run()
    except ConfigError as exc:
        # refused once collection ends (refuse_bad_inputs): raised here it would read as
        # "interrupted" (2), not as the bad input (4) it is
        session.config_error = exc
        return
    tier_marks = (getattr(pytest.mark, rig.tier), pytest.mark.perf)
    if "mode" in metafunc.fixturenames:
        # every test gets the same mode list (same param indices), or pytest would start servers
        # again; the non-speculative items of speculative-only tests are deselected later
        # xdist_group: with --dist loadgroup every test of a mode runs on one worker (one server).
        metafunc.parametrize("mode", [
            pytest.param(m, id=m.name, marks=(*tier_marks, pytest.mark.xdist_group(m.name)))
            for m in modes], scope="session")
    if "prompt_class" in metafunc.fixturenames:
        metafunc.parametrize("prompt_class", [pytest.param(c, id=c.name, marks=tier_marks)
                                              for c in rig.prompt_classes])
    if "concurrency" in metafunc.fixturenames:
        metafunc.parametrize("concurrency", [pytest.param(n, id=f"c{n}", marks=tier_marks)
                                             for n in rig.protocol.concurrency])


def deselect(config: pytest.Config, items: list[pytest.Item],
             dropped: Callable[[pytest.Item], bool]) -> list[pytest.Item]:
    """Deselect (as pytest reports it) the ``items`` that ``dropped`` names; returns them."""
    keep, drop = [], []
    for item in items:
        (drop if dropped(item) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    return drop


def deselect_speculative_only(config: pytest.Config, items: list[pytest.Item],
                              session: SpecgateSession) -> None:
    """Drop speculative-only gates of no speculation, and live-reference gates outside an A/B."""
    ab = False
    if any(item.get_closest_marker("live_reference") for item in items):  # a perf run: read the rig
        with contextlib.suppress(ConfigError):  # refused with its file and key by refuse_bad_inputs
            ab = session.settings.rig.comparing == "ab"

    def only_speculative(item: pytest.Item) -> bool:
        mode = getattr(item, "callspec", None) and item.callspec.params.get("mode")
        speculative_only = item.get_closest_marker("speculative_only") or (
            item.get_closest_marker("live_reference") and not ab)
        return bool(speculative_only and mode is not None and not mode.is_speculative)

    deselect(config, items, only_speculative)
    if items and config.option.markexpr.strip() == "gpu":
        try:
            rig = session.settings.rig
        except ConfigError:
            return  # refused with its file and key by the input check (refuse_bad_inputs)
        if rig.tier != "gpu":
            warnings.warn(f"-m gpu selected but rig {rig.name!r} is a {rig.tier} rig: pass "
                          "--specgate-rig NAME of a gpu rig", stacklevel=1)


NOT_RUN_HERE = pytest.StashKey[list[str]]()


def deselect_not_deciding_here(config: pytest.Config, items: list[pytest.Item],
                               session: SpecgateSession) -> None:
    """Leave out, before any server starts, the gates that cannot decide in this run, each kind said
    in one line: the rig's ``[gates] left_out``, and the throughput gates (other than an A/B's)
    with only another machine's stored figures (kept in a run that stores figures)."""
    keys = {id(item): key for item in items if (key := gate_key(item)) is not None}
    if not keys:
        return
    try:
        run = session.settings
    except ConfigError:
        return  # refused with its file and key by refuse_bad_inputs
    left_out = run.rig.gates.left_out
    elsewhere: list[tuple[str, str, str, int]] = []
    # the windows whose reference the selected gates of other modes read (backfire, lossless, TTFT)
    needed = {(c, n) for g, mode, c, n in keys.values()
              if mode != run.rig.reference_mode and g in _READ_THE_REFERENCE and g not in left_out}

    def not_deciding(item: pytest.Item) -> bool:
        key = keys.get(id(item))
        if key is not None and key[0] in left_out:  # a read reference is measured, its gate skipped
            return not _measures_a_read_reference(run, key, needed)
        if (key is not None and session.options.update == "off"
                and _stored_elsewhere_only(run, key, needed)):
            elsewhere.append(key)
            return True
        return False

    if not deselect(config, items, not_deciding):
        return
    lines = [f"specgate: left out by rig {run.rig.name}: {gate} ({why})"
             for gate, why in left_out.items()]
    if elsewhere:
        lines.append(f"specgate: not run here: {len(elsewhere)} throughput gate(s) with only "
                     "another machine's stored figures (python -m specgate build-history --rig "
                     f"{run.rig.name})")
    config.stash[NOT_RUN_HERE] = lines


_READ_THE_REFERENCE = ("backfire", "lossless", "ttft")


def _stored_elsewhere_only(run, key: tuple[str, str, str, int],
                           needed: set[tuple[str, int]]) -> bool:
    from specgate.store.baselines import lookup

    gate, mode, prompt_class, concurrency = key
    window = run.window(mode, prompt_class, concurrency)
    if (gate != "throughput" or window.comparing == "ab"
            or _measures_a_read_reference(run, key, needed)):
        return False
    rig = run.rig.name
    return (lookup(run.store, rig, mode, prompt_class, concurrency, machine=run.machine) is None
            and lookup(run.store, rig, mode, prompt_class, concurrency) is not None)


def _measures_a_read_reference(run, key: tuple[str, str, str, int],
                               needed: set[tuple[str, int]]) -> bool:
    """The reference's throughput test of a window measured on its own (not in a duet or an A/B)
    whose figures the other modes' selected gates read: it stays, to measure the window."""
    gate, mode, prompt_class, concurrency = key
    window = run.window(mode, prompt_class, concurrency)
    return (gate == "throughput" and mode == run.rig.reference_mode and window.comparing != "ab"
            and window.arrangement.name != "duet" and (prompt_class, concurrency) in needed)
