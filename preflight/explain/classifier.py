"""The streaming classifier: blocks of log lines in, ordered findings with ranks out.

Speed (issue 6: >= 50 MB/s on a 1 GB log, bounded memory): a block is searched with
``bytes.find`` for a few anchor substrings (``rules.ANCHORS``); only lines holding one are decoded
(``errors="replace"``) and run through the per-rule regexes. Per-rank progress is read from the
END of each block (the last progress line of each rank there), not from every line. Memory is
bounded: at most ``max_evidence`` lines per finding, ``MAX_RANKS`` ranks tracked.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from preflight.explain.ranks import (
    MAX_MATCH_CHARS,
    NCCL_INIT,
    PG_RANK,
    SUMMARY_RANK,
    WORLD_SIZES,
    line_rank,
    plural,
    progress_of,
)
from preflight.explain.rules import (
    ANCHORS,
    ORIGIN,
    RULES,
    SIGNAL_HINTS,
    SIGNAL_NAMES,
    SYMPTOM,
    Layer,
    Pattern,
    Rule,
)

#: JSON-able value in ``details`` and ``to_json`` output.
Detail = Any

MAX_EVIDENCE = 5
MAX_RANKS = 4096
MAX_EVIDENCE_CHARS = 400
#: Lines examined backwards from a block's end before falling back to a per-rank search.
TAIL_LINES = 4096

_KEY = re.compile(rb"\[(?:rank|[A-Za-z_][A-Za-z_-]{0,30})\d{1,7}\]:")
_TIMEOUT_AT = re.compile(r"Timeout at NCCL work: (\d{1,20}), last enqueued NCCL work: (-?\d{1,20}),"
                         r" last completed NCCL work: (-?\d{1,20})")
_WATCHDOG = re.compile(r"SeqNum=(\d{1,20}), OpType=(\w{1,40})")
_IFNAME_SET = re.compile(r"((?:NCCL|GLOO)_SOCKET_IFNAME) set by environment to (\S{1,64})")
_TORCHRUN_TERM = re.compile(r"Sending process (\d{1,10}) closing signal (SIGTERM)|Unable to "
                            r"shutdown process (\d{1,10}) via Signals\.SIGTERM, forcefully "
                            r"exiting via Signals\.(SIGKILL)")
#: Lines after / before NCCL's "Last error:" examined for its detail (``_detail_window``).
DETAIL_AFTER, DETAIL_BEFORE = 4, 2
#: Lines between a failure summary's ``rank : R (local_rank: L)`` and its ``traceback`` line.
_SUMMARY_SPAN = 6
_FILE_RANK = re.compile(r"(?:rank[_-]?|attempt_\d{1,5}/)(\d{1,7})(?:\D|$)")


@dataclass(frozen=True)
class Evidence:
    """One log line behind a finding: where it is and what it says (cut to 400 chars)."""

    source: str
    line: int
    text: str

    def to_json(self) -> dict[str, Detail]:
        return {"source": self.source, "line": self.line, "text": self.text}


@dataclass(frozen=True)
class Finding:
    """One recognised failure class in the logs.

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
class RankSummary:
    """What the logs say about ranks (issue 6, item 3).

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
    """What ``preflight explain`` answers: findings cause-first, rank summary, what was read."""

    findings: tuple[Finding, ...]
    ranks: RankSummary
    sources: tuple[str, ...]
    lines: int
    bytes_read: int

    def to_json(self) -> dict[str, Detail]:
        return {"findings": [f.to_json() for f in self.findings], "ranks": self.ranks.to_json(),
                "sources": list(self.sources), "lines": self.lines, "bytes": self.bytes_read}


@dataclass
class _Acc:
    """Mutable state of one reason while reading."""

    rule: Rule
    first: tuple[int, int]
    layer: Layer
    count: int = 0
    evidence: list[Evidence] = field(default_factory=list)
    ranks: dict[int, None] = field(default_factory=dict)
    nccl: dict[tuple[str, int, int], None] = field(default_factory=dict)
    messages: dict[str, None] = field(default_factory=dict)
    signals: dict[str, None] = field(default_factory=dict)
    last: bool = True


def _cut(text: str) -> str:
    text = text.rstrip("\r\n")
    return text if len(text) <= MAX_EVIDENCE_CHARS else text[:MAX_EVIDENCE_CHARS] + "..."


def _decode(raw: bytes) -> str:
    return raw[:MAX_MATCH_CHARS * 4].decode("utf-8", errors="replace").rstrip("\r\n")


def match_line(text: str) -> tuple[Rule, Pattern, re.Match[str]] | None:
    """The first rule (in ``RULES`` order, origins first) whose pattern matches ``text``."""
    head = text[:MAX_MATCH_CHARS]
    for rule in RULES:
        for pat in rule.patterns:
            m = pat.regex.search(head)
            if m:
                return rule, pat, m
    return None


class Classifier:
    """Feed it log blocks (``begin`` a source, ``feed`` its blocks), then ``finish``."""

    def __init__(self, *, max_evidence: int = MAX_EVIDENCE) -> None:
        self.max_evidence = max_evidence
        self._acc: dict[str, _Acc] = {}
        self._sources: list[str] = []
        self._source = ""
        self._source_rank: int | None = None
        self._base = 0
        self._lines = 0
        self._bytes = 0
        self._pending: list[tuple[_Acc, int]] = []
        self._nccl_rank: dict[tuple[str, int], int] = {}
        self._nccl_hosts: set[str] = set()
        self._seen: set[int] = set()
        self._world: int | None = None
        self._summary: list[int] = []
        self._summary_at = -_SUMMARY_SPAN - 1
        self._detail_pending = 0
        self._tail: list[tuple[int, str]] = []
        self._terminated: set[tuple[str, str]] = set()
        self._progress: dict[int, int] = {}
        self._watchdog: dict[int, tuple[int, str]] = {}
        self._completed: dict[int, int] = {}
        self._ifname: str | None = None

    # -- input --------------------------------------------------------------------------------

    def begin(self, source: str) -> None:
        """Start a new file; a name like ``rank3.log`` or ``attempt_0/3/`` gives its default rank.

        Args:
            source: the file name shown in evidence (``-`` for standard input).
        """
        self._sources.append(source)
        self._source = source
        self._base = 0
        self._pending = []
        m = _FILE_RANK.search(source)
        self._source_rank = int(m.group(1)) if m else None
        self._detail_pending = 0
        self._tail = []

    def feed_text(self, text: str) -> None:
        """Convenience for tests: feed a whole decoded log."""
        if text and not text.endswith("\n"):
            text += "\n"
        self.feed(text.encode("utf-8", errors="replace"))

    def feed(self, block: bytes) -> None:
        """Classify one block of whole lines (it must end with a newline)."""
        if not self._sources:
            self.begin("-")
        self._bytes += len(block)
        starts = self._hit_starts(block)
        pending = self._pending
        self._pending = []
        if pending:
            self._follow(block, 0, self._base + 1, pending)
        line_no = self._base
        last = 0
        visited = set(starts)
        if self._detail_pending:
            self._detail_forward(block, 0, self._base, self._detail_pending, visited)
        for start in starts:
            line_no += block.count(b"\n", last, start)
            last = start
            end = block.find(b"\n", start)
            text = _decode(block[start:end])
            follow = self._line(text, line_no + 1)
            if follow:
                self._follow(block, end + 1, line_no + 2, follow)
            if "Last error" in text:
                self._detail_window(block, start, end, line_no + 1, visited)
        self._keep_tail(block, visited)
        self._track_progress(block)
        nl = block.count(b"\n")
        self._base += nl
        self._lines += nl

    def _detail_window(self, block: bytes, start: int, end: int, line_no: int,
                       visited: set[int]) -> None:
        """Classify the lines around NCCL's "Last error:" (its detail line holds the cause).

        NCCL prints ``ncclXxx: ...`` / ``Last error:`` / the real cause on the next line
        (``Duplicate GPU detected ...``, ``Bootstrap : no socket interface found``). With
        several ranks writing to one stream the detail can land a few lines further, or above
        when lines were reordered, so ``DETAIL_AFTER`` lines below and ``DETAIL_BEFORE`` above
        are run through the rules too (each line once; the window continues into the next
        block, and the previous block's last lines are kept for it).
        """
        pos = start
        for k in range(1, DETAIL_BEFORE + 1):
            if pos == 0:
                for tail_no, text in reversed(self._tail[-(DETAIL_BEFORE + 1 - k):]):
                    self._line(text, tail_no)
                self._tail = []
                break
            prev = block.rfind(b"\n", 0, pos - 1) + 1
            if prev not in visited:
                visited.add(prev)
                self._line(_decode(block[prev:pos - 1]), line_no - k)
            pos = prev
        self._detail_forward(block, end + 1, line_no, DETAIL_AFTER, visited)

    def _detail_forward(self, block: bytes, pos: int, line_no: int, n: int,
                        visited: set[int]) -> None:
        """Classify up to ``n`` lines from ``pos`` (numbered after ``line_no``); the rest of
        the window waits for the next block."""
        self._detail_pending = 0
        for k in range(1, n + 1):
            if pos >= len(block):
                self._detail_pending = n - k + 1
                return
            nxt = block.find(b"\n", pos)
            if pos not in visited:
                visited.add(pos)
                self._line(_decode(block[pos:nxt]), line_no + k)
            pos = nxt + 1

    def _keep_tail(self, block: bytes, visited: set[int]) -> None:
        """Keep the block's last unexamined lines for a "Last error:" early in the next one."""
        tail: list[tuple[int, str]] = []
        end = len(block) - 1
        no = self._base + block.count(b"\n")
        for _ in range(DETAIL_BEFORE):
            if end <= 0:
                break
            start = block.rfind(b"\n", 0, end) + 1
            if start not in visited:
                tail.insert(0, (no, _decode(block[start:end])))
            end, no = start - 1, no - 1
        self._tail = tail

    def _hit_starts(self, block: bytes) -> list[int]:
        """Start offsets of the lines holding an anchor, sorted, each once."""
        starts: set[int] = set()
        for anchor in ANCHORS:
            i = block.find(anchor)
            while i >= 0:
                s = block.rfind(b"\n", 0, i) + 1
                starts.add(s)
                e = block.find(b"\n", i)
                i = block.find(anchor, e + 1) if e >= 0 else -1
        return sorted(starts)

    def _follow(self, block: bytes, pos: int, line_no: int,
                wanted: list[tuple[_Acc, int]]) -> None:
        """Add the lines after a hit (NCCL's "Last error:" detail) to its finding's evidence."""
        n = max(k for _, k in wanted)
        for i in range(n):
            if pos >= len(block):
                self._pending = [(a, k - i) for a, k in wanted if k - i > 0]
                return
            end = block.find(b"\n", pos)
            text = _decode(block[pos:end])
            for acc, k in wanted:
                if i < k and text.strip():
                    self._evidence(acc, line_no + i, text, self.max_evidence + 2)
            pos = end + 1

    # -- one candidate line ---------------------------------------------------------------------

    def _line(self, text: str, line_no: int) -> list[tuple[_Acc, int]]:
        self._facts(text, line_no)
        hit = match_line(text)
        if hit is None:
            return []
        rule, pat, m = hit
        groups = {k: v for k, v in m.groupdict().items() if v is not None}
        summary_rank: int | None = None
        if rule.reason == "RankKilled":
            if not self._killed(groups):
                return []
            # torchrun's own stop signal names no rank, even just after a failure summary
            if self._summary and not pat.last and line_no - self._summary_at <= _SUMMARY_SPAN:
                summary_rank = self._summary[-1]
                if "pid" in groups:
                    groups["who"] = f"rank {summary_rank} (pid {groups['pid']})"
        acc = self._acc.get(rule.reason)
        if acc is None:
            acc = _Acc(rule, (len(self._sources) - 1, line_no), pat.layer or rule.layer)
            self._acc[rule.reason] = acc
        acc.count += 1
        acc.last = acc.last and pat.last
        if "name" in groups and rule.reason == "RankKilled" and len(acc.signals) < 8:
            acc.signals[groups["name"]] = None
        self._evidence(acc, line_no, text, self.max_evidence)
        if len(acc.messages) < 3:
            try:
                acc.messages[pat.message.format(**groups)] = None
            except (KeyError, IndexError):
                acc.messages[pat.message] = None
        who = line_rank(text)
        rank = who.rank if who.rank is not None else (
            None if who.nccl else self._source_rank)
        if rank is None:
            rank = summary_rank
        if rank is not None:
            self._add_rank(acc, rank)
        elif who.nccl is not None and len(acc.nccl) < MAX_RANKS:
            acc.nccl[who.nccl] = None
        for name in ("a", "b", "rank"):
            value = m.groupdict().get(name)
            if value is not None:
                self._add_rank(acc, int(value))
        if rule.reason == "CollectiveTimeout" and rank is not None:
            w = _WATCHDOG.search(text, 0, MAX_MATCH_CHARS)
            if w and len(self._watchdog) < MAX_RANKS:
                self._watchdog.setdefault(rank, (int(w.group(1)), w.group(2)))
        return [(acc, pat.follow)] if pat.follow else []

    def _evidence(self, acc: _Acc, line_no: int, text: str, limit: int) -> None:
        if len(acc.evidence) >= limit or any(
                e.line == line_no and e.source == self._source for e in acc.evidence):
            return
        acc.evidence.append(Evidence(self._source, line_no, _cut(text)))

    def _add_rank(self, acc: _Acc, rank: int) -> None:
        if len(acc.ranks) < MAX_RANKS:
            acc.ranks[rank] = None
        self._see(rank)

    def _see(self, rank: int) -> None:
        if len(self._seen) < MAX_RANKS:
            self._seen.add(rank)

    def _killed(self, groups: dict[str, str]) -> bool:
        """Name the signal of a RankKilled hit; False for torchrun's own SIGTERM to the others.

        After one rank fails, torchrun logs "Sending process PID closing signal SIGTERM" for
        each other rank and its failure summary then lists them with exitcode -15: a
        consequence, not a kill from outside.
        """
        name = groups.get("name")
        if name is None:
            name = SIGNAL_NAMES.get(int(groups.get("sig", "0")), f"signal {groups.get('sig')}")
            groups["name"] = name
        groups["hint"] = SIGNAL_HINTS.get(name, "see that rank's last lines")
        pid = groups.get("pid")
        if pid is not None:
            groups["who"] = f"process {pid}"
        return (pid, name) not in self._terminated

    def _facts(self, text: str, line_no: int = 0) -> None:
        """Rank facts printed by NCCL and torchrun (not failures themselves)."""
        if "closing signal" in text or "forcefully exiting" in text:
            t = _TORCHRUN_TERM.search(text, 0, MAX_MATCH_CHARS)
            if t and len(self._terminated) < MAX_RANKS:
                self._terminated.add((t.group(1) or t.group(3), t.group(2) or t.group(4)))
        if "ncclCommInitRank" in text or "nRanks" in text:
            m = NCCL_INIT.search(text, 0, MAX_MATCH_CHARS)
            who = line_rank(text)
            if m:
                rank, nranks = int(m.group(1)), int(m.group(2))
                self._see(rank)
                self._world = max(self._world or 0, nranks)
                if who.nccl is not None and len(self._nccl_rank) < MAX_RANKS:
                    self._nccl_rank[who.nccl[:2]] = rank
            if who.nccl is not None and len(self._nccl_hosts) < MAX_RANKS:
                self._nccl_hosts.add(who.nccl[0])
        if "SOCKET_IFNAME set" in text:
            m = _IFNAME_SET.search(text, 0, MAX_MATCH_CHARS)
            if m:
                self._ifname = f"{m.group(1)}={m.group(2)}"
        if "global_world_sizes" in text:
            m = WORLD_SIZES.search(text, 0, MAX_MATCH_CHARS)
            if m:
                self._world = int(m.group(1))
        if "(local_rank:" in text:
            m = SUMMARY_RANK.search(text, 0, MAX_MATCH_CHARS)
            if m and len(self._summary) < MAX_RANKS:
                self._summary.append(int(m.group(1)))
                self._summary_at = line_no
                self._see(int(m.group(1)))
        if "Timeout at NCCL work" in text:
            m = _TIMEOUT_AT.search(text, 0, MAX_MATCH_CHARS)
            r = PG_RANK.search(text, 0, MAX_MATCH_CHARS)
            tr: int | None = int(r.group(1)) if r else line_rank(text).rank
            if m and tr is not None and len(self._completed) < MAX_RANKS:
                self._completed[tr] = int(m.group(3))

    # -- progress -----------------------------------------------------------------------------

    def _track_progress(self, block: bytes) -> None:
        """Record each rank's last progress line in this block, scanning from its end.

        Walks at most ``TAIL_LINES`` lines back; a rank prefix still unresolved then (a rank
        that printed only non-progress lines lately) is searched back with ``rfind`` on its own.
        """
        keys: set[bytes] = set(_KEY.findall(block)) if b"]:" in block else set()
        if self._source_rank is not None:
            keys.add(b"")
        if not keys:
            return
        for key in keys:
            if key:
                self._see(int(re.sub(rb"\D", b"", key)))
        todo = set(keys)
        end = len(block) - 1
        for _ in range(TAIL_LINES):
            if not todo or end <= 0:
                break
            start = block.rfind(b"\n", 0, end) + 1
            self._progress_line(block, start, end, todo)
            end = start - 1
        for key in list(todo):
            if not key:
                continue
            pos = len(block)
            while key in todo:
                pos = block.rfind(key, 0, pos)
                if pos < 0:
                    break
                start = block.rfind(b"\n", 0, pos) + 1
                self._progress_line(block, start, block.find(b"\n", pos), todo)

    def _progress_line(self, block: bytes, start: int, end: int, todo: set[bytes]) -> None:
        chain: list[bytes] = []
        pos = start
        while len(chain) < 3:
            m = _KEY.match(block, pos)
            if m is None:
                break
            chain.append(m.group(0))
            pos = m.end()
        if not chain and b"" in todo:
            chain = [b""]
        if not todo.intersection(chain):
            return
        text = _decode(block[start:end])
        value = progress_of(text)
        if value is None:
            return
        found = line_rank(text).rank
        rank = found if found is not None else self._source_rank
        todo.difference_update(chain)
        if rank is not None and (rank in self._progress or len(self._progress) < MAX_RANKS):
            self._progress[rank] = value

    # -- output -------------------------------------------------------------------------------

    def finish(self) -> Explanation:
        """Resolve NCCL ranks, build the rank summary and order findings cause-first."""
        single_host = len(self._nccl_hosts) <= 1
        for acc in self._acc.values():
            for host, pid, dev in acc.nccl:
                rank = self._nccl_rank.get((host, pid))
                if rank is None and single_host:
                    rank = dev
                if rank is not None:
                    self._add_rank(acc, rank)
        summary = self._summary_ranks()
        root = summary.root_cause
        ordered = sorted(self._acc.values(), key=lambda a: (
            self._tier(a), 0 if root is not None and root in a.ranks else 1, a.first))
        findings = tuple(self._finding(a, summary) for a in ordered)
        return Explanation(findings, summary, tuple(self._sources), self._lines, self._bytes)

    def _tier(self, acc: _Acc) -> int:
        """The rule's tier, except for a kill that is a consequence.

        A reason only ``last`` patterns hit (torchrun itself stopped from outside) goes after
        every other finding: it is the cause only when nothing else is found.

        ProcessGroupNCCL takes a rank down with SIGABRT once its watchdog saw a timeout or an
        NCCL error ("To avoid data inconsistency, we are taking the entire process down"): when
        every kill is a SIGABRT of a rank that another finding already names, the kill is that
        finding's consequence and goes last.
        """
        if acc.last:
            return SYMPTOM + 1
        if acc.rule.reason != "RankKilled" or set(acc.signals) != {"SIGABRT"} or not acc.ranks:
            return acc.rule.tier
        named = {r for other in self._acc.values() if other is not acc for r in other.ranks}
        return SYMPTOM + 1 if set(acc.ranks) <= named else acc.rule.tier

    def _summary_ranks(self) -> RankSummary:
        failed: dict[int, None] = {}
        root = self._summary[-1] if self._summary else None
        if root is not None:
            failed[root] = None
        for acc in sorted(self._acc.values(), key=lambda a: (a.rule.tier, a.first)):
            if acc.rule.tier < SYMPTOM:
                failed.update(acc.ranks)
        failed.update(dict.fromkeys(self._summary))
        seen = set(self._seen)
        if self._world is not None and self._world <= MAX_RANKS:
            seen.update(range(self._world))
        progress = dict(self._progress)
        stalled: tuple[int, ...] = ()
        never: tuple[int, ...] = ()
        if progress:
            top = max(progress.values())
            stalled = tuple(sorted((r for r, v in progress.items() if v < top),
                                   key=lambda r: (progress[r], r)))
            if len(progress) >= 2:
                never = tuple(sorted(seen - set(progress)))
        return RankSummary(tuple(sorted(seen)), self._world, tuple(failed), root, progress,
                           stalled, never)

    def _finding(self, acc: _Acc, summary: RankSummary) -> Finding:
        ranks = tuple(acc.ranks)
        message = "; ".join(acc.messages)
        details: dict[str, Detail] = {}
        if ranks:
            message += f" ({plural('rank', ranks)})"
        if acc.count > 1:
            message += f"; {acc.count} lines"
        if acc.rule.reason == "NoSocketInterface" and self._ifname:
            message += f"; the log shows {self._ifname}"
            details["socket_ifname"] = self._ifname
        if acc.rule.reason == "CollectiveTimeout":
            message, details = self._timeout_details(message, ranks, summary)
        if acc.rule.tier == ORIGIN and summary.stalled and acc.rule.reason not in (
                "PortInUse", "MissingLauncherEnv"):
            details["stalled_ranks"] = list(summary.stalled)
        return Finding(acc.rule.reason, acc.layer, message, acc.rule.remedy,
                       tuple(acc.evidence), ranks, acc.count, details)

    def _timeout_details(self, message: str, ranks: tuple[int, ...], summary: RankSummary
                         ) -> tuple[str, dict[str, Detail]]:
        details: dict[str, Detail] = {}
        if self._watchdog:
            details["watchdog"] = {str(r): {"seq": s, "op": op}
                                   for r, (s, op) in sorted(self._watchdog.items())}
            seqs = {s for s, _ in self._watchdog.values()}
            if len(seqs) > 1:
                low = min(seqs)
                behind = sorted(r for r, (s, _) in self._watchdog.items() if s == low)
                message += (f"; {plural('rank', behind)} timed out on an earlier SeqNum {low} "
                            f"than the others (they fell behind)")
        timed_out = set(ranks)
        if self._completed:
            details["last_completed_seq"] = {str(r): v for r, v in sorted(self._completed.items())}
        if timed_out and summary.seen:
            others = sorted(set(summary.seen) - timed_out)
            details["timed_out_ranks"] = sorted(timed_out)
            details["not_timed_out_ranks"] = others
            if others:
                message += (f"; {plural('rank', others)} did not time out: the collective was "
                            f"waiting for them, look there first")
        if summary.stalled:
            first = summary.stalled[0]
            message += (f"; rank {first} stopped progressing first (last reported "
                        f"{summary.progress[first]}, others up to "
                        f"{max(summary.progress.values())})")
            details["stalled_ranks"] = list(summary.stalled)
        if summary.never_reported:
            message += f"; {plural('rank', summary.never_reported)} never reported progress"
        return message, details


def classify_texts(texts: Iterable[tuple[str, str]]) -> Explanation:
    """Classify ``(source name, text)`` pairs held in memory (tests, small inputs)."""
    c = Classifier()
    for name, text in texts:
        c.begin(name)
        c.feed_text(text)
    return c.finish()
