"""The streaming classifier: blocks of log lines in, ordered diagnoses with ranks out.

Speed (>= 50 MB/s, bounded memory): a block is searched for a few anchor substrings
(``rules.ANCHORS``, blocks.AnchorScan: one RE2 pass where google-re2 is installed, else one
``bytes.find`` pass each); only lines holding one are decoded and run through the rules
(matching.py). Around some of them a few more lines are read (blocks.py): NCCL's ``Last error:``
detail, a traceback frame's source line, the lines a pattern adds to its evidence. Rank facts
come from facts.py, per-rank progress from the end of each block (progress.py). Memory is
bounded: at most ``max_evidence`` lines per finding, ``MAX_RANKS`` ranks tracked (and a note
says when more were seen).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from preflight.explain.blocks import (
    AnchorScan,
    decode,
    every_start,
    last_lines,
    lines_above,
    lines_from,
)
from preflight.explain.facts import HOOKS, MAX_RANKS, Acc, LogFacts, tier_of
from preflight.explain.matching import (
    FRAMES,
    child_frame,
    collective_frame,
    continued,
    exception,
    exception_line,
    file_name,
    frame_call,
    installed_code,
    job_exception,
    last_error_detail,
    match_frame,
    match_line,
    model_code,
    passed_exception,
    says_error,
)
from preflight.explain.model import (
    Detail,
    Diagnosis,
    Evidence,
    Explanation,
    FirstError,
    RankSummary,
)
from preflight.explain.progress import ProgressTracker, stalled_and_silent
from preflight.explain.ranks import line_rank, plural
from preflight.explain.rules import (
    ANCHORS,
    BY_REASON,
    JOB_EXCEPTION_RULE,
    KILLED,
    ORIGIN,
    SYMPTOM,
    Layer,
    Pattern,
    Rule,
)

MAX_EVIDENCE = 5
MAX_EVIDENCE_CHARS = 400
#: Lines after / before NCCL's "Last error:" examined for its detail.
DETAIL_AFTER, DETAIL_BEFORE = 4, 2
#: How many lines after a collective's traceback frame its exception line may come (the frames
#: below it, the source lines, a chained "During handling" block).
COLLECTIVE_SPAN = 40
#: How many lines after the last traceback frame its exception line comes (the source line, and
#: Python 3.11's ``^^^^`` markers).
EXCEPTION_SPAN = 4
#: How many lines one traceback frame comes after the one above it (its source line, Python
#: 3.11's ``^^^^`` / ``~~~^^^`` markers): a frame further down starts another traceback.
FRAME_GAP = 4
#: The candidate lines of a block: those holding an anchor.
SCAN = AnchorScan(ANCHORS)
#: A log of at most this many bytes in which no anchor line names a cause is read again with
#: every line a candidate (:func:`reread`): a pasted error message often lacks every anchor
#: word (NCCL's ``Duplicate GPU detected`` alone, ``Expected object of backend CUDA but got
#: backend CPU`` without its ``RuntimeError:``). A job's log that big is never read twice.
REREAD_BYTES = 64 << 10
_FILE_RANK = re.compile(r"(?:rank[_-]?|attempt_\d{1,5}/)(\d{1,7})(?:\D|$)")


def _cut(text: str) -> str:
    text = text.rstrip("\r\n")
    return text if len(text) <= MAX_EVIDENCE_CHARS else text[:MAX_EVIDENCE_CHARS] + "..."


@dataclass
class _Frame:
    """A recognised traceback frame not yet committed: a deeper one of the same rank's
    traceback replaces it (the innermost frame is the most specific)."""

    rule: Rule
    message: str
    evidence: list[tuple[int, str]]
    rank: int | None
    line: int


class Classifier:
    """Feed it log blocks (``begin`` a source, ``feed`` its blocks), then ``finish``."""

    def __init__(self, *, max_evidence: int = MAX_EVIDENCE, every_line: bool = False) -> None:
        self.max_evidence = max_evidence
        #: Every line a candidate, not only those holding an anchor (:func:`reread`).
        self.every_line = every_line
        self._acc: dict[str, Acc] = {}
        self._sources: list[str] = []
        self._source = ""
        self._source_rank: int | None = None
        self._base = 0
        self._lines = 0
        self._bytes = 0
        self._follow: list[tuple[Acc, int]] = []
        self._detail_pending = 0
        self._tail: list[tuple[int, str]] = []
        self._frame_wait: tuple[str, int, str] | None = None
        self._frames: dict[int | None, _Frame] = {}
        self._collective: tuple[int, str] | None = None
        self._last_frame: tuple[int, str, str, str] | None = None
        #: The last frame of the job's own file in the traceback being read, if it had one.
        self._job_frame: tuple[int, str, str, str] | None = None
        #: Whether the traceback being read ran in a process multiprocessing started.
        self._child = False
        #: The line of the first frame of the traceback being read.
        self._tb_start = 0
        #: The first exception line and the first "error:" line, by (file index, line).
        self._first: dict[bool, tuple[tuple[int, int], FirstError]] = {}
        self.facts = LogFacts()
        self._progress = ProgressTracker(MAX_RANKS, self.facts.see)
        self._nccl_capped = 0
        self._external: list[Diagnosis] = []

    # -- input --------------------------------------------------------------------------------

    def begin(self, source: str) -> None:
        """Start a new file; a name like ``rank3.log`` or ``attempt_0/3/`` gives its default rank.

        Args:
            source: the file name shown in evidence (``-`` for standard input).
        """
        self._commit_frames()
        self._progress.flush()
        self._sources.append(source)
        self._source = source
        self._base = 0
        self._follow = []
        m = _FILE_RANK.search(source)
        self._source_rank = int(m.group(1)) if m else None
        self._detail_pending = 0
        self._tail = []
        self._frame_wait = None
        self._collective = None
        self._last_frame = None
        self._job_frame = None
        self._child = False
        self._tb_start = 0

    def count_source(self, source: str) -> None:
        """Name a source read elsewhere (a flight recorder dump) among those read."""
        self._commit_frames()
        self._sources.append(source)

    def add_external(self, diagnoses: Iterable[Diagnosis]) -> None:
        """Diagnoses from elsewhere (flight recorder dumps): ordered like a killed rank, after
        a log's own killed rank (the log says why it died, the dump says where it stopped)."""
        self._external.extend(diagnoses)

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
        starts = every_start(block) if self.every_line else SCAN.starts(block)
        visited = set(starts)
        self._carry_over(block, visited)
        line_no = self._base
        last = 0
        for start in starts:
            line_no += block.count(b"\n", last, start)
            last = start
            end = block.find(b"\n", start)
            text = decode(block[start:end])
            follow = self._line(text, line_no + 1)
            if follow:
                self._follow_lines(block, end + 1, line_no + 2, follow)
            if "Last error" in text:
                self._detail_window(block, start, end, line_no + 1, visited)
            elif text.rstrip().endswith(":") and continued(text):
                # an exception whose message goes on below ("ImportError: ... due to the
                # following error:" / "the package flash_attn seems to be not installed."):
                # its next line is matched too, as NCCL's detail is
                self._detail_lines(block, end + 1, line_no + 1, 1, visited)
            call = frame_call(text)
            if call is not None:
                if (self._last_frame is None
                        or line_no + 1 - self._last_frame[0] > FRAME_GAP):
                    self._job_frame = None  # another traceback
                    self._child = False
                    self._tb_start = line_no + 1
                self._last_frame = (line_no + 1, call[0], call[2], call[1])
                if child_frame(call):
                    self._child = True
                if not installed_code(call[0]):
                    self._job_frame = self._last_frame
                inside = collective_frame(call)
                if inside is not None:
                    self._collective = (line_no + 1, call[1]) if inside else None
                if call[1] in FRAMES:
                    self._frame_source(block, end + 1, call[1], line_no + 1, text)
        self._tail = [(self._base + block.count(b"\n", 0, off) + 1, text)
                      for off, text in last_lines(block, DETAIL_BEFORE) if off not in visited]
        self._progress.track(block, self._source_rank, decode)
        nl = block.count(b"\n")
        self._base += nl
        self._lines += nl

    def _carry_over(self, block: bytes, visited: set[int]) -> None:
        """Finish the windows the previous block's last lines opened."""
        if self._follow:
            wanted, self._follow = self._follow, []
            self._follow_lines(block, 0, self._base + 1, wanted)
        if self._frame_wait is not None:
            function, frame_no, frame_text = self._frame_wait
            self._frame_wait = None
            self._frame_source(block, 0, function, frame_no, frame_text)
        if self._detail_pending:
            n, self._detail_pending = self._detail_pending, 0
            self._detail_lines(block, 0, self._base, n, visited)

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
        above, lacking = lines_above(block, start, DETAIL_BEFORE)
        for k, (off, text) in enumerate(above, 1):
            if off not in visited:
                visited.add(off)
                self._line(text, line_no - k)
        if lacking:
            for tail_no, text in reversed(self._tail[-lacking:]):
                self._line(text, tail_no)
            self._tail = []
        if last_error_detail(block[start:end].decode("utf-8", "replace")) is None:
            below, _ = lines_from(block, end + 1, 1)
            if below and below[0][1].strip():
                self.facts.heard(below[0][1])
        self._detail_lines(block, end + 1, line_no, DETAIL_AFTER, visited)

    def _detail_lines(self, block: bytes, pos: int, line_no: int, n: int,
                      visited: set[int]) -> None:
        """Classify up to ``n`` lines from ``pos`` (numbered after ``line_no``); the rest of
        the window waits for the next block."""
        lines, self._detail_pending = lines_from(block, pos, n)
        for k, (off, text) in enumerate(lines, 1):
            if off not in visited:
                visited.add(off)
                self._line(text, line_no + k)

    def _follow_lines(self, block: bytes, pos: int, line_no: int,
                      wanted: list[tuple[Acc, int]]) -> None:
        """Add the lines after a hit (NCCL's "Last error:" detail) to its finding's evidence."""
        n = max(k for _, k in wanted)
        lines, _ = lines_from(block, pos, n)
        for i, (_, text) in enumerate(lines):
            for acc, k in wanted:
                if i < k and text.strip():
                    self._evidence(acc, line_no + i, text, self.max_evidence + 2)
        if len(lines) < n:
            self._follow = [(a, k - len(lines)) for a, k in wanted if k - len(lines) > 0]

    def _frame_source(self, block: bytes, pos: int, function: str, frame_no: int,
                      frame_text: str) -> None:
        """Read a recognised frame's source line (the next one) and match the frame."""
        lines, lacking = lines_from(block, pos, 1)
        if lacking:
            self._frame_wait = (function, frame_no, frame_text)
            return
        source = lines[0][1]
        hit = match_frame(function, source)
        if hit is None:
            return
        rule, frame, m = hit
        groups = {k: v for k, v in m.groupdict().items() if v is not None}
        try:
            message = frame.message.format(**groups)
        except (KeyError, IndexError):
            message = frame.message
        rank = self._rank_of(frame_text)
        self._frames[rank] = _Frame(rule, message, [(frame_no, frame_text),
                                                    (frame_no + 1, source)], rank, frame_no)

    # -- one candidate line ---------------------------------------------------------------------

    def _line(self, text: str, line_no: int) -> list[tuple[Acc, int]]:
        """Facts and failures of one candidate line; NCCL's ``Last error: DETAIL`` on the same
        line is matched on its own too (the detail names the specific cause)."""
        self.facts.observe(text, line_no)
        hit = match_line(text)
        follow = self._take(hit, text, line_no) if hit is not None else []
        if hit is None:
            self._script_exception(text, line_no)
            self._first_error(text, line_no)
        detail = last_error_detail(text)
        if detail is not None:
            self.facts.heard(detail)
            inner = match_line(detail)
            if inner is not None and (hit is None or inner[0] is not hit[0]):
                self._take(inner, detail, line_no, evidence=text)
        return follow

    def _take(self, hit: tuple[Rule, Pattern, re.Match[str]], text: str, line_no: int, *,
              evidence: str | None = None) -> list[tuple[Acc, int]]:
        rule, pat, m = hit
        groups = {k: v for k, v in m.groupdict().items() if v is not None}
        template = pat.message
        if pat.in_collective is not None and (op := self._in_collective(line_no)) is not None:
            reason, template = pat.in_collective
            rule = BY_REASON[reason]
            groups["op"] = op
        if pat.in_child is not None and self._child and self._exception_line(line_no):
            reason, template = pat.in_child
            rule = BY_REASON[reason]
        keep, fallback = HOOKS[rule.hook].accept(self.facts, groups, pat, line_no)
        if not keep:
            return []
        who = line_rank(evidence or text)
        rank = who.rank if who.rank is not None else (
            None if who.nccl else self._source_rank)
        if pat.names_rank and "rank" in groups:
            rank = int(groups["rank"])
        if rank is None:
            rank = fallback
        pending = self._frames.get(rank)
        if (pending is not None and pending.rule is not rule and pending.line >= self._tb_start
                and self._exception_line(line_no) and exception(text) is not None):
            del self._frames[rank]  # the exception's own words outrank the frame's guess
        self._commit_frame(rank)
        try:
            message = template.format(**groups)
        except (KeyError, IndexError):
            message = template
        acc = self._count(rule, pat, pat.layer or rule.layer, message, line_no)
        self._evidence(acc, line_no, evidence or text, self.max_evidence)
        if rank is not None:
            self._add_rank(acc, rank)
        elif who.nccl is not None:
            if len(acc.nccl) < MAX_RANKS:
                acc.nccl[who.nccl] = None
            else:
                self._nccl_capped += 1
        for name in ("a", "b", "rank"):
            value = m.groupdict().get(name)
            if value is not None:
                self._add_rank(acc, int(value))
        HOOKS[rule.hook].record(self.facts, acc, groups, text, rank)
        return [(acc, pat.follow)] if pat.follow else []

    def _count(self, rule: Rule, pat: Pattern | None, layer: Layer, message: str,
               line_no: int) -> Acc:
        acc = self._acc.get(rule.reason)
        if acc is None:
            acc = Acc(rule, (len(self._sources) - 1, line_no), layer)
            self._acc[rule.reason] = acc
        acc.hit(pat)
        if len(acc.messages) < 3:
            acc.messages[message] = None
        return acc

    def _script_exception(self, text: str, line_no: int) -> None:
        """Count a traceback's exception line no rule knows when the frame just above it is in
        the job's own file (the job's code raised it), or when installed code raised one of
        ``PASSED_EXCEPTIONS`` in a traceback that holds a frame of the job's file (the job's
        call passed it what it cannot take: that call is named), or raised it in torch's layers
        or optimizers, which only the model calls (``model_code``), frame of the job's or not."""
        rule = JOB_EXCEPTION_RULE
        if self._last_frame is None or rule is None or not self._exception_line(line_no):
            return
        _, file, no, function = self._last_frame
        parsed = exception(text)
        if parsed is None:
            return
        exc = job_exception(parsed, file)
        library: str | None = None
        layer = False
        if exc is None and self._job_frame is not None:
            # raised in installed code, called from the job's file: what the job passed
            exc = passed_exception(parsed)
            library = file_name(file)
            _, file, no, _ = self._job_frame
        elif exc is None and model_code(file):
            # raised by a torch layer or optimizer with no frame of the job's file left (the
            # paste starts below it): only the model calls them, so it is what the model passed
            exc = passed_exception(parsed)
            layer = True
        if exc is None:
            return
        cls, msg = exc
        rank = self._rank_of(text)
        self._commit_frame(rank)
        name = file_name(file)
        said = f": {msg[:160]}" if msg else " (no message)"
        if layer:
            message = (f"torch's {name}:{no} ({function}) refused what the model gave it: "
                       f"{cls}{said}")
        elif library is None:
            message = f"the job's code raised {cls} at {name}:{no}{said}"
        else:
            message = (f"the job's call at {name}:{no} made installed code ({library}) raise "
                       f"{cls}{said}")
        acc = self._count(rule, None, rule.layer, message, line_no)
        self._evidence(acc, line_no, text, self.max_evidence)
        if rank is not None:
            self._add_rank(acc, rank)

    def _first_error(self, text: str, line_no: int) -> None:
        """Keep the log's first exception line and first "error:" line no rule knows: where
        to start reading when nothing is recognised."""
        key = (len(self._sources) - 1, line_no)
        first_exception = self._first.get(True)
        if first_exception is not None and first_exception[0] <= key:
            return  # neither a later exception nor an "error:" line can change the answer
        cls = exception_line(text)
        if cls is None:
            first_said = self._first.get(False)
            if (first_said is not None and first_said[0] <= key) or not says_error(text):
                return
        frame: tuple[str, int, str] | None = None
        if cls is not None and self._last_frame is not None and self._exception_line(line_no):
            _, file, no, function = self._last_frame
            frame = (file, int(no), function)
        self._first[cls is not None] = (key, FirstError(
            Evidence(self._source, line_no, _cut(text)), cls, frame,
            frame is not None and installed_code(frame[0]), self._rank_of(text)))

    def _exception_line(self, line_no: int) -> bool:
        """Whether ``line_no`` comes where the exception line of the traceback just read
        does (right below its last frame)."""
        return (self._last_frame is not None
                and 0 < line_no - self._last_frame[0] <= EXCEPTION_SPAN)

    def _in_collective(self, line_no: int) -> str | None:
        """The collective whose traceback frame came just above ``line_no``, if one did."""
        if self._collective is None:
            return None
        at, op = self._collective
        return op if 0 < line_no - at <= COLLECTIVE_SPAN else None

    def _commit_frames(self) -> None:
        """Count every rank's pending traceback frame (a source or the input ended)."""
        for rank in list(self._frames):
            self._commit_frame(rank)

    def _commit_frame(self, rank: int | None) -> None:
        """Count the pending traceback frame of ``rank``: its traceback went on to other
        lines (the exception line, another failure)."""
        fr = self._frames.pop(rank, None)
        if fr is None:
            return
        acc = self._count(fr.rule, None, fr.rule.layer, fr.message, fr.line)
        for no, text in fr.evidence:
            self._evidence(acc, no, text, self.max_evidence)
        if fr.rank is not None:
            self._add_rank(acc, fr.rank)

    def _rank_of(self, text: str) -> int | None:
        who = line_rank(text)
        return who.rank if who.rank is not None else (None if who.nccl else self._source_rank)

    def _evidence(self, acc: Acc, line_no: int, text: str, limit: int) -> None:
        if len(acc.evidence) >= limit or any(
                e.line == line_no and e.source == self._source for e in acc.evidence):
            return
        acc.evidence.append(Evidence(self._source, line_no, _cut(text)))

    def _add_rank(self, acc: Acc, rank: int) -> None:
        if len(acc.ranks) < MAX_RANKS:
            acc.ranks[rank] = None
        self.facts.see(rank)

    # -- output -------------------------------------------------------------------------------

    def finish(self) -> Explanation:
        """Resolve NCCL ranks, build the rank summary and order findings cause-first."""
        self._commit_frames()
        self._progress.flush()
        facts = self.facts
        single_host = len(facts.nccl_hosts) <= 1
        for acc in self._acc.values():
            for host, pid, dev in acc.nccl:
                rank = facts.nccl_rank.get((host, pid))
                if rank is None and single_host:
                    rank = dev
                if rank is not None:
                    self._add_rank(acc, rank)
        accs = [a for a in self._acc.values() if self._counts(a)]
        summary = self._summary_ranks(accs)
        root = summary.root_cause
        keyed = [((tier_of(a, [o for o in accs if o is not a]), a.rule.generic,
                   0 if root is not None and root in a.ranks else 1, a.first),
                  self._diagnosis(a, summary)) for a in accs]
        keyed += [((KILLED, False, 1, (len(self._sources), i)), d)
                  for i, d in enumerate(self._external)]
        findings = tuple(d for _, d in sorted(keyed, key=lambda kd: kd[0]))
        first = None
        if not findings:
            kept = self._first.get(True) or self._first.get(False)
            first = None if kept is None else kept[1]
        return Explanation(findings, summary, tuple(self._sources), self._lines, self._bytes,
                           self._notes(), first_error=first)

    def _counts(self, acc: Acc) -> bool:
        """False for a finding only ``only_with`` patterns hit when the log lacks the finding
        they support (a memory report without a kill)."""
        need = acc.only_with
        return not need or (need in self._acc and not self._acc[need].only_with)

    def _notes(self) -> tuple[str, ...]:
        capped = self.facts.capped + self._progress.capped + self._nccl_capped
        if not capped:
            return ()
        return (f"more than {MAX_RANKS:,} ranks: only the first {MAX_RANKS:,} are tracked, so "
                "the ranks seen, failed and their progress are incomplete",)

    def _summary_ranks(self, accs: list[Acc]) -> RankSummary:
        facts = self.facts
        failed: dict[int, None] = {}
        root = facts.summary[-1] if facts.summary else None
        if root is not None:
            failed[root] = None
        for acc in sorted(accs, key=lambda a: (a.rule.tier, a.first)):
            if acc.rule.tier < SYMPTOM:
                failed.update(acc.ranks)
        failed.update(dict.fromkeys(facts.summary))
        seen = set(facts.seen)
        if facts.world is not None and facts.world <= MAX_RANKS:
            seen.update(range(facts.world))
        progress = dict(self._progress.progress)
        stalled, never = stalled_and_silent(progress, seen)
        return RankSummary(tuple(sorted(seen)), facts.world, tuple(failed), root, progress,
                           stalled, never)

    def _diagnosis(self, acc: Acc, summary: RankSummary) -> Diagnosis:
        ranks = tuple(acc.ranks)
        message = "; ".join(acc.messages)
        if ranks:
            message += f" ({plural('rank', ranks)})"
        if acc.count > 1:
            message += f"; {acc.count} lines"
        message, details = HOOKS[acc.rule.hook].describe(self.facts, acc, summary, message)
        details = dict(details)
        if acc.rule.tier == ORIGIN and acc.rule.progress and summary.stalled:
            details["stalled_ranks"] = list(summary.stalled)
        return Diagnosis(acc.rule.reason, acc.layer, message, acc.rule.remedy,
                         tuple(acc.evidence), ranks, acc.count, details)


class Kept:
    """The blocks of the logs read, kept while they add up to at most ``REREAD_BYTES``."""

    def __init__(self) -> None:
        self.logs: list[tuple[str, list[bytes]]] | None = []
        self._bytes = 0

    def begin(self, source: str) -> None:
        if self.logs is not None:
            self.logs.append((source, []))

    def add(self, block: bytes) -> None:
        if self.logs is None:
            return
        self._bytes += len(block)
        if self._bytes > REREAD_BYTES:
            self.logs = None  # too big to read twice
        else:
            self.logs[-1][1].append(block)


def reread(expl: Explanation, kept: Kept) -> Explanation:
    """``expl`` again with every line of the logs a candidate, where it found nothing and the
    logs were small enough to keep (``REREAD_BYTES``); else ``expl`` itself."""
    if expl.findings or kept.logs is None or not kept.logs:
        return expl
    c = Classifier(every_line=True)
    for name, blocks in kept.logs:
        c.begin(name)
        for block in blocks:
            c.feed(block)
    again = c.finish()
    return again if again.findings else expl


def classify_texts(texts: Iterable[tuple[str, str]]) -> Explanation:
    """Classify ``(source name, text)`` pairs held in memory (tests, small inputs)."""
    c = Classifier()
    kept = Kept()
    for name, text in texts:
        c.begin(name)
        kept.begin(name)
        data = (text if not text or text.endswith("\n") else text + "\n").encode(
            "utf-8", errors="replace")
        c.feed(data)
        kept.add(data)
    return reread(c.finish(), kept)


__all__ = ["BY_REASON", "Classifier", "Detail", "Kept", "classify_texts", "reread"]
