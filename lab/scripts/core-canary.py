"""Lab experiment (issue 12): is the 135M rig's ~400/~600 tok/s regime the CPU core's own speed?

    python3 lab/scripts/core-canary.py WINDOWS_JSONL SHARE_AFTER CALIBRATION_PID LOG

(the arguments of lab/scripts/pin-servers-after.py; run by lab/scripts/gpu-lab-regimes.sh with
HELPER=core-canary.py).
Beside a running A/A `python -m specgate_lab calibrate` (two servers of one mode, duet windows), once both
servers answer /health:
  - pins the client to CPU 0, each API server to a CPU of its own (1, 2), each engine core's main
    thread (the one that runs the step loop: tid == pid) to CPU 4 (reference) and CPU 6 (candidate),
    and every other thread of the engine cores to CPU 5 and 7;
  - starts canaries: a fixed piece of Python work (~20 us) timed over and over, on CPU 4 and CPU 6
    at SCHED_IDLE (they run only when the engine core there does not), and on CPU 12 at normal
    priority (an idle CPU: the machine as a whole). Each records, per 10 ms, how many pieces it ran
    and the 25th percentile of their durations (ns): a slower core shows as longer pieces;
  - after SHARE_AFTER windows (lines of WINDOWS_JSONL; 0: at once, e.g. beside a pytest duet), moves the candidate's engine main thread
    onto CPU 4 too: both servers' steps then run on one core (in a duet at concurrency 1 they never
    generate at once). If the levels are the core's, the pairs' ratios then tighten.
With PYSPY=1 in the environment, also profiles the candidate's engine core in 1-s py-spy bursts back
to back (/root/extra/bin/py-spy, at 250 Hz, non-blocking, idle samples kept, pinned to CPU 14), each a
collapsed-stack file pyspy/<n>.txt beside LOG, and pyspy.jsonl a line per burst: its perf_counter start and end (the
clock of specgate's request records) and the CPU seconds each engine-core thread used during it, so
a fast request's stacks can be set beside a slow one's.
With MEMCANARY=1, also a memory canary (1-MiB copies out of a 64-MiB buffer, memcanary-CPU.jsonl in the
same format) on the candidate's engine CPU (SCHED_IDLE) and on the control CPU (normal).
Writes LOG and canary-CPU.jsonl files beside it; stops when CALIBRATION_PID exits.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import random
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil

BIN_NS = 10_000_000
# CANARY_CPUS=a,b,c,d,e overrides them (a smoke test on a 2-CPU machine: 1,1,0,0,0). Each of the first
# four may be a set written a+b: CANARY_CPUS=4,6+8,5,7+9,12 gives the candidate's engine core a second
# vCPU for its main thread (6 or 8) and for its other threads (7 or 9); a canary runs on each main CPU.
REFERENCE_MAIN, CANDIDATE_MAIN, REFERENCE_HELPERS, CANDIDATE_HELPERS, CONTROL = (
    frozenset(int(cpu) for cpu in entry.split("+")) for entry in os.environ.get("CANARY_CPUS", "4,6,5,7,12").split(","))
CONTROL = min(CONTROL)


def cpus(cpu_set: frozenset[int]) -> str:
    """A CPU set as CANARY_CPUS writes it (6+8), for the log."""
    return "+".join(map(str, sorted(cpu_set)))

PROFILER_CPU = 14 if (os.cpu_count() or 1) > 14 else 0
PYSPY = "/root/extra/bin/py-spy"
API_CPUS = (1, 2) if os.cpu_count() and os.cpu_count() > 2 else (0, 0)


def work() -> int:
    total = 0
    for i in range(1000):
        total += i
    return total


def memory_piece(seed: int):
    """A piece of the memory canary: copy 1 MiB from a random place in a 64 MiB buffer. It times the
    memory and last-level cache the vCPU gets, which work()'s L1-sized loop cannot feel."""
    buffer, size = memoryview(bytearray(os.urandom(64 << 20))), 1 << 20
    rng = random.Random(seed)
    offsets = itertools.cycle([rng.randrange(0, len(buffer) - size) for _ in range(4096)])

    def piece() -> None:
        offset = next(offsets)
        bytes(buffer[offset:offset + size])

    return piece


def canary(cpu: int, idle: bool, out: str, memory: bool = False) -> None:
    """Time work() (or, with memory, memory_piece()'s copies) over and over on CPU, a line per bin."""
    os.sched_setaffinity(0, {cpu})
    if idle:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    piece = memory_piece(cpu) if memory else work
    handle = open(out, "a")
    clock = time.perf_counter_ns
    bin_start, durations = clock(), []
    while True:
        begin = clock()
        piece()
        end = clock()
        if end - bin_start >= BIN_NS:
            if durations:
                durations.sort()
                handle.write(json.dumps([bin_start / 1e9, len(durations), durations[len(durations) // 4]]) + "\n")
                handle.flush()
            bin_start, durations = end, []
        durations.append(end - begin)


def profile_bursts(pid: int, out: Path) -> None:
    """py-spy bursts of 1 s on PID back to back until it exits (see the module's header)."""
    os.sched_setaffinity(0, {PROFILER_CPU})
    (out / "pyspy").mkdir(exist_ok=True)
    proc = psutil.Process(pid)

    def thread_times() -> dict[int, float]:
        return {t.id: t.user_time + t.system_time for t in proc.threads()}

    with open(out / "pyspy.jsonl", "a") as index:
        n = 0
        while proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
            before, t0 = thread_times(), time.perf_counter()
            subprocess.run([PYSPY, "record", "--pid", str(pid), "--rate", "250", "--duration", "1", "--nonblocking",
                            "--threads", "--idle", "--format", "raw", "--output", str(out / "pyspy" / f"{n}.txt")],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
            t1, after = time.perf_counter(), thread_times()
            used = {str(tid): round(after[tid] - before.get(tid, 0.0), 3) for tid in after}
            index.write(json.dumps({"n": n, "t0": t0, "t1": t1, "thread_cpu_s": used}) + "\n")
            index.flush()
            n += 1


def servers(client_pid: int) -> list[psutil.Process]:
    """The API-server session leaders the calibration started, in start order."""
    found = []
    for proc in psutil.process_iter(["pid", "ppid", "cmdline", "create_time"]):
        line = " ".join(proc.info["cmdline"] or [])
        if proc.info["ppid"] == client_pid and "vllm" in line and (" serve" in line or "api_server" in line):
            found.append(proc)
    return sorted(found, key=lambda p: p.info["create_time"])


def port_of(proc: psutil.Process) -> str:
    args = proc.info["cmdline"]
    return args[args.index("--port") + 1]


def healthy(proc: psutil.Process) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port_of(proc)}/health", timeout=2) as reply:
            return reply.status == 200
    except OSError:
        return False


def engine_core(leader: psutil.Process) -> psutil.Process:
    return next(p for p in leader.children(recursive=True) if "EngineCore" in " ".join(p.cmdline() + [p.name()]))


def pin_threads(proc: psutil.Process, main_cpus: frozenset[int], helper_cpus: frozenset[int]) -> None:
    for thread in proc.threads():
        os.sched_setaffinity(thread.id, main_cpus if thread.id == proc.pid else helper_cpus)


def pin_later_servers(client_pid: int, pinned: set[int], say) -> None:
    """A server the session starts after the first two (the third mode of a session, once the
    candidate's server is gone) inherits the client's CPU 0, so without this its API server and engine
    core would share the client's CPU (seen on the H200 lab: eagle3_al30's whole server ran on CPU 0; docs/journal/lab/2026-12-02-h200-visit13.md). Once
    it answers /health, it gets the candidate's CPUs: API on API_CPUS[1], engine main thread on
    CANDIDATE_MAIN, its other threads on CANDIDATE_HELPERS; any other process it started, every CPU but
    the client's."""
    for leader in servers(client_pid):
        if leader.pid in pinned or not healthy(leader):
            continue
        pinned.add(leader.pid)
        try:
            others = set(range(os.cpu_count() or 1)) - {0} or {0}
            for proc in leader.children(recursive=True):
                for thread in proc.threads():
                    os.sched_setaffinity(thread.id, others)
            for thread in leader.threads():
                os.sched_setaffinity(thread.id, {API_CPUS[1]})
            core = engine_core(leader)
            pin_threads(core, CANDIDATE_MAIN, CANDIDATE_HELPERS)
        except (psutil.Error, OSError, StopIteration) as err:
            say(f"could not pin the later server {leader.pid}: {err!r}")
            continue
        say(f"pinned a later server: API {leader.pid} -> {API_CPUS[1]}; engine core {core.pid} main -> "
            f"{cpus(CANDIDATE_MAIN)} (rest {cpus(CANDIDATE_HELPERS)}); perf_counter {time.perf_counter():.3f}")


def main() -> None:
    windows, share_after, client_pid, log_path = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    out = log_path.parent
    log = log_path.open("a")

    def say(text: str) -> None:
        log.write(f"{time.strftime('%H:%M:%S')} {text}\n")
        log.flush()

    while len(leaders := servers(client_pid)) < 2 or not all(map(healthy, leaders)):
        if not psutil.pid_exists(client_pid):
            say("calibration ended before both servers were up")
            return
        time.sleep(1)
    reference, candidate = leaders[:2]
    cores = [engine_core(reference), engine_core(candidate)]
    os.sched_setaffinity(client_pid, {0})
    for thread in psutil.Process(client_pid).threads():
        os.sched_setaffinity(thread.id, {0})
    for leader, cpu in zip((reference, candidate), API_CPUS):
        for thread in leader.threads():
            os.sched_setaffinity(thread.id, {cpu})
    pin_threads(cores[0], REFERENCE_MAIN, REFERENCE_HELPERS)
    pin_threads(cores[1], CANDIDATE_MAIN, CANDIDATE_HELPERS)
    say(f"pinned: client {client_pid} -> 0; API {reference.pid}, {candidate.pid} -> {API_CPUS}; engine cores "
        f"{cores[0].pid} main -> {cpus(REFERENCE_MAIN)} (rest {cpus(REFERENCE_HELPERS)}), {cores[1].pid} main -> "
        f"{cpus(CANDIDATE_MAIN)} (rest {cpus(CANDIDATE_HELPERS)}); perf_counter {time.perf_counter():.3f}")
    context = multiprocessing.get_context("fork")
    canaries = [context.Process(target=canary, args=(cpu, idle, str(out / f"canary-{cpu}.jsonl")), daemon=True)
                for cpu, idle in [*((cpu, True) for cpu in sorted(REFERENCE_MAIN | CANDIDATE_MAIN)), (CONTROL, False)]]
    if os.environ.get("MEMCANARY") == "1":
        canaries += [context.Process(target=canary, args=(cpu, idle, str(out / f"memcanary-{cpu}.jsonl"), True),
                                     daemon=True)
                     for cpu, idle in ((min(CANDIDATE_MAIN), True), (CONTROL, False))]
    if os.environ.get("PYSPY") == "1":
        canaries.append(context.Process(target=profile_bursts, args=(cores[1].pid, out), daemon=True))
    for proc in canaries:
        proc.start()
    say(f"canaries on {sorted(REFERENCE_MAIN | CANDIDATE_MAIN)} (SCHED_IDLE), {CONTROL} (normal)")
    shared = False
    pinned = {reference.pid, candidate.pid}
    while psutil.pid_exists(client_pid) and psutil.Process(client_pid).status() != psutil.STATUS_ZOMBIE:
        pin_later_servers(client_pid, pinned, say)
        if not shared and (share_after == 0 or windows.exists() and len(windows.read_text().splitlines()) >= share_after):
            pin_threads(cores[1], REFERENCE_MAIN, CANDIDATE_HELPERS)
            shared = True
            say(f"shared: candidate engine core main thread -> {cpus(REFERENCE_MAIN)} after {share_after} windows; "
                f"perf_counter {time.perf_counter():.3f}")
        time.sleep(0.5)
    for proc in canaries:
        proc.terminate()
    say("calibration ended; canaries stopped")


if __name__ == "__main__":
    main()
