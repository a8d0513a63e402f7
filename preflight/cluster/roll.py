"""Who is taking part, as node 0 sees it: the arrivals and answers logs, and the roll call.

Every agent that arrives (and every answer to a step) is one entry of a log in the store: the
value under a key of its own (``arrival/<rank>/<nonce>``, ``res/<k>/<rank>/<nonce>``), then a
pointer ``<rank>:<nonce>`` at the next sequence number (``arrive/<seq>``, from a counter).
Node 0 reads each entry once, in order: its traffic grows with the number of entries, not with
how often it looks, and a stray agent (another ``--nnodes``), a restart or a bad value is an
entry like any other instead of a counter that is off by one. The nonce is one agent process:
a node rank that comes back with a new nonce has restarted and replaces its earlier self.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from preflight.cluster import wire
from preflight.cluster.store import Rendezvous


def first_present(store: Rendezvous, keys: Iterable[str]) -> list[str]:
    """The keys of ``keys`` that are set: one request when all are; else each half is asked in
    turn, so m keys missing of n cost about 2m log2(n/m) requests, not n (at 1,000 nodes, a poll
    while hundreds of writers are between their count and their pointer)."""
    want = list(keys)
    if not want or store.has(*want):
        return want
    if len(want) == 1:
        return []
    half = len(want) // 2
    return first_present(store, want[:half]) + first_present(store, want[half:])


def write(store: Rendezvous, log: str, rank: int, nonce: str, value: Any, *,
          expect: int | None = None) -> None:
    """Add ``value`` to ``log`` as node ``rank``; ``expect``: entries that make the log complete
    (the writer that reaches it sets ``<log>/all``, which node 0 waits on)."""
    store.set(f"{log}/v/{rank}/{nonce}", value)
    seq = store.add(f"{log}/n", 1)
    store.set(f"{log}/{seq}", f"{rank}:{nonce}")
    if expect is not None and seq >= expect:
        store.set(f"{log}/all", 1)


@dataclass(frozen=True)
class Entry:
    """One log entry: who it says it is, and its value (or why it is not valid)."""

    seq: int
    rank: int | None
    nonce: str | None
    value: Any = None
    garbage: str | None = None


@dataclass
class LogReader:
    """Reads the entries of one log that are new since the last :meth:`poll`."""

    store: Rendezvous
    log: str
    kind: str
    next_seq: int = 1
    pending: list[int] = field(default_factory=list)

    def poll(self) -> list[Entry]:
        n = self.store.add(f"{self.log}/n", 0)
        seqs = [*self.pending, *range(self.next_seq, n + 1)]
        self.next_seq = max(self.next_seq, n + 1)
        if not seqs:
            return []
        keys = [f"{self.log}/{seq}" for seq in seqs]
        present = set(first_present(self.store, keys))
        # A writer between its count and its pointer: looked at again next time.
        self.pending = [seq for seq, key in zip(seqs, keys, strict=True) if key not in present]
        ready = [seq for seq, key in zip(seqs, keys, strict=True) if key in present]
        out: list[Entry] = []
        pointed: list[tuple[int, int, str]] = []
        for seq, pointer in zip(ready, self.store.get_many([f"{self.log}/{s}" for s in ready],
                                                           "ack"), strict=True):
            who = _pointer(pointer)
            if who is None:
                out.append(Entry(seq, None, None, garbage=f"log entry {seq} is not "
                                                          "<rank>:<nonce>"))
            else:
                pointed.append((seq, *who))
        values = self.store.get_many([f"{self.log}/v/{r}/{n}" for _, r, n in pointed], self.kind)
        for (seq, rank, nonce), value in zip(pointed, values, strict=True):
            if isinstance(value, wire.Garbage):
                out.append(Entry(seq, rank, nonce, garbage=str(value)))
            else:
                out.append(Entry(seq, rank, nonce, value))
        return sorted(out, key=lambda e: e.seq)


def _pointer(value: Any) -> tuple[int, str] | None:
    """``"<rank>:<nonce>"`` -> (rank, nonce); None when it is anything else."""
    if not isinstance(value, str):
        return None
    rank, _, nonce = value.partition(":")
    if not (rank.isdigit() and len(rank) <= 6 and 0 < len(nonce) <= 32
            and all(c in "0123456789abcdef" for c in nonce)):
        return None
    return int(rank), nonce


@dataclass
class Roll:
    """The arrivals node 0 accepted, and what it refused and why.

    Attributes:
        accepted: node rank -> its checked arrival (the latest agent of that rank).
        restarts: node rank -> how many times it came back (same host, new agent).
        garbage: ``{"node_rank", "what", "why"}`` for every value that was not valid.
        usage: disagreements that make the run a usage error (``ClusterUsage``, exit 2).
        acks: nonce -> the ack to write (``from_step``, or ``refused``).
    """

    nnodes: int
    timeout_s: float
    #: node 0's backend (every node must run the same)
    backend: str = ""
    accepted: dict[int, dict[str, Any]] = field(default_factory=dict)
    restarts: dict[int, int] = field(default_factory=dict)
    garbage: list[dict[str, Any]] = field(default_factory=list)
    usage: list[str] = field(default_factory=list)
    acks: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: node ranks whose agent changed since the run started (steps carry them)
    replaced: dict[int, str] = field(default_factory=dict)
    #: node ranks that arrived after the arrivals closed (named missing, told the verdict)
    late: list[int] = field(default_factory=list)

    def nonce_of(self, rank: int) -> str | None:
        a = self.accepted.get(rank)
        return str(a["nonce"]) if a else None

    def name(self, rank: int) -> str:
        host = (self.accepted.get(rank) or {}).get("host")
        return f"node {rank} ({host})" if host else f"node {rank}"

    def take(self, e: Entry, *, step: int, closed: bool) -> None:
        """One arrival entry; ``step``: the step a newcomer starts from; ``closed``: the
        arrivals are over (a node rank not yet here is missing)."""
        if e.garbage is not None or not isinstance(e.value, dict):
            self._garbage(e.rank, "arrival", e.garbage or "its arrival is not an object", e.nonce)
            return
        try:
            a = wire.arrival(e.value)
        except wire.Garbage as exc:
            self._garbage(e.rank, "arrival", str(exc), e.nonce)
            return
        r, nonce = a["node_rank"], a["nonce"]
        if r != e.rank or nonce != e.nonce:
            self._garbage(e.rank, "arrival", "its arrival names another node rank or agent",
                          e.nonce)
            return
        who = f"node {r} ({a['host']}, pid {a['pid']})"
        if a["nnodes"] != self.nnodes or r >= self.nnodes:
            self._disagree(nonce, f"{who} has --nnodes {a['nnodes']}")
            return
        if abs(a["timeout_s"] - self.timeout_s) > 1e-6:
            self._disagree(nonce, f"{who} has --timeout {a['timeout_s']:g}")
            return
        if self.backend and a["backend"] != self.backend:
            self._disagree(nonce, f"{who} has --backend {a['backend']}")
            return
        old = self.accepted.get(r)
        if old is not None and old["nonce"] != nonce:
            if old["host"] != a["host"]:
                self.usage.append(f"node rank {r} is claimed by two hosts: {old['host']} (pid "
                                  f"{old['pid']}) and {a['host']} (pid {a['pid']}); give every "
                                  "node its own --node-rank")
            self.restarts[r] = self.restarts.get(r, 0) + 1
            self.replaced[r] = nonce
            self.acks[old["nonce"]] = {"nonce": old["nonce"], "from_step": step,
                                       "refused": f"node rank {r} was taken over by a newer "
                                                  f"agent ({a['host']}, pid {a['pid']})"}
        elif old is None and closed:
            self.late.append(r)
        self.accepted[r] = a
        self.acks[nonce] = {"nonce": nonce, "from_step": step, "refused": None}

    def _disagree(self, nonce: str, text: str) -> None:
        self.usage.append(text)
        self.acks[nonce] = {"nonce": nonce, "from_step": 0,
                            "refused": f"{text}; node 0 has --nnodes {self.nnodes} --timeout "
                                       f"{self.timeout_s:g} --backend {self.backend or '?'}: "
                                       "start every agent with the same options"}

    def _garbage(self, rank: int | None, what: str, why: str, nonce: str | None) -> None:
        self.garbage.append({"node_rank": rank, "what": what, "why": why})
        if nonce is not None:
            self.acks[nonce] = {"nonce": nonce, "from_step": 0,
                                "refused": f"node 0 could not use this agent's {what}: {why}"}

    def flush_acks(self, store: Rendezvous, *, only: Callable[[str], bool] = lambda _n: True
                   ) -> None:
        """Write the acks not yet written."""
        for nonce in [n for n in self.acks if only(n)]:
            store.set(f"ok/{nonce}", self.acks.pop(nonce))
