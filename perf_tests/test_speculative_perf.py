"""The perf gates: one test per gate x mode x prompt class x concurrency level.

``mode``, ``prompt_class`` and ``concurrency`` are parametrized by specgate's plugin from the
rig (``--specgate-rig``); every test is marked with the rig's tier (``cpu`` or ``gpu``) and ``perf``.
The server for a mode starts once per session (session-scoped ``vllm_server``); the
measurement of a (mode, class, concurrency) window is taken once and shared by every gate.
"""

import pytest


def test_throughput(class_measurement, gatekeeper):
    """Decode tok/s against the stored figures (noise-aware)."""
    gatekeeper.throughput(class_measurement)


@pytest.mark.speculative_only
def test_acceptance(class_measurement, gatekeeper):
    """Mean acceptance length, acceptance rate and per-position rates against the stored figures."""
    gatekeeper.acceptance(class_measurement)


@pytest.mark.speculative_only
def test_backfire(class_measurement, gatekeeper):
    """Speculation must not be slower than no speculation measured in the same session."""
    gatekeeper.backfire(class_measurement)


@pytest.mark.speculative_only
def test_lossless(class_measurement, gatekeeper):
    """Greedy outputs match the no-speculation mode's (within the rig's allowed share)."""
    gatekeeper.lossless(class_measurement)


@pytest.mark.live_reference
def test_ttft(class_measurement, gatekeeper):
    """Time to first token against a live reference (an A/B's reference side, or no speculation)."""
    gatekeeper.ttft(class_measurement)
