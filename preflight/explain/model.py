"""What ``preflight explain`` answers: diagnoses with their evidence, the ranks, what was read.

Plain frozen dataclasses with a ``to_json`` each (the schema of docs/explain.md). A
:class:`Diagnosis` is a failure class recognised in logs or flight-recorder dumps; it is not a
check's ``core.result.Finding`` (no status, no scope: the job failed, explain says why).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from preflight.explain.rules import Layer

#: JSON-able value in ``details`` and ``to_json`` output.
Detail = Any


@dataclass(frozen=True)
class Evidence:
    """One line behind a diagnosis: where it is and what it says (cut to 400 chars).

    ``text`` is the line as read (it may hold control characters: the text renderer escapes
    them, JSON escapes them as JSON does).
    """

    source: str
    line: int
    text: str

    def to_json(self) -> dict[str, Detail]:
        return {"source": self.source, "line": self.line, "text": self.text}


@dataclass(frozen=True)
class Diagnosis:
    """One recognised failure class.

    Attributes:
        reason: stable CamelCase token (``rules.Rule.reason``).
        layer: environment, communication, data, model or hardware.
        message: what was seen, with the ranks involved.
        remedy: what to change (a variable, a flag, a command).
        evidence: the first matching lines with their line numbers.
        ranks: ranks involved, in the order they first showed the failure.
        count: all matching lines (evidence is capped).
        details: small JSON-able facts (port, SeqNum, timed-out ranks...).
    """

    reason: str
    layer: Layer
    message: str
    remedy: str
    evidence: tuple[Evidence, ...]
    ranks: tuple[int, ...]
    count: int
    details: Mapping[str, Detail] = field(default_factory=dict)

    def to_json(self) -> dict[str, Detail]:
        return {"reason": self.reason, "layer": self.layer.value, "message": self.message,
                "remedy": self.remedy, "evidence": [e.to_json() for e in self.evidence],
                "ranks": list(self.ranks), "count": self.count, "details": dict(self.details)}


@dataclass(frozen=True)
class FirstError:
    """Where to start reading a log no rule knows: its first exception line, or else its first
    line that says ``error:``, with the traceback frame that raised it.

    Not a diagnosis (no reason, no fix): a pointer, given only when nothing was recognised.

    Attributes:
        line: the line itself (cut to 400 chars).
        exception: the exception's class for a traceback's last line, else None.
        frame: ``(file, line, function)`` of the frame just above it, if one was.
        installed: the frame is installed code (a library, Python, torch), not the job's.
        rank: the rank that printed it, if the line or the file name says.
    """

    line: Evidence
    exception: str | None
    frame: tuple[str, int, str] | None
    installed: bool
    rank: int | None

    def to_json(self) -> dict[str, Detail]:
        frame = None if self.frame is None else {
            "file": self.frame[0], "line": self.frame[1], "function": self.frame[2],
            "installed": self.installed}
        return {**self.line.to_json(), "exception": self.exception, "frame": frame,
                "rank": self.rank}


@dataclass(frozen=True)
class RankSummary:
    """What the logs say about ranks.

    Attributes:
        seen: every rank that printed something (or that NCCL / torchrun named).
        world_size: from torchrun's ``global_world_sizes`` or NCCL's ``nranks``, if printed.
        failed: ranks with a finding or in torchrun's failure summary, first failing first.
        root_cause: torchrun's "Root Cause (first observed failure)" rank.
        progress: last iteration/step/epoch each rank printed.
        stalled: ranks whose last progress is behind the furthest rank, the earliest stop first.
        never_reported: ranks that printed no progress while at least two others did.
    """

    seen: tuple[int, ...] = ()
    world_size: int | None = None
    failed: tuple[int, ...] = ()
    root_cause: int | None = None
    progress: Mapping[int, int] = field(default_factory=dict)
    stalled: tuple[int, ...] = ()
    never_reported: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Detail]:
        return {"seen": list(self.seen), "world_size": self.world_size,
                "failed": list(self.failed), "root_cause": self.root_cause,
                "progress": {str(k): v for k, v in sorted(self.progress.items())},
                "stalled": list(self.stalled), "never_reported": list(self.never_reported)}


@dataclass(frozen=True)
class Explanation:
    """Diagnoses cause-first, the rank summary, what was read and what could not be.

    Attributes:
        findings: the diagnoses, root cause first.
        notes: one line each for what limits the answer (ranks capped, a dump refused).
        unread: ``(source, why)`` for each input that could not be read (partly or at all).
        first_error: with no finding, where to start reading (:class:`FirstError`).
    """

    findings: tuple[Diagnosis, ...]
    ranks: RankSummary
    sources: tuple[str, ...]
    lines: int
    bytes_read: int
    notes: tuple[str, ...] = ()
    unread: tuple[tuple[str, str], ...] = ()
    first_error: FirstError | None = None

    def to_json(self) -> dict[str, Detail]:
        return {"findings": [f.to_json() for f in self.findings], "ranks": self.ranks.to_json(),
                "sources": list(self.sources), "lines": self.lines, "bytes": self.bytes_read,
                "notes": list(self.notes),
                "unread": [{"source": s, "why": w} for s, w in self.unread],
                "first_error": None if self.first_error is None else self.first_error.to_json()}
