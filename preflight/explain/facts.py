"""Facts a log states besides its failures, and each rule hook's use of them.

:class:`LogFacts` collects what NCCL and the launchers print about ranks (``ncclCommInitRank ...
rank R nranks N``, torchrun's failure summary and its own SIGTERMs, the socket interface set,
the watchdog's last completed work, NCCL's WARN lines). :data:`HOOKS` implements the
:class:`~preflight.explain.rules.Hook` a rule names: what its matches carry beyond the message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from preflight.explain.model import Detail, Evidence, RankSummary
from preflight.explain.ranks import (
    MAX_MATCH_CHARS,
    NCCL_INIT,
    PG_RANK,
    SUMMARY_RANK,
    WORLD_SIZES,
    line_rank,
    plural,
)
from preflight.explain.rules import (
    SIGNAL_HINTS,
    SIGNAL_NAMES,
    SIGNAL_WORDS,
    SYMPTOM,
    WRAPPER,
    Hook,
    Layer,
    Pattern,
    Rule,
)

MAX_RANKS = 4096
_TIMEOUT_AT = re.compile(r"Timeout at NCCL work: (\d{1,20}), last enqueued NCCL work: (-?\d{1,20}),"
                         r" last completed NCCL work: (-?\d{1,20})")
_WATCHDOG = re.compile(r"SeqNum=(\d{1,20}), OpType=(\w{1,40})")
_IFNAME_SET = re.compile(r"((?:NCCL|GLOO)_SOCKET_IFNAME) set by environment to (\S{1,64})")
_TORCHRUN_TERM = re.compile(r"Sending process (\d{1,10}) closing signal (SIGTERM)|Unable to "
                            r"shutdown process (\d{1,10}) via Signals\.SIGTERM, forcefully "
                            r"exiting via Signals\.(SIGKILL)")
_NCCL_WARN = re.compile(r"NCCL WARN (?P<text>\S[^\n]{0,300})")
#: Lines between a failure summary's ``rank : R (local_rank: L)`` and its ``traceback`` line.
SUMMARY_SPAN = 6
#: What NCCL said, kept for the generic NCCL error's message.
MAX_SAID = 3


@dataclass
class Acc:
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
    only_with: str | None = None

    def hit(self, pat: Pattern | None) -> None:
        """Count one match of ``pat`` (None: a traceback frame)."""
        self.count += 1
        self.last = self.last and pat is not None and pat.last
        need = pat.only_with if pat is not None else ""
        self.only_with = need if self.only_with in (None, need) else ""


class LogFacts:
    """Rank facts printed by NCCL and the launchers (not failures themselves)."""

    def __init__(self) -> None:
        self.terminated: set[tuple[str, str]] = set()
        self.nccl_rank: dict[tuple[str, int], int] = {}
        self.nccl_hosts: set[str] = set()
        self.seen: set[int] = set()
        self.world: int | None = None
        self.summary: list[int] = []
        self.summary_at = -SUMMARY_SPAN - 1
        self.ifname: str | None = None
        self.completed: dict[int, int] = {}
        self.watchdog: dict[int, tuple[int, str]] = {}
        self.said: dict[str, None] = {}
        self.capped = 0

    def see(self, rank: int) -> None:
        if rank in self.seen:
            return
        if len(self.seen) < MAX_RANKS:
            self.seen.add(rank)
        else:
            self.capped += 1

    def observe(self, text: str, line_no: int) -> None:
        """Read the facts a candidate line holds."""
        if "closing signal" in text or "forcefully exiting" in text:
            t = _TORCHRUN_TERM.search(text, 0, MAX_MATCH_CHARS)
            if t and len(self.terminated) < MAX_RANKS:
                self.terminated.add((t.group(1) or t.group(3), t.group(2) or t.group(4)))
        if "ncclCommInitRank" in text or "nRanks" in text:
            m = NCCL_INIT.search(text, 0, MAX_MATCH_CHARS)
            who = line_rank(text)
            if m:
                rank, nranks = int(m.group(1)), int(m.group(2))
                self.see(rank)
                self.world = max(self.world or 0, nranks)
                if who.nccl is not None and len(self.nccl_rank) < MAX_RANKS:
                    self.nccl_rank[who.nccl[:2]] = rank
            if who.nccl is not None and len(self.nccl_hosts) < MAX_RANKS:
                self.nccl_hosts.add(who.nccl[0])
        if "SOCKET_IFNAME set" in text:
            m = _IFNAME_SET.search(text, 0, MAX_MATCH_CHARS)
            if m:
                self.ifname = f"{m.group(1)}={m.group(2)}"
        if "global_world_sizes" in text:
            m = WORLD_SIZES.search(text, 0, MAX_MATCH_CHARS)
            if m:
                self.world = int(m.group(1))
        if "(local_rank:" in text:
            m = SUMMARY_RANK.search(text, 0, MAX_MATCH_CHARS)
            if m and len(self.summary) < MAX_RANKS:
                self.summary.append(int(m.group(1)))
                self.summary_at = line_no
                self.see(int(m.group(1)))
        if "Timeout at NCCL work" in text:
            m = _TIMEOUT_AT.search(text, 0, MAX_MATCH_CHARS)
            r = PG_RANK.search(text, 0, MAX_MATCH_CHARS)
            tr: int | None = int(r.group(1)) if r else line_rank(text).rank
            if m and tr is not None and len(self.completed) < MAX_RANKS:
                self.completed[tr] = int(m.group(3))
        if "NCCL WARN" in text and len(self.said) < MAX_SAID:
            m = _NCCL_WARN.search(text, 0, MAX_MATCH_CHARS)
            if m:
                self.said[m.group("text").strip()] = None

    def heard(self, detail: str) -> None:
        """NCCL's ``Last error:`` detail text, kept like a WARN line."""
        if len(self.said) < MAX_SAID:
            self.said[detail.strip()[:300]] = None


class RuleHook:
    """What a rule's matches carry beyond the message; the default carries nothing."""

    def accept(self, facts: LogFacts, groups: dict[str, str], pat: Pattern, line_no: int
               ) -> tuple[bool, int | None]:
        """Whether a match counts, and a rank to give it when its line names none."""
        return True, None

    def record(self, facts: LogFacts, acc: Acc, groups: dict[str, str], text: str,
               rank: int | None) -> None:
        """Keep what the match says beyond the message."""

    def goes_last(self, acc: Acc, others: list[Acc]) -> bool:
        """Whether the finding is another finding's consequence (ordered after all)."""
        return False

    def describe(self, facts: LogFacts, acc: Acc, summary: RankSummary, message: str
                 ) -> tuple[str, dict[str, Detail]]:
        """The finished message and details."""
        return message, {}


class SignalHook(RuleHook):
    """Name the signal of a kill: a number (``exitcode: -9``), a name or a launcher's word
    (srun's ``Killed``). After one rank fails torchrun stops the others itself ("Sending process
    PID closing signal SIGTERM") and its failure summary lists them with exit code -15: those
    PIDs are a consequence, not a kill from outside. ProcessGroupNCCL takes a rank down with
    SIGABRT once its watchdog saw a timeout or an NCCL error: a finding whose every kill is such
    a SIGABRT of ranks another finding names goes last. So does an interrupt (SIGINT): a user
    who presses Ctrl-C on a job that hung or failed is reacting to what the other findings
    name. An abort beside a collective timeout or an NCCL error goes last whichever rank it
    was: the watchdog of every rank in a hung collective aborts, whether or not its own timeout
    line reached the log."""

    #: Signals a process sends itself after a failure another finding names.
    OWN_ABORT = frozenset({"SIGABRT"})
    #: Signals a person sends after seeing the job fail or hang.
    INTERRUPT = frozenset({"SIGINT"})

    def accept(self, facts: LogFacts, groups: dict[str, str], pat: Pattern, line_no: int
               ) -> tuple[bool, int | None]:
        name = groups.get("name")
        if name is None and "word" in groups:
            name = SIGNAL_WORDS.get(groups["word"], groups["word"])
        if name is None and "sig" in groups:
            name = SIGNAL_NAMES.get(int(groups["sig"]), f"signal {groups['sig']}")
        if name is not None:
            groups["name"] = name
            groups["hint"] = SIGNAL_HINTS.get(name, "see that rank's last lines")
        pid = groups.get("pid")
        if pid is not None:
            groups["who"] = f"process {pid}"
        if (pid, name) in facts.terminated:
            return False, None
        rank: int | None = None
        # torchrun's own stop signal names no rank, even just after a failure summary
        if facts.summary and not pat.last and line_no - facts.summary_at <= SUMMARY_SPAN:
            rank = facts.summary[-1]
            if pid is not None:
                groups["who"] = f"rank {rank} (pid {pid})"
        return True, rank

    def record(self, facts: LogFacts, acc: Acc, groups: dict[str, str], text: str,
               rank: int | None) -> None:
        if "name" in groups and len(acc.signals) < 8:
            acc.signals[groups["name"]] = None

    def goes_last(self, acc: Acc, others: list[Acc]) -> bool:
        if acc.signals and set(acc.signals) <= self.INTERRUPT:
            return bool(others)
        if not acc.signals or not set(acc.signals) <= self.OWN_ABORT:
            return False
        # a collective timeout, or an error that makes ProcessGroupNCCL abort, beside it: every
        # rank's watchdog (and torch's heartbeat monitor) aborts on a timeout, and torchrun
        # stops the other ranks as soon as one fails, so a timeout printed by another rank
        # means the hang came before this abort
        if any(o.rule.hook is Hook.WATCHDOG or o.rule.tier <= WRAPPER for o in others):
            return True
        named = {r for other in others for r in other.ranks}
        return bool(acc.ranks) and set(acc.ranks) <= named


class WatchdogHook(RuleHook):
    """Per rank the SeqNum and OpType the watchdog aborted; the ranks that did not time out
    (the collective waited for them), ranks that fell behind, progress."""

    def record(self, facts: LogFacts, acc: Acc, groups: dict[str, str], text: str,
               rank: int | None) -> None:
        if rank is None:
            return
        w = _WATCHDOG.search(text, 0, MAX_MATCH_CHARS)
        if w and len(facts.watchdog) < MAX_RANKS:
            facts.watchdog.setdefault(rank, (int(w.group(1)), w.group(2)))

    def describe(self, facts: LogFacts, acc: Acc, summary: RankSummary, message: str
                 ) -> tuple[str, dict[str, Detail]]:
        details: dict[str, Detail] = {}
        ranks = tuple(acc.ranks)
        if facts.watchdog:
            details["watchdog"] = {str(r): {"seq": s, "op": op}
                                   for r, (s, op) in sorted(facts.watchdog.items())}
            seqs = {s for s, _ in facts.watchdog.values()}
            if len(seqs) > 1:
                low = min(seqs)
                behind = sorted(r for r, (s, _) in facts.watchdog.items() if s == low)
                message += (f"; {plural('rank', behind)} timed out on an earlier SeqNum {low} "
                            f"than the others (they fell behind)")
        timed_out = set(ranks)
        if facts.completed:
            details["last_completed_seq"] = {str(r): v
                                             for r, v in sorted(facts.completed.items())}
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


class IfnameHook(RuleHook):
    """The socket interface the log shows set, beside "no interface found"."""

    def describe(self, facts: LogFacts, acc: Acc, summary: RankSummary, message: str
                 ) -> tuple[str, dict[str, Detail]]:
        if not facts.ifname:
            return message, {}
        return f"{message}; the log shows {facts.ifname}", {"socket_ifname": facts.ifname}


class NcclDetailHook(RuleHook):
    """What NCCL itself said (WARN lines, the ``Last error:`` detail) beside its generic code,
    for the case no rule knows the detail."""

    def describe(self, facts: LogFacts, acc: Acc, summary: RankSummary, message: str
                 ) -> tuple[str, dict[str, Detail]]:
        if not facts.said:
            return message, {}
        said = list(facts.said)
        return f"{message}; NCCL said: {said[0]}", {"nccl_said": said}


HOOKS: dict[Hook, RuleHook] = {
    Hook.NONE: RuleHook(),
    Hook.SIGNAL: SignalHook(),
    Hook.WATCHDOG: WatchdogHook(),
    Hook.SOCKET_IFNAME: IfnameHook(),
    Hook.NCCL_DETAIL: NcclDetailHook(),
}


def tier_of(acc: Acc, others: list[Acc]) -> int:
    """The rule's tier, except for a consequence: a reason only ``last`` patterns hit
    (torchrun itself stopped from outside) or one its hook calls a consequence goes after
    every other finding."""
    if acc.last or HOOKS[acc.rule.hook].goes_last(acc, others):
        return SYMPTOM + 1
    return acc.rule.tier
