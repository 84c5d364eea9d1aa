"""GateKeeper: runs one gate on one measurement, records the result in the session and turns its
Outcome into the test's (specgate.decide.outcome.pytest_action)."""

from __future__ import annotations

import os
import warnings

import pytest

from specgate.decide.entry import baseline_entry
from specgate.decide.gates import (
    ab_acceptance,
    check_acceptance,
    check_backfire,
    check_lossless,
    check_throughput,
    check_ttft,
    stored_start_histories,
)
from specgate.decide.outcome import NOT_STORED, OUTCOME_KINDS, STORING, Outcome, pytest_action
from specgate.decide.verdict import GateResult
from specgate.plugin.session import SpecgateSession
from specgate.report.verdicts import pytest_text, statement, terminal_line, worded
from specgate.store.baselines import (
    OTHER_MACHINE,
    OTHER_MEASUREMENT,
    SAME,
    Fingerprint,
    baseline_notes,
    comparability,
    histories,
    lookup,
)


class GateKeeper:
    """Runs one gate on one measurement, records the result and fails the test with its reason."""

    def __init__(self, session: SpecgateSession) -> None:
        self.session = session
        self.rig = session.settings.rig

    @property
    def run(self):
        """The run's settings, as the session holds them now."""
        return self.session.settings

    def _settings(self, m):
        """Window ``m``'s gate settings."""
        return self.run.window(m.mode, m.prompt_class, m.concurrency)

    def _where(self, m) -> str:
        return (f"rig {self.rig.name} / mode {m.mode} / class {m.prompt_class} / concurrency "
                f"{m.concurrency}")

    def _update(self, m, gate: str) -> bool:
        """In update mode, queue the window as one start to store; True when done."""
        update = self.session.options.update
        if update == "off":
            return False
        entry = baseline_entry(m, self.session.fingerprints.get(m.mode)
                               or Fingerprint(machine=self.run.machine))
        self.session.queue_update(m, entry)
        message = (f"this run's figures of {self._where(m)} will be stored in "
                   f"{self.session.options.baselines_path} at the end of the run (median "
                   f"{entry.median:.1f} tok/s, n={entry.n}; "
                   + ("a new history: an update accepts a deliberate change)" if update == "update"
                      else "one more start of this machine's history of this build, or a new one)"))
        self.session.record_undecided(gate, m, STORING, message)
        if update == "update":
            pytest.fail(terminal_line({"gate": gate, "mode": m.mode, "prompt_class": m.prompt_class,
                                       "concurrency": m.concurrency, "kind": STORING,
                                       "message": message},
                                      suffix=" [fails: an update never passes silently]"),
                        pytrace=False)
        return True

    def _machine(self, m) -> str | None:
        """The machine ``m`` was measured on: its server's fingerprint's, else this session's."""
        now = self.session.fingerprints.get(m.mode)
        return now.machine if now is not None and now.machine else self.run.machine

    def _build_history(self) -> str:
        return f"python -m specgate build-history --rig {self.rig.name} --starts 10"

    def _stored(self, m, gate: str):
        """The stored history to compare with: this machine's (speed gates) or the newest of any
        (acceptance). None of this machine: OTHER_MACHINE; nothing stored: NOT_STORED."""
        found = histories(self.run.store, self.rig.name, m.mode, m.prompt_class, m.concurrency)
        if not found:
            message = (f"no stored figures for {self._where(m)} in "
                       f"{self.session.options.baselines_path}; store a history of starts with: "
                       f"{self._build_history()} (or one start: pytest -m {self.rig.tier} "
                       f"--specgate-rig {self.rig.name} --specgate-update-baselines)")
            self._not_compared(m, gate, Outcome.NOT_STORED, NOT_STORED, message)
        if gate != "throughput":
            return lookup(self.run.store, self.rig.name, m.mode, m.prompt_class,
                          m.concurrency) or found[-1]
        machine = self._machine(m)
        entry = lookup(self.run.store, self.rig.name, m.mode, m.prompt_class, m.concurrency,
                       machine=machine)
        if entry is None:
            stored = "; ".join(h.describe() for h in found[-3:])
            why = ("this run's machine cannot be identified, and a history of an unknown machine "
                   "never gates" if machine is None
                   else f"no history of this machine ({machine}) is stored: only {stored}")
            note = (f"{self._where(m)}: other machine: {why}; not compared (a level is one "
                    f"machine's); start this machine's history with: {self._build_history()}")
            self._not_compared(m, gate, Outcome.OTHER_MACHINE, "other machine", note)
        return entry

    def _not_compared(self, m, gate: str, outcome: Outcome, kind: str, note: str) -> None:
        __tracebackhide__ = True
        command = self._build_history()
        self.session.record_undecided(gate, m, kind, note, {"command": command})
        self._act(gate, outcome, note, m=m, kind=kind, command=command)

    def _act(self, gate: str, outcome: Outcome, message: str, *, m, declared: bool = False,
             kind: str | None = None, command: str | None = None) -> None:
        """End the test as ``outcome`` says under window ``m``'s policy and gating."""
        __tracebackhide__ = True
        settings = self._settings(m)
        policy, gating = settings.outcome_policy, settings.gating_of(gate)
        action = pytest_action(outcome, policy, declared=declared, gating=gating)
        entry = m.to_dict() if isinstance(m, GateResult) else {
            "gate": gate, "mode": m.mode, "prompt_class": m.prompt_class,
            "concurrency": m.concurrency, "kind": kind or OUTCOME_KINDS.get(outcome, "undecided"),
            "message": message, "details": {"command": command} if command else {}}
        text = pytest_text(entry, outcome, policy, declared=declared, gating=gating)
        if action == "skipped":
            pytest.skip(text)
        if action == "xfailed":
            pytest.xfail(text)
        if action == "failed":
            pytest.fail(text, pytrace=False)

    def _finish(self, result) -> None:
        __tracebackhide__ = True
        result = worded(result)
        self.session.record(result)  # one that decided nothing is listed as such, never as passed
        self._act(result.gate, result.outcome, result.message, declared=result.declared is not None,
                  m=result)

    def throughput(self, m) -> None:
        __tracebackhide__ = True
        if "throughput" in self.rig.gates.left_out:  # kept to measure; reason said at collection
            pytest.skip(f"{m.mode} {m.prompt_class} c{m.concurrency} throughput: left out by rig "
                        f"{self.rig.name}; measured for the other modes' gates")
        if self._update(m, "throughput"):
            return
        if m.ab:  # A/B: the live reference side decides
            self._finish(check_throughput(self._settings(m), m, None))
            return
        stored = self._stored(m, "throughput")
        fit = self._comparable(m, stored, "throughput")
        if fit.kind == OTHER_MACHINE:
            # a level or ratio from another CPU or GPU says nothing about this one: never compared
            note = (f"the stored entry {fit.describe()}; not compared; start this machine's "
                    f"history with: {self._build_history()}")
            self._not_compared(m, "throughput", Outcome.OTHER_MACHINE, "other machine", note)
        result = check_throughput(self._settings(m), m, stored)
        result.details.update(baseline_notes(fit, m.decode_tokens_per_s, stored.median,
                                             self._refresh(m)))
        self._finish(result)

    def _refresh(self, m) -> str:
        return (f"pytest -m {self.rig.tier} --specgate-rig {self.rig.name} "
                f"--specgate-update-baselines -k '{m.mode}-{m.prompt_class}-c{m.concurrency}'")

    def _comparable(self, m, stored, gate: str):
        """Refuse a stored figure of other prompts or another protocol (undecided); another machine
        or setup is reported, refused under --specgate-strict-fingerprint
        (baselines.comparability)."""
        now = self.session.fingerprints.get(m.mode)
        fit = comparability(stored.fingerprint,
                            now and now.for_window(m.prompt_class, m.concurrency))
        strict = (fit.kind != SAME and gate == "throughput"
                  and self.session.options.strict_fingerprint)
        if fit.kind == OTHER_MEASUREMENT or strict:
            note = f"the stored entry {fit.describe()}; refresh it with: {self._refresh(m)}"
            if strict:  # refused on purpose: a failed gate, listed as FAILED, never as undecided
                self._finish(GateResult(gate, m.mode, m.prompt_class, m.concurrency, Outcome.FAIL,
                                        f"refused (--specgate-strict-fingerprint): {note}"))
            self.session.record_undecided(gate, m, "fingerprint", note)  # not comparable: undecided
            self._act(gate, Outcome.UNDECIDED, note, m=m, kind="fingerprint")
            pytest.fail(note, pytrace=False)
        if fit.kind != SAME and gate == "throughput":
            warnings.warn(f"the stored entry {fit.describe()}", stacklevel=1)
        return fit

    def acceptance(self, m) -> None:
        __tracebackhide__ = True
        if self._update(m, "acceptance"):
            return
        if m.ab:  # A/B: the same requests, per request
            self._finish(ab_acceptance(self._settings(m), m))
            return
        stored = self._stored(m, "acceptance")
        self._comparable(m, stored, "acceptance")
        self._finish(check_acceptance(self._settings(m), m, stored, reference_label="stored"))

    def _reference(self, m):
        if m.partner is not None and not m.ab and m.partner.mode == self.rig.reference_mode:
            return m.partner  # a duet window: its alternated no-speculation side
        if self.session.options.attach_url:
            pytest.skip("attach mode measures one server: the same-session no-speculation "
                        "reference this gate needs is not available")
        if self.session.options.worker_id is not None and self.session.reference_measurement(
                m.prompt_class, m.concurrency, wait_s=0) is None:
            # waiting could deadlock (xdist may give the reference mode to a worker only after this
            # one): the controller decides this gate once every worker is done
            self.session.deferred.append((m.mode, m.prompt_class, m.concurrency))
            current = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
            if current:
                gate = current.split("::")[-1].split("[")[0].removeprefix("test_")
                self.session.deferred_tests[current] = [gate, m.mode, m.prompt_class, m.concurrency]
            pytest.skip("under xdist this cross-mode gate is decided on the controller after all "
                        "workers finish (see the specgate summary)")
        reference = self.session.reference_measurement(m.prompt_class, m.concurrency)
        if reference is None:
            key = (self.rig.reference_mode, m.prompt_class, m.concurrency)
            why = self.session.failures.get(key)
            pytest.fail(f"{m.mode} on {m.prompt_class}: the no-speculation mode "
                        f"{self.rig.reference_mode!r} was not measured in this session"
                        + (f" ({str(why).splitlines()[0]})" if why
                           else " (select it too, e.g. drop -k / --deselect)"), pytrace=False)
        return reference

    def backfire(self, m) -> None:
        __tracebackhide__ = True
        reference = self._reference(m)
        starts = None if m.partner is reference else stored_start_histories(
            self.run.store, self._settings(m), m, self._machine(m))
        result = check_backfire(self._settings(m), m, reference, starts)
        if result.outcome is Outcome.PASS and result.declared:
            warnings.warn(f"{m.mode} on {m.prompt_class} is declared to backfire but did not this "
                          f"run: {statement(result.to_dict())}", stacklevel=1)
        self._finish(result)

    def ttft(self, m) -> None:
        """TTFT against a live reference (an A/B's reference side, else no speculation); the
        no-speculation mode outside an A/B has none."""
        __tracebackhide__ = True
        if m.ab:
            self._finish(check_ttft(self._settings(m), m, m.partner))
            return
        if m.mode == self.rig.reference_mode:
            pytest.skip(f"{m.mode} is the reference: its TTFT is compared only in an A/B (the same "
                        "mode on the reference side)")
        self._finish(check_ttft(self._settings(m), m, self._reference(m)))

    def lossless(self, m) -> None:
        __tracebackhide__ = True
        self._finish(check_lossless(self._settings(m), m, self._reference(m)))

