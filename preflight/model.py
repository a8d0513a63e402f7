"""The result model shared by every mode: Status, Result, Report.

ERROR means "could not tell" (a probe broke, a deadline passed); FAIL means "this node is bad".
Checks return FAIL; only the runner turns exceptions and timeouts into ERROR.
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
    """

    check: str
    status: Status
    reason: str
    message: str
    remedy: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "status": self.status.word,
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
        )


def worst(statuses: Iterable[Status]) -> Status:
    """The worst status of several; PASS for none."""
    return max(statuses, default=Status.PASS)


@dataclass(frozen=True)
class Report:
    """Everything one run found: one JSON schema for check, cluster and serve's /report."""

    results: tuple[Result, ...]
    host: str = field(default_factory=socket.gethostname)
    timestamp_s: float = field(default_factory=time.time)
    version: str = ""
    mode: str = "check"
    fingerprint: Mapping[str, Any] | None = None
    bandwidth: Mapping[str, Any] | None = None

    @property
    def status(self) -> Status:
        return worst(r.status for r in self.results)

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
    """Exit codes of every one-shot command (ARCHITECTURE.md)."""

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
