"""The result model shared by every mode: Status, Scope, Finding, Result, Report.

ERROR means "could not tell" (a probe broke, a deadline passed); FAIL means "this is wrong". Checks
return FAIL; only the runner turns exceptions and timeouts into ERROR. Every result carries whose
fault it is (:class:`Scope`): the node's, the job's own setting, or undecided. A Slurm prolog drains
a node only for node faults.
"""

from __future__ import annotations

import enum
import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 1

class Status(enum.IntEnum):
    """Ordered so that ``max()`` gives the worst: PASS < SKIP < WARN < ERROR < FAIL."""

    PASS = 0
    SKIP = 1
    WARN = 2
    ERROR = 3
    FAIL = 4

    @property
    def word(self) -> str:
        """Lower-case form used in JSON and metric labels."""
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> Status:
        try:
            return cls[text.upper()]
        except KeyError:
            raise ValueError(f"unknown status {text!r}") from None


class Scope(enum.Enum):
    """Whose fault a verdict is: the node's (drain it), the job's own setting (tell the job, never
    drain), or undecided (preflight could not tell: a crash or a deadline)."""

    NODE = "node"
    JOB = "job"
    UNDECIDED = "undecided"


@dataclass(frozen=True)
class Finding:
    """One thing a check found: the unit every check folds into its Result (:func:`fold`).

    Attributes:
        status: how bad it is (FAIL, WARN; PASS/SKIP findings are not needed).
        reason: stable CamelCase token (docs/checks.md lists each with its scope).
        message: actual vs expected, with units.
        remedy: a command or step a person can paste; empty when nothing is to be done.
        scope: whose fault it is (default: the node's).
    """

    status: Status
    reason: str
    message: str
    remedy: str = ""
    scope: Scope = Scope.NODE


#: Between the remedies of several findings of one result.
REMEDY_SEPARATOR = "; "


def fold(check: str, findings: Iterable[Finding], *, ok_reason: str, summary: str,
         details: Mapping[str, Any] | None = None,
         summary_up_to: Status = Status.WARN) -> Result:
    """The Result of a check from its findings; the one way every check combines them.

    No finding: PASS with ``ok_reason`` and ``summary``. Otherwise the worst status wins and its
    first finding gives the reason; the message lists every finding, worst first, then (when the
    verdict is no worse than ``summary_up_to``) the summary; remedies follow in the same order,
    each once, joined by ``"; "``; ``details["reasons"]`` lists every reason in that order. The
    scope is the node's when any finding of the worst status is a node fault, else the job's.
    """
    items = sorted(findings, key=lambda f: -f.status)  # stable: equal statuses keep their order
    base = dict(details or {})
    if not items:
        return Result(check, Status.PASS, ok_reason, summary, details=base)
    top = items[0]
    worst_items = [f for f in items if f.status is top.status]
    scope = Scope.NODE if any(f.scope is Scope.NODE for f in worst_items) else top.scope
    message = "; ".join(f.message.rstrip(".") for f in items)
    if top.status <= summary_up_to and summary:
        message += f". {summary}"
    remedy = REMEDY_SEPARATOR.join(dict.fromkeys(f.remedy for f in items if f.remedy))
    return Result(check, top.status, top.reason, message, remedy,
                  details={**base, "reasons": [f.reason for f in items]}, scope=scope)


@dataclass(frozen=True)
class Result:
    """The verdict of one check.

    Attributes:
        check: the check's name (its module name, its metric label).
        status: the verdict.
        reason: a stable CamelCase token, e.g. ``ShmTooSmall``; used as a metric label.
        message: what was found, actual vs expected, with units.
        remedy: what an on-call engineer should do; empty when nothing is to be done.
        details: small flat JSON-able dict.
        duration_s: time the check took, filled by the runner.
        scope: whose fault a WARN / FAIL is (node, job) or ERROR's UNDECIDED; NODE for a PASS.
    """

    check: str
    status: Status
    reason: str
    message: str
    remedy: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0
    scope: Scope = Scope.NODE

    def to_json(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "status": self.status.word,
            "scope": self.scope.value,
            "reason": self.reason,
            "message": self.message,
            "remedy": self.remedy,
            "details": dict(self.details),
            "duration_s": round(self.duration_s, 6),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Result:
        return cls(
            check=str(data["check"]),
            status=Status.parse(str(data["status"])),
            reason=str(data["reason"]),
            message=str(data["message"]),
            remedy=str(data.get("remedy", "")),
            details=dict(data.get("details") or {}),
            duration_s=float(data.get("duration_s", 0.0)),
            scope=Scope(str(data.get("scope", Scope.NODE.value))),
        )


def worst(statuses: Iterable[Status]) -> Status:
    """The worst status of several; PASS for none."""
    return max(statuses, default=Status.PASS)


def verdict(statuses: Iterable[Status]) -> Status:
    """The verdict over several checks: the worst of those that applied (a SKIP did not), so a node
    whose every applicable check passed is PASS; SKIP only when nothing applied."""
    applied = [s for s in statuses if s is not Status.SKIP]
    return worst(applied) if applied else Status.SKIP


@dataclass(frozen=True)
class Report:
    """Everything one run found: one JSON schema for check, prolog and serve's /report."""

    results: tuple[Result, ...]
    host: str = field(default_factory=socket.gethostname)
    timestamp_s: float = field(default_factory=time.time)
    version: str = ""
    mode: str = "check"
    fingerprint: Mapping[str, Any] | None = None
    bandwidth: Mapping[str, Any] | None = None

    @property
    def status(self) -> Status:
        """The verdict of the run (:func:`verdict`): what the table footer, the JSON and
        ``check``'s exit code say."""
        return verdict(r.status for r in self.results)

    @property
    def node_status(self) -> Status:
        """The verdict counting only what the node is to blame for: a job's own setting (scope
        JOB) counts as PASS. What the prolog drains on and ``preflight_node_healthy`` shows."""
        return verdict(Status.PASS if r.scope is Scope.JOB and r.status is not Status.SKIP
                       else r.status for r in self.results)

    def result(self, check: str) -> Result | None:
        for r in self.results:
            if r.check == check:
                return r
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "mode": self.mode,
            "host": self.host,
            "timestamp_s": round(self.timestamp_s, 3),
            "version": self.version,
            "status": self.status.word,
            "results": [r.to_json() for r in self.results],
            "fingerprint": dict(self.fingerprint) if self.fingerprint is not None else None,
            "bandwidth": dict(self.bandwidth) if self.bandwidth is not None else None,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Report:
        if data.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(
                f"report schema_version {data.get('schema_version')!r}, expected {SCHEMA_VERSION}"
            )
        return cls(
            results=tuple(Result.from_json(r) for r in data["results"]),
            host=str(data["host"]),
            timestamp_s=float(data["timestamp_s"]),
            version=str(data.get("version", "")),
            mode=str(data.get("mode", "check")),
            fingerprint=data.get("fingerprint"),
            bandwidth=data.get("bandwidth"),
        )


class ExitCode(enum.IntEnum):
    """Exit codes of every one-shot command (README, "Commands")."""

    OK = 0
    FAILED = 1
    USAGE = 2
    UNDECIDED = 3


def exit_code(status: Status, *, strict: bool = False) -> ExitCode:
    """Map the worst status to the process exit code.

    FAIL -> 1 (node is bad), ERROR -> 3 (could not decide), WARN -> 0 unless ``strict`` (then 1).
    """
    if status is Status.FAIL:
        return ExitCode.FAILED
    if status is Status.ERROR:
        return ExitCode.UNDECIDED
    if status is Status.WARN and strict:
        return ExitCode.FAILED
    return ExitCode.OK
