"""Parametrization of the perf tests on the rig's modes, prompt classes and concurrencies, and the
deselection of speculative-only gates on the no-speculation mode.
"""

from __future__ import annotations

import warnings

import pytest

from specgate.errors import ConfigError
from specgate.plugin.session import SpecgateSession


def parametrize_perf_test(metafunc: pytest.Metafunc, session: SpecgateSession) -> None:
    try:
        rig = session.settings.rig
        modes = session.modes_to_run()
    except ConfigError as exc:
        # Refused as a usage error once collection ends (refuse_bad_inputs): raised here it would be
        # a collection error, which pytest ends as "interrupted" (2), not as the bad input it is (4).
        session.config_error = exc
        return
    tier_marks = (getattr(pytest.mark, rig.tier), pytest.mark.perf)
    if "mode" in metafunc.fixturenames:
        # Every test gets the same mode list (same param indices): pytest keys its session-scoped
        # fixture cache and test reordering on them, so a shorter list for speculative-only tests
        # would start servers again. Non-speculative items of those tests are deselected later.
        # xdist_group: with --dist loadgroup every test of a mode runs on one worker (one server).
        metafunc.parametrize("mode", [pytest.param(m, id=m.name, marks=(*tier_marks, pytest.mark.xdist_group(m.name)))
                                      for m in modes], scope="session")
    if "prompt_class" in metafunc.fixturenames:
        metafunc.parametrize("prompt_class", [pytest.param(c, id=c.name, marks=tier_marks)
                                              for c in rig.prompt_classes])
    if "concurrency" in metafunc.fixturenames:
        metafunc.parametrize("concurrency", [pytest.param(n, id=f"c{n}", marks=tier_marks)
                                             for n in rig.protocol.concurrency])


def deselect_speculative_only(config: pytest.Config, items: list[pytest.Item], session: SpecgateSession) -> None:
    """Drop speculative-only gates of the no-speculation mode (see parametrize_perf_test), and the
    gates that need a live reference (``live_reference``) where it has none: outside an A/B."""
    keep, drop = [], []
    ab = False
    if any(item.get_closest_marker("live_reference") for item in items):  # a perf run: the rig is read
        import contextlib

        with contextlib.suppress(ConfigError):  # refused with its file and key by refuse_bad_inputs
            ab = session.settings.rig.comparing == "ab"
    for item in items:
        mode = getattr(item, "callspec", None) and item.callspec.params.get("mode")
        only_speculative = item.get_closest_marker("speculative_only") or (
            item.get_closest_marker("live_reference") and not ab)
        if only_speculative and mode is not None and not mode.is_speculative:
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    if keep and config.option.markexpr.strip() == "gpu":
        try:
            rig = session.settings.rig
        except ConfigError:
            return  # refused with its file and key by the input check (refuse_bad_inputs)
        if rig.tier != "gpu":
            warnings.warn(f"-m gpu selected but rig {rig.name!r} is a {rig.tier} rig: "
                          "pass --specgate-rig NAME of a gpu rig", stacklevel=1)
