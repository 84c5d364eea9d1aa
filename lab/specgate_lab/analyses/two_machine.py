"""Issue 64 item 6, the two-machine history, from its kept raw data: the two leases' GPUs, the
histories lease A stored (each apart by machine in one baselines file), what specgate's own rule makes
of that file on lease B's machine, and how far lease B's plain run got.

    python -m specgate_lab.analyses.two_machine docs/evidence/lab/two-machine-history

The folder holds HA/ (``lab-machine.txt``, ``baselines.json`` as lease A left it,
``store-start-NN.report.json.gz`` the stored sessions trimmed) and HB/ (``lab-machine.txt``,
``campaign.log``, ``OM.log``: the plain run against A's history, which reached no verdict) and HB2/, lease B
again on a third machine: ``lab-machine.txt``, ``campaign.log``, ``OM.log``, ``baselines.json`` after B's
``build-history`` (both baselines files trimmed to this rig), its stored sessions and the plain runs
``P1``-``P6`` trimmed (``*.report.json.gz``, with their logs)."""

from __future__ import annotations

import argparse
import gzip
import json
import re
import statistics
from pathlib import Path

from specgate.decide.history import StartHistory
from specgate.plan.histories import describe_history
from specgate.store.baselines import histories, load_baselines, lookup
from specgate_lab.analyses.history_campaign import verdicts

RIG, WINDOW = "h200-wide15b-history", ("no_spec", "coding", 1)


def gpu(folder: Path) -> dict[str, str]:
    """The lease's GPU: name, serial and UUID (the last line nvidia-smi wrote to lab-machine.txt)."""
    last = (folder / "lab-machine.txt").read_text().strip().splitlines()[-1]
    name, _mem, _clock, _driver, serial, uuid = (p.strip() for p in last.split(","))
    return {"name": name, "serial": serial, "uuid": uuid}


def stored_levels(folder: Path) -> list[float]:
    """Each stored session's level: the median decode rate of its window, from the trimmed reports."""
    levels = []
    for path in sorted(folder.glob("store-start-*.report.json.gz")):
        with gzip.open(path, "rt") as f:
            (window,) = json.load(f)["measurements"]
        levels.append(statistics.median(r["decode_tokens_per_s"] for r in window["records"]))
    return levels


def render(root: Path, threshold: float = 0.97) -> str:
    a, b = gpu(root / "HA"), gpu(root / "HB")
    lines = [f"lease A: {a['name']} serial {a['serial']} {a['uuid']}",
             f"lease B: {b['name']} serial {b['serial']} {b['uuid']}",
             f"two machines: {a['uuid'] != b['uuid'] and a['serial'] != b['serial']}"]
    levels = stored_levels(root / "HA")
    store = load_baselines(root / "HA" / "baselines.json")
    a_history = StartHistory.of(lookup(store, RIG, *WINDOW, machine=a["uuid"]))
    lines += [f"A's stored sessions: levels {', '.join(f'{x:.2f}' for x in levels)} tok/s; "
              f"as stored: {a_history.levels == tuple(levels)}",
              f"  {describe_history(a_history, threshold)}"]
    lines += _histories(store, "A's baselines file")
    mine = lookup(store, RIG, *WINDOW, machine=b["uuid"])
    newest = lookup(store, RIG, *WINDOW)
    lines.append(f"on B's machine: its own history {'none' if mine is None else mine.describe()}; "
                 f"the newest of any machine {newest.machine if newest else None}")
    log = (root / "HB" / "OM.log").read_text()
    selected = re.search(r"collected .*", log)
    planned = re.search(r"no_spec / coding / c1 .*", log)
    finished = re.search(r"== step 3: exit", (root / "HB" / "campaign.log").read_text())
    lines += [f"OM (plain run on B against A's history): {selected.group(0) if selected else '?'}",
              f"  its plan: {re.sub(r' +', ' ', planned.group(0)) if planned else '?'}",
              f"  finished: {bool(finished)}; last line: {log.strip().splitlines()[-1]}"]
    return "\n".join([*lines, *_lease_b_again(root, a, b, a_history, threshold)])


def _histories(store, where: str) -> list[str]:
    found = histories(store, RIG, *WINDOW)
    return [f"histories of {RIG} {'/'.join(map(str, WINDOW))} in {where}: {len(found)}",
            *(f"  {entry.machine or 'unknown machine'}: {len(entry.starts)} start(s), levels "
              f"{', '.join(f'{x:.2f}' for x in entry.level_history)}" for entry in found)]


def _lease_b_again(root: Path, a: dict, b: dict, a_history: StartHistory, threshold: float) -> list[str]:
    """Lease B again (HB2): OM against A's history, B's own history beside A's, and the six plain runs
    fixed in advance (P1, P4, P6 with the 5 % GPU-side slowdown), counted with exact bounds."""
    folder = root / "HB2"
    c = gpu(folder)
    om = (folder / "OM.log").read_text()
    lines = ["", f"lease B again: {c['name']} serial {c['serial']} {c['uuid']}",
             f"a third machine: {c['uuid'] not in (a['uuid'], b['uuid'])}",
             f"OM again (plain run on B against A's history): {re.search(r'collected .*', om).group(0)}",
             f"  {re.search(r'specgate: not run here: .*', om).group(0)}"]
    store = load_baselines(folder / "baselines.json")
    lines += _histories(store, "B's baselines file after build-history")
    levels = stored_levels(folder)
    mine = StartHistory.of(lookup(store, RIG, *WINDOW, machine=c["uuid"]))
    theirs = StartHistory.of(lookup(store, RIG, *WINDOW, machine=a["uuid"]))
    lines += [f"B's stored sessions: levels {', '.join(f'{x:.2f}' for x in levels)} tok/s; "
              f"as stored: {mine.levels == tuple(levels)}; A's history unchanged: {theirs.levels == a_history.levels}",
              f"  {describe_history(mine, threshold)}",
              f"B's mean level over A's: {mine.center / a_history.center:.3f}x (two H100s, one rig and build)",
              "", *verdicts(folder, "P"), ""]
    for p in sorted(folder.glob("P*.report.json.gz")):
        with gzip.open(p, "rt") as f:
            (gate,) = [g for g in json.load(f)["gates"] if g["gate"] == "throughput"]
        lines.append(f"{p.name.split('.')[0]}: this start {gate['details']['level']:.2f} tok/s, "
                     f"{gate['details']['level'] / a_history.center:.3f}x of A's mean level")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    print(render(parser.parse_args(argv).folder))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
