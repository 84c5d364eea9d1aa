"""Servers that take turns on the same GPUs with vLLM sleep mode (arrangement "alternation"): a
swap (timed) is ``POST /sleep?level=N`` on the awake one, a check that it sleeps and that the GPU
memory came free, then ``POST /wake_up`` on the other. Sleep level 2 discards the weights (a wake
reloads them), so it is chosen only when the host lacks memory for sleep level 1."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from specgate.config.arrangement import drafter_in, dummy_weights, gpu_memory_utilization
from specgate.config.defaults import EXPECTED_SWAP_S
from specgate.durations import format_elapsed
from specgate.errors import ServerError, ServerStartError
from specgate.serve.gpu import is_gpu_id, nvml
from specgate.serve.host_memory import GiB, host_available_gib, sleep_level_1_need_gib
from specgate.serve.http import auth_headers, tls_context

SWAP_TIMEOUT_S = 1800.0  # a first sleep at sleep level 1 copies every weight to host memory
# A sleeping server keeps ~1 GiB per GPU: a wake needs its share free within this fraction.
GPU_FREE_SLACK = 0.03
LOG_TAIL_LINES = 30
_MODEL_LOADING = re.compile(r"Model loading took ([0-9.]+) ?GiB")


class SleepError(ServerError):
    """A server of an alternation would not sleep or wake, or its memory did not come free."""


def with_sleep_mode(spec):
    """A server spec (specgate.serve.server.ServerSpec) started so that it can sleep."""
    argv = list(spec.argv)
    if "--enable-sleep-mode" not in argv:
        argv.append("--enable-sleep-mode")
    return dataclasses.replace(spec, argv=argv, env={**spec.env, "VLLM_SERVER_DEV_MODE": "1"})


def weights_gib_from_log(text: str, gpus: int) -> float | None:
    """The GiB a server's weights take over its ``gpus`` GPUs, from vLLM's "Model loading took
    X GiB" (one line per worker; the largest share times ``gpus``), or None."""
    shares = [float(m) for m in _MODEL_LOADING.findall(text)]
    return max(shares) * gpus if shares else None


def weights_gib_in_folder(model: str) -> float | None:
    """The size of the weight files in a local model folder, in GiB, or None (none there)."""
    folder = Path(model)
    if not folder.is_dir():
        return None
    total = sum(p.stat().st_size for pattern in ("*.safetensors", "*.bin", "*.pt")
                for p in folder.glob(pattern))
    return total / GiB if total else None


def choose_level(need_gib: float | None, available_gib: float, *,
                 forced: int | None = None) -> tuple[int, str]:
    """The sleep level of a server of ``need_gib`` of weights (None: not known), and why."""
    if forced is not None:
        return forced, f"sleep level {forced}: set by the rig (sleep_level)"
    if need_gib is None:
        return 1, ("sleep level 1: the weights' size is not known (set sleep_host_memory_gib in "
                   f"the rig); the host has {available_gib:.0f} GiB available")
    wanted = sleep_level_1_need_gib([need_gib])
    if available_gib >= wanted:
        return 1, (f"sleep level 1: the host has {available_gib:.0f} GiB available for the "
                   f"sleeping server's {need_gib:.1f} GiB of weights")
    return 2, ("sleep level 2 (weights discarded, reloaded from the model's files at every wake; "
               f"slower swaps, timed): sleep level 1 would keep {need_gib:.1f} GiB of weights in "
               f"host memory (with headroom {wanted:.0f} GiB) and the host has "
               f"{available_gib:.0f} GiB available")


def nvml_free_fractions(gpus: str | None) -> list[tuple[str, float]] | None:
    """(GPU, free memory / total) of the GPUs ``gpus`` names (None: all); None without NVML."""
    try:
        with nvml() as pynvml:
            wanted = [g.strip() for g in gpus.split(",")] if gpus else None
            out = []
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = pynvml.nvmlDeviceGetUUID(handle)
                uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
                if wanted is not None and not any(w == str(index) or (is_gpu_id(w) and w == uuid)
                                                  for w in wanted):
                    continue
                info = pynvml.nvmlDeviceGetMemoryInfo(handle)
                out.append((str(index), info.free / info.total))
            return out
    except Exception:  # no NVML, no driver: the /is_sleeping check still stands
        return None


@dataclass
class _Sleeper:
    """One server of the alternation and what is known of it."""

    server: Any
    level: int | None = None  # chosen at its first sleep
    level_why: str = ""
    sleeping: bool = False


@dataclass
class SleepController:
    """The servers of one comparison taking turns on the same GPUs: the awake one, the swaps and
    their sleep levels (``available_gib``, ``gpu_free`` injectable; its None skips the check)."""

    rig: Any
    progress: Callable[[str], None] = lambda line: None
    gpus: str | None = None
    available_gib: Callable[[], float] = host_available_gib
    gpu_free: Callable[[str | None], Sequence[tuple[str, float]] | None] = nvml_free_fractions
    # Names of the kept servers asleep at sleep level 1 but for these pids (the registry's).
    kept_asleep: Callable[[set[int]], list[str]] = lambda pids: []
    sleepers: list[_Sleeper] = field(default_factory=list)
    swaps: list[dict[str, Any]] = field(default_factory=list)
    failure: str | None = None  # a failed swap: every later swap fails with it

    def _sleeper(self, server: Any) -> _Sleeper:
        for sleeper in self.sleepers:
            if sleeper.server is server:
                return sleeper
        raise SleepError(f"server {server.label} is not one of this alternation's servers")

    @property
    def awake(self) -> Any | None:
        return next((t.server for t in self.sleepers if not t.sleeping), None)

    def add(self, server: Any, *, asleep_at: int | None = None) -> None:
        """A server just started (awake), or a kept one left asleep at sleep level ``asleep_at``."""
        if any(t.server is server for t in self.sleepers):
            return
        if asleep_at is None:
            self.sleepers.append(_Sleeper(server))
        else:
            why = f"sleep level {asleep_at}, as it slept when an earlier session left it"
            self.sleepers.append(_Sleeper(server, level=asleep_at, sleeping=True, level_why=why))

    def has_slept(self, server: Any) -> bool:
        """Whether ``server`` has been asleep (its sleep level is chosen at its first sleep)."""
        return self._sleeper(server).level is not None

    def remove(self, server: Any) -> None:
        """A server torn down: it no longer takes turns."""
        self.sleepers = [t for t in self.sleepers if t.server is not server]

    async def leave(self, server: Any, *, stays_running: bool) -> None:
        """A server's last turn is over. One that stays running (--specgate-keep-servers) goes to
        sleep first when awake: the next server to start must find the GPUs free."""
        sleeper = next((t for t in self.sleepers if t.server is server), None)
        self.remove(server)
        if not stays_running or sleeper is None or sleeper.sleeping or self.failure is not None:
            return
        try:
            server.check_alive()
        except ServerError:
            return  # it died: the test that met it said so, and the others take turns on
        try:
            await self._sleep(server, sleeper)
        except SleepError as exc:
            # only this server holds the GPUs awake: stop it, so the next start finds them free
            stop = getattr(server, "stop", None)
            if stop is not None:
                stop()
            raise SleepError(f"{exc}\n(it was leaving the alternation after its mode's last "
                             "test; it was stopped)") from None

    def require_room(self, spec: Any) -> None:
        """Before a server of the alternation starts: the GPUs must have its share free (sleeping
        servers keep ~1 GiB per GPU, which a lone server's guard would refuse)."""
        short = self._short_of(spec.argv)
        if short:
            shown, need = short
            raise ServerStartError(
                f"refusing to start {spec.label}: it needs {need * 100:.0f} % of the GPU memory "
                f"(less {GPU_FREE_SLACK * 100:.0f} % slack) and {shown}; kept servers are listed "
                "by `python -m specgate servers`, and nvidia-smi shows the rest")

    def _short_of(self, argv: Sequence[str]) -> tuple[str, float] | None:
        """The GPUs short of a server of ``argv`` (its --gpu-memory-utilization less the slack),
        as shown in a message, and that share; None when they have it or cannot say."""
        need = gpu_memory_utilization(argv)
        if need is None:
            return None
        short = [(gpu, free) for gpu, free in self.gpu_free(self.gpus) or ()
                 if free < need - GPU_FREE_SLACK]
        if not short:
            return None
        return ", ".join(f"GPU {gpu} {free * 100:.0f} % free" for gpu, free in short), need

    def check(self) -> None:
        """Raise the earlier swap failure, if any: the alternation is over."""
        if self.failure is not None:
            raise SleepError("an earlier swap of this alternation failed, so no window can run:\n"
                             f"{self.failure}")

    def typical_swap_s(self) -> float:
        """A swap's cost as measured so far (the median of the later ones: a first sleep copies
        the weights), else the rig's ``[estimate] swap_s``."""
        measured = [s["sleep_s"] + s["wake_s"] for s in self.swaps if s.get("sleep_s") is not None
                    and not s.get("first_sleep") and not s.get("before_start") and s.get("from")]
        if measured:
            return statistics.median(measured)
        estimate = getattr(self.rig, "estimate", None)
        return estimate.swap_s if estimate is not None else EXPECTED_SWAP_S

    async def make_room(self) -> None:
        """Before a server starts: put the awake one to sleep."""
        self.check()
        awake = self.awake
        if awake is not None:
            started = time.monotonic()
            first = self._sleeper(awake).level is None
            try:
                await self._sleep(awake)
            except SleepError as exc:
                self._fail(str(exc))
                raise
            self.swaps.append({"to": None, "from": awake.label,
                               "sleep_s": round(time.monotonic() - started, 3),
                               "wake_s": 0.0, "first_sleep": first, "before_start": True})

    async def activate(self, server: Any) -> dict[str, Any] | None:
        """Make ``server`` the awake one; the swap (timings), or None when it was awake already."""
        self.check()
        sleeper = self._sleeper(server)
        if not sleeper.sleeping:
            return None
        record: dict[str, Any] = {"to": server.label, "from": None, "sleep_s": 0.0,
                                  "first_sleep": False}
        other = self.awake
        try:
            if other is not None:
                record["from"] = other.label
                record["first_sleep"] = self._sleeper(other).level is None
                started = time.monotonic()
                await self._sleep(other)
                record["sleep_s"] = round(time.monotonic() - started, 3)
            self._check_gpu_free(server, other)
            started = time.monotonic()
            await self._wake(sleeper)
            record["wake_s"] = round(time.monotonic() - started, 3)
        except SleepError as exc:
            self._fail(str(exc))
            raise
        record["level"] = sleeper.level
        self.swaps.append(record)
        return record

    def _fail(self, message: str) -> None:
        """Remember why a swap failed and stop every server (one half asleep holds GPU memory)."""
        self.failure = message
        for sleeper in self.sleepers:
            stop = getattr(sleeper.server, "stop", None)
            if stop is not None:
                try:
                    stop()
                except Exception as exc:  # the failure being reported matters more
                    self.progress(f"alternation: stopping {sleeper.server.label} after the failed "
                                  f"swap: {exc}")

    def _client(self, server: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=server.base_url, headers=auth_headers(server.api_key),
                                 timeout=httpx.Timeout(SWAP_TIMEOUT_S, connect=10.0),
                                 transport=getattr(server, "transport", None), verify=tls_context())

    def _error(self, server: Any, what: str) -> SleepError:
        return SleepError(f"alternation: {server.label} {what}.\nLast {LOG_TAIL_LINES} lines of "
                          f"its log:\n{server.log_tail(LOG_TAIL_LINES)}")

    async def _post(self, client: httpx.AsyncClient, server: Any, path: str, what: str,
                    **kwargs: Any) -> None:
        try:
            response = await client.post(path, **kwargs)
        except httpx.HTTPError as exc:
            raise self._error(server, f"did not {what}: POST {path} failed: "
                              f"{type(exc).__name__}: {exc}") from None
        if response.status_code != 200:
            hint = (" (started without --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1?)"
                    if response.status_code == 404 else "")
            raise self._error(server, f"did not {what}: POST {path} answered HTTP "
                              f"{response.status_code}{hint}: {response.text[:300]}")

    async def _is_sleeping(self, client: httpx.AsyncClient, server: Any) -> bool:
        try:
            response = await client.get("/is_sleeping")
            response.raise_for_status()
            return bool(response.json()["is_sleeping"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            raise self._error(server, "did not say whether it sleeps: GET /is_sleeping: "
                              f"{type(exc).__name__}: {exc}") from None

    def _alive(self, server: Any) -> None:
        try:
            server.check_alive()
        except ServerError as exc:
            raise SleepError(f"alternation: {server.label} cannot take its turn: {exc}") from None

    async def _sleep(self, server: Any, sleeper: _Sleeper | None = None) -> None:
        sleeper = sleeper or self._sleeper(server)
        self._alive(server)
        if sleeper.level is None:
            sleeper.level, sleeper.level_why = self._choose_level(sleeper)
            self.progress(f"alternation: {server.label} sleeps at {sleeper.level_why}")
            if sleeper.level == 1:
                self.progress(f"alternation: putting {server.label} to sleep for the first time "
                              "(its weights are copied to host memory: ~24 s for 29 GiB)")
        started = time.monotonic()
        async with self._client(server) as client:
            await self._post(client, server, "/sleep", "go to sleep",
                             params={"level": sleeper.level})
            if not await self._is_sleeping(client, server):
                raise self._error(server, "answered POST /sleep but GET /is_sleeping says it is "
                                  "awake")
        sleeper.sleeping = True
        _note_sleep(server, sleeper.level)
        if time.monotonic() - started > 10:
            self.progress(f"alternation: {server.label} asleep after "
                          f"{format_elapsed(time.monotonic() - started)}")

    def _choose_level(self, sleeper: _Sleeper) -> tuple[int, str]:
        rig, server = self.rig, sleeper.server
        need = rig.sleep_host_memory_gib
        if need is None:
            log_path = getattr(server, "log_path", None)
            try:
                text = Path(log_path).read_text(errors="replace") if log_path else ""
            except OSError:
                text = ""
            need = (weights_gib_from_log(text, rig.gpus_per_server)
                    or weights_gib_in_folder(rig.model))
        level, why = choose_level(need, self.available_gib(), forced=rig.sleep_level)
        if level == 2 and rig.sleep_level is None:
            why += self._kept_elsewhere()
        dummy, drafter = dummy_weights(_argv(server)), drafter_in(_argv(server))
        if level == 2 and (dummy or drafter):
            cause = ("its weights are dummy (--load-format dummy), which vLLM 0.26 cannot reload, "
                     "and a server woken without them generates no text (tokens, but no text, so "
                     "no decode rate)" if dummy
                     else "its drafter's weights would not come back (vLLM's reload_weights "
                     "reloads the target model only)")
            fix = (f"Set sleep_level = 1 or leave it unset in {rig.path}" if rig.sleep_level == 2
                   else "Free host memory, or set sleep_host_memory_gib if the estimate is wrong, "
                   "or run this rig with arrangement = \"sequential\"")
            raise self._error(server, f"cannot sleep at sleep level 2: {cause}; {why}. {fix}")
        return level, why

    def _kept_elsewhere(self) -> str:
        """Kept servers asleep at sleep level 1 outside this alternation: their weights hold host
        memory that a sleep at sleep level 1 here would need."""
        ours = {getattr(getattr(t.server, "kept", None), "pid", None) for t in self.sleepers}
        others = self.kept_asleep(ours - {None})
        if not others:
            return ""
        return ("; kept servers asleep at sleep level 1 hold host memory for their weights: "
                f"{', '.join(others)} (`python -m specgate servers --stop NAME` frees it)")

    def _check_gpu_free(self, server: Any, other: Any | None) -> None:
        """Before a wake: the GPUs must have this server's share free."""
        short = self._short_of(_argv(server))
        if short:
            (shown, need), who = short, other if other is not None else server
            raise self._error(who, (
                f"{'went to sleep' if other is not None else 'sleeps'} but the GPU memory did not "
                f"come free for {server.label} ({shown}; it needs {need * 100:.0f} % less "
                f"{GPU_FREE_SLACK * 100:.0f} % slack)"))

    async def _wake(self, sleeper: _Sleeper) -> None:
        server = sleeper.server
        self._alive(server)
        async with self._client(server) as client:
            if sleeper.level == 2:
                # Sleep level 2 kept no weights: wake their memory, reload them, then the KV cache.
                await self._post(client, server, "/wake_up", "wake up its weights",
                                 params={"tags": "weights"})
                await self._post(client, server, "/collective_rpc", "reload its weights",
                                 json={"method": "reload_weights"})
                await self._post(client, server, "/wake_up", "wake up its KV cache",
                                 params={"tags": "kv_cache"})
            else:
                await self._post(client, server, "/wake_up", "wake up")
            if await self._is_sleeping(client, server):
                raise self._error(server, "answered POST /wake_up but GET /is_sleeping says it "
                                  "still sleeps")
        sleeper.sleeping = False
        _note_sleep(server, None)


def _note_sleep(server: Any, level: int | None) -> None:
    """A kept server records its sleep level, so the next session can wake it (awake_or_why)."""
    note = getattr(server, "note_sleep", None)
    if note is not None:
        note(level)


def _argv(server: Any) -> Sequence[str]:
    """The argv a server was started with (a reused kept one's too), or ()."""
    return getattr(getattr(server, "spec", None), "argv", None) or ()


def run(coro: Any) -> Any:
    """Run one of the controller's coroutines from synchronous code (the fixtures, a warm-up)."""
    return asyncio.run(coro)
