"""Lab experiment: pin live vLLM servers' processes to fixed cores part-way through a calibration,
so the windows before and after compare the same two servers unpinned and pinned.

    python3 lab/scripts/pin-servers-after.py WINDOWS_JSONL AFTER_WINDOWS CLIENT_PID LOG

Waits until WINDOWS_JSONL (a running `python -m specgate_lab calibrate`'s windows.jsonl) holds AFTER_WINDOWS lines,
then pins, by physical core (both SMT siblings of a core go together):
  the client (CLIENT_PID, every thread) to core 0; each server the client started (a child session
  leader whose command line runs vLLM's API server, in start order) its API process to one core and
  every other process of its session (the engine core and its helpers) to two more.
Pinning at start instead (taskset around the server) made the 135M server's start take 193 s
(torch.compile and graph capture on 4 cores), hence after ready. Writes what it did to LOG.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import psutil


def physical_cores() -> list[list[int]]:
    """Logical CPUs grouped by physical core, in order, from sysfs."""
    seen: dict[str, list[int]] = {}
    for cpu in sorted(os.sched_getaffinity(0)):
        path = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list")
        key = path.read_text().strip() if path.exists() else str(cpu)
        seen.setdefault(key, []).append(cpu)
    return list(seen.values())


def pin_process(proc: psutil.Process, cpus: set[int]) -> int:
    """Every thread of ``proc`` onto ``cpus``; returns how many threads were pinned."""
    pinned = 0
    for thread in proc.threads():
        try:
            os.sched_setaffinity(thread.id, cpus)
            pinned += 1
        except OSError:
            continue
    return pinned


def main() -> None:
    windows, after, client_pid, log_path = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    log = log_path.open("a")
    while not windows.exists() or len(windows.read_text().splitlines()) < after:
        time.sleep(0.5)
    cores = physical_cores()
    def is_server(p: psutil.Process) -> bool:  # a vLLM server the client started (not another run's)
        line = " ".join(p.info["cmdline"] or [])
        return ("vllm" in line and ("api_server" in line or " serve " in f"{line} ") and p.info["ppid"] == client_pid
                and os.getsid(p.pid) == p.pid)

    leaders = sorted((p for p in psutil.process_iter(["pid", "ppid", "cmdline", "create_time"]) if is_server(p)),
                     key=lambda p: p.info["create_time"])
    stamp = time.strftime("%H:%M:%S")
    log.write(f"{stamp} pinning after {after} windows; physical cores {cores}\n")
    plan = [(psutil.Process(client_pid), set(cores[0]), "client")]
    next_core = 1
    for index, leader in enumerate(leaders):
        # (wraps around on a machine with too few cores: the test here has 2)
        api = set(cores[next_core % len(cores)])
        engine = set(cores[(next_core + 1) % len(cores)]) | set(cores[(next_core + 2) % len(cores)])
        next_core += 3
        plan.append((leader, api, f"server {index} api"))
        plan += [(child, engine, f"server {index} {child.name()}") for child in leader.children(recursive=True)]
    for proc, cpus, what in plan:
        try:
            count = pin_process(proc, cpus)
        except psutil.Error as exc:
            log.write(f"  {what} pid {proc.pid}: {exc}\n")
            continue
        log.write(f"  {what} pid {proc.pid}: {count} threads -> CPUs {sorted(cpus)}\n")
    log.write(f"{time.strftime('%H:%M:%S')} pinned; windows so far {len(windows.read_text().splitlines())}\n")
    log.close()


if __name__ == "__main__":
    main()
