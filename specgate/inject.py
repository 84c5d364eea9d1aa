"""A real, known-size regression inside vLLM: a vLLM general plugin that lengthens every engine
step by a set fraction of that step's own measured duration.

Registered under the entry-point group ``vllm.general_plugins`` (pyproject.toml), so every vLLM
process of an environment where specgate is installed runs :func:`register`. It is inert unless
the server's environment sets one of:

- ``SPECGATE_SLOWDOWN=0.10``: each engine step takes 10 % longer (a fraction in [0, 5]);
- ``SPECGATE_SLOWDOWN_FILE=/path``: the fraction is read from that file (re-read when it
  changes, checked at most every 0.2 s), so a calibration can change it on a running server.

The patch wraps ``EngineCore.step`` and ``EngineCore.step_with_batch_queue``: only the engine-core
process steps an engine, so the API server and the workers are untouched. After a step that ran
the model, the engine waits ``fraction x (the step's duration)``: a sleep, then a short spin for
the last 0.2 ms, so small steps get their share too. What it costs on each side is what a real
regression of the engine loop costs: the scheduler, the model and the sampler run as before.

Import-light on purpose (stdlib only): it is imported into every vLLM process.
"""

from __future__ import annotations

import functools
import os
import sys
import time

ENV_FRACTION = "SPECGATE_SLOWDOWN"
ENV_FILE = "SPECGATE_SLOWDOWN_FILE"
MAX_FRACTION = 5.0
SPIN_S = 0.0002
RECHECK_S = 0.2


def parse_fraction(text: str, *, source: str) -> float:
    """A slowdown fraction from text; raises ValueError naming ``source`` when it is not one."""
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError(f"{source}: {text.strip()!r} is not a number (a slowdown fraction like 0.10)") from None
    if not 0.0 <= value <= MAX_FRACTION:
        raise ValueError(f"{source}: {value} is outside [0, {MAX_FRACTION:g}] (0.10 means each step takes 10 % longer)")
    return value


class Slowdown:
    """The current fraction: fixed from ``SPECGATE_SLOWDOWN``, or followed in a file."""

    def __init__(self, fixed: float | None = None, path: str | None = None, *, clock=time.monotonic) -> None:
        self.fixed = fixed
        self.path = path
        self._clock = clock
        self._value = fixed or 0.0
        self._checked = float("-inf")
        self._mtime: float | None = None

    @classmethod
    def from_environ(cls, environ=os.environ) -> Slowdown | None:
        path = environ.get(ENV_FILE) or None
        raw = environ.get(ENV_FRACTION)
        if raw is None and path is None:
            return None
        fixed = parse_fraction(raw, source=ENV_FRACTION) if raw is not None else None
        return cls(fixed, path)

    def fraction(self) -> float:
        if self.path is None:
            return self._value
        now = self._clock()
        if now - self._checked < RECHECK_S:
            return self._value
        self._checked = now
        try:
            mtime = os.stat(self.path).st_mtime
            if mtime != self._mtime:
                with open(self.path) as handle:
                    self._value = parse_fraction(handle.read(), source=self.path)
                self._mtime = mtime
        except FileNotFoundError:
            self._value, self._mtime = self.fixed or 0.0, None
        except (OSError, ValueError) as exc:  # keep the last good value; say why once per change
            print(f"[specgate.inject] {exc}; keeping slowdown {self._value}", file=sys.stderr, flush=True)
            self._mtime = mtime if "mtime" in locals() else None
        return self._value


def wait(seconds: float, *, sleep=time.sleep, clock=time.perf_counter) -> None:
    """Wait ``seconds`` precisely: sleep most of it, spin the last ``SPIN_S``."""
    if seconds <= 0:
        return
    end = clock() + seconds
    if seconds > SPIN_S:
        sleep(seconds - SPIN_S)
    while clock() < end:
        pass


def slowed(step, slowdown: Slowdown):
    """``step`` (an EngineCore step method returning (outputs, model_executed)) made slower."""

    @functools.wraps(step)
    def wrapper(self, *args, **kwargs):
        started = time.perf_counter()
        result = step(self, *args, **kwargs)
        fraction = slowdown.fraction()
        if fraction > 0 and isinstance(result, tuple) and len(result) == 2 and result[1]:
            wait(fraction * (time.perf_counter() - started))
        return result

    wrapper.__specgate_slowdown__ = slowdown  # type: ignore[attr-defined]
    return wrapper


def patch(engine_core_cls, slowdown: Slowdown) -> list[str]:
    """Wrap the step methods of ``engine_core_cls`` once; returns the names wrapped."""
    done = []
    for name in ("step", "step_with_batch_queue"):
        method = getattr(engine_core_cls, name, None)
        if method is None or hasattr(method, "__specgate_slowdown__"):
            continue
        setattr(engine_core_cls, name, slowed(method, slowdown))
        done.append(name)
    return done


def register() -> None:
    """The ``vllm.general_plugins`` entry point: inert unless the environment asks for a slowdown."""
    try:
        slowdown = Slowdown.from_environ()
    except ValueError as exc:
        raise SystemExit(f"specgate slowdown injector: {exc}") from None
    if slowdown is None:
        return
    from vllm.v1.engine.core import EngineCore

    names = patch(EngineCore, slowdown)
    if names:
        what = f"{slowdown.fixed}" if slowdown.path is None else f"read from {slowdown.path}"
        print(f"[specgate.inject] pid {os.getpid()}: EngineCore.{'/'.join(names)} slowed by {what}",
              file=sys.stderr, flush=True)
