"""Localisation: which nodes make the job slow or fail, in at most three rounds after the world
all-reduce, whatever N is. Pure: the agent and the scale simulation (benchmarks/cluster_sim.py)
drive this same code with measured or synthetic figures.

Rounds (each one all-reduce per group, every group at once):

1. ``intra`` (nodes with >= 2 GPUs alone; judged by the bench's own table): a node that fails or
   is slow on its own is named at once and kept out of the rounds across nodes.
2. ``pairs``: disjoint pairs (0,1), (2,3), ...; the odd node left over is untested.
3. ``confirm``: each suspect with a node known to be good, at once; suspects that have no good
   partner are paired with each other, never twice with the same node.

A group is *low* when its busbw is below its bar, *failed* when it reported no figure. The bar of
a group is the highest of: its absolute floor (``--min-busbw``, or the link fraction of its
slowest node's link over RDMA) and the relative bar, ``factor x reference``. The reference is
the median pair of the pairs round; with fewer than :data:`MIN_FOR_MEDIAN` pairs (under 8 nodes)
it is the best figure of every round (a bad node can only lower a figure) and the factor is
``relative_floor`` (0.8). With :data:`MIN_FOR_SPREAD` pairs or more (16 nodes) the factor rises
from ``relative_floor`` towards :data:`BAR_CAP` as the pairs agree more closely (``1 -
SPREAD_K x`` their robust relative spread): a node at 0.85x is found on a quiet fabric, a noisy
one is never judged tighter than ``relative_floor``.

Inference, after every round, over everything measured so far: every node of a passing group is
good; a low or failed group whose other nodes are all good convicts its remaining node (slow or
failed, with the group's figure or reason); the other nodes of low or failed groups, and the
untested ones, are suspects for the next round. A node that passed once is never convicted by a
later low group (noise, or a pair-specific path): such a group is reported, nobody is named.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

#: Rounds after the world all-reduce, the intra round included.
MAX_ROUNDS = 3
#: Default relative floor: a pair below this share of the reference is low (config
#: ``cluster_relative_floor``).
RELATIVE_FLOOR = 0.8
#: The relative bar never rises above this share of the reference, however quiet the fabric.
BAR_CAP = 0.9
#: How many robust standard deviations below the reference a healthy figure may fall.
SPREAD_K = 3.0
#: Below this many pairs the reference is the best figure of every round, not the median pair.
MIN_FOR_MEDIAN = 4
#: Below this many pairs the spread is not estimated (the factor stays ``relative_floor``).
MIN_FOR_SPREAD = 8

Group = tuple[int, ...]


@dataclass(frozen=True)
class Outcome:
    """One group's all-reduce as localisation sees it.

    Attributes:
        busbw_gbps: the figure; None when the group failed (init error, crash, deadline).
        why: the failure as the workers said it (NCCL's WARN lines, the error), when failed.
        floor_gbps: the group's absolute floor (``--min-busbw`` or the link fraction), or None.
    """

    busbw_gbps: float | None
    why: str = ""
    floor_gbps: float | None = None


@dataclass(frozen=True)
class Judged:
    """A group's outcome against its bar: ``state`` is ``ok``, ``low``, ``failed`` or
    ``unjudged`` (a figure with nothing to compare it with yet: no floor, one figure)."""

    tag: str
    group: Group
    outcome: Outcome
    bar_gbps: float | None
    state: str


def pairs(nodes: Sequence[int]) -> tuple[list[Group], list[int]]:
    """Disjoint pairs of consecutive nodes, and the odd one left over."""
    ordered = sorted(nodes)
    full = len(ordered) // 2 * 2
    return ([(ordered[i], ordered[i + 1]) for i in range(0, full, 2)], ordered[full:])


def spread(figures: Sequence[float], relative_floor: float = RELATIVE_FLOOR) -> float | None:
    """Robust relative spread of the healthy-looking figures (those at or above
    ``relative_floor`` x the median): 1.4826 x MAD / median, a standard deviation for normal
    noise; None while there are too few."""
    if len(figures) < MIN_FOR_SPREAD:
        return None
    mid = statistics.median(figures)
    if mid <= 0:
        return None
    kept = [f for f in figures if f >= relative_floor * mid]
    mid = statistics.median(kept)
    mad = statistics.median(abs(f - mid) for f in kept)
    return 1.4826 * mad / mid


def bar_factor(figures: Sequence[float], relative_floor: float) -> float:
    """``relative_floor``, raised towards :data:`BAR_CAP` when the figures agree closely."""
    s = spread(figures, relative_floor)
    if s is None:
        return relative_floor
    return max(relative_floor, min(BAR_CAP, 1.0 - SPREAD_K * s))


@dataclass
class Localiser:
    """The state of localisation over ``nodes`` (node ranks that may take part).

    Call :meth:`first_groups` for the pairs round, :meth:`observe` with each round's outcomes,
    :meth:`next_groups` for the next round (empty: done), then read :meth:`judge`.
    """

    nodes: Sequence[int]
    relative_floor: float = RELATIVE_FLOOR
    #: nodes convicted outside the rounds across nodes (the intra round), with why
    known_slow: dict[int, str] = field(default_factory=dict)
    known_failed: dict[int, str] = field(default_factory=dict)
    history: list[tuple[str, Group, Outcome]] = field(default_factory=list)
    rounds: int = 0

    @property
    def candidates(self) -> list[int]:
        """The nodes the rounds across nodes test."""
        return sorted(n for n in self.nodes
                      if n not in self.known_slow and n not in self.known_failed)

    def first_groups(self) -> list[Group]:
        return pairs(self.candidates)[0]

    def observe(self, tag: str, outcomes: Mapping[Group, Outcome]) -> None:
        self.rounds += 1
        self.history.extend((tag, tuple(g), o) for g, o in outcomes.items())

    def figures(self, tag: str | None = None) -> list[float]:
        return [o.busbw_gbps for t, g, o in self.history
                if o.busbw_gbps is not None and len(g) > 1 and tag in (None, t)]

    def bar(self) -> float | None:
        """The relative bar in GB/s: ``factor x reference`` over the pairs round (the confirm
        rounds pair suspects on purpose, half of their figures may be low), or over every
        figure while the pairs are too few for a median; None with fewer than two figures."""
        pairs_ = self.figures("pairs")
        if len(pairs_) >= MIN_FOR_MEDIAN:
            return float(statistics.median(pairs_)) * bar_factor(pairs_, self.relative_floor)
        figs = self.figures()
        return max(figs) * self.relative_floor if len(figs) >= 2 else None

    def judged(self) -> list[Judged]:
        relative = self.bar()
        out = []
        for tag, g, o in self.history:
            bars = [b for b in (relative, o.floor_gbps) if b is not None]
            bar = max(bars) if bars else None
            state = ("failed" if o.busbw_gbps is None else "unjudged" if bar is None else
                     "low" if o.busbw_gbps < bar else "ok")
            out.append(Judged(tag, g, o, bar, state))
        return out

    def judge(self) -> Conclusion:
        """What everything measured so far says (see the module docstring)."""
        judged = self.judged()
        good = {n for j in judged if j.state == "ok" for n in j.group}
        # A node that produced a figure somewhere works: a failure is not its own.
        worked = {n for j in judged if j.outcome.busbw_gbps is not None for n in j.group}
        # What each good node has shown it reaches: a figure within the noise of that is no
        # evidence against its partner (a bad node that passed once by luck convicts nobody).
        shown: dict[int, float] = {}
        for j in judged:
            if j.state == "ok" and j.outcome.busbw_gbps is not None:
                for n in j.group:
                    shown[n] = max(shown.get(n, 0.0), j.outcome.busbw_gbps)
        pairs_ = self.figures("pairs")
        factor = bar_factor(pairs_ if len(pairs_) >= MIN_FOR_MEDIAN else [], self.relative_floor)
        slow = dict(self.known_slow)
        failed = dict(self.known_failed)
        unexplained: list[Judged] = []
        suspects: set[int] = set()
        for j in judged:
            if j.state == "ok":
                continue
            if j.state == "unjudged":
                suspects.update(n for n in j.group if n not in good)
                continue
            cleared = worked if j.state == "failed" else good
            rest = [n for n in j.group if n not in cleared]
            if len(rest) != 1 or len(j.group) < 2:
                if rest:
                    suspects.update(rest)
                else:
                    unexplained.append(j)
                continue
            n = rest[0]
            partners = ", ".join(str(p) for p in j.group if p != n)
            fig = j.outcome.busbw_gbps
            if j.state == "failed":
                failed.setdefault(n, f"failed with node {partners} (which worked): "
                                     f"{j.outcome.why or 'no reason given'}")
            elif fig is not None and fig < factor * min(shown.get(p, 0.0) for p in j.group
                                                         if p != n):
                slow.setdefault(n, _slow_text(j, partners))
            else:
                unexplained.append(j)
        tested = {n for _, g, _ in self.history for n in g}
        suspects.update(n for n in self.candidates if n not in tested)
        suspects -= set(slow) | set(failed) | good
        return Conclusion(good=sorted(good), slow=slow, failed=failed,
                          suspects=sorted(suspects), unexplained=unexplained,
                          judged=judged)

    def next_groups(self) -> list[Group]:
        """The next round: each suspect with a distinct good node, the rest with each other
        (never a pair measured before); empty when nothing is left to find or no round is left."""
        if self.rounds >= MAX_ROUNDS:
            return []
        measured = {frozenset(g) for _, g, _ in self.history}
        if len(self.candidates) == 3:
            # No two pairs of three nodes are disjoint: only all three pairs tell which node
            # lowers the two it is in (the best pair is then the reference).
            a, b, c3 = self.candidates
            todo: list[Group] = [g for g in ((a, b), (a, c3), (b, c3))
                                 if frozenset(g) not in measured]
            return todo[:1]
        c = self.judge()
        if not c.suspects:
            return []
        busy: set[int] = set()
        groups: list[Group] = []
        good = [n for n in c.good if n not in c.slow and n not in c.failed]
        for s, g in zip(c.suspects, good, strict=False):
            groups.append((s, g))
            busy.update((s, g))
        left = [s for s in c.suspects if s not in busy]
        for i, a in enumerate(left):
            if a in busy:
                continue
            for b in left[i + 1:]:
                if b not in busy and frozenset((a, b)) not in measured:
                    groups.append((a, b))
                    busy.update((a, b))
                    break
        return groups


@dataclass(frozen=True)
class Conclusion:
    """What localisation found: node ranks good, slow (why), failed (why), still suspect."""

    good: list[int]
    slow: dict[int, str]
    failed: dict[int, str]
    suspects: list[int]
    unexplained: list[Judged]
    judged: list[Judged]

    def slow_by_floor_only(self) -> bool:
        """Whether most groups across nodes were low against their absolute floor alone (the
        network as a whole is slow, not one node)."""
        pairs_ = [j for j in self.judged if j.tag == "pairs" and j.outcome.busbw_gbps is not None]
        under = [j for j in pairs_ if j.outcome.floor_gbps is not None
                 and j.outcome.busbw_gbps is not None
                 and j.outcome.busbw_gbps < j.outcome.floor_gbps]
        return bool(pairs_) and 2 * len(under) > len(pairs_)


def _slow_text(j: Judged, partners: str) -> str:
    fig = j.outcome.busbw_gbps
    bar = j.bar_gbps
    return (f"busbw {fig:.4g} GB/s with node {partners} (which passed), below the bar "
            f"{bar:.4g} GB/s ({j.tag} round)" if fig is not None and bar is not None
            else f"slow with node {partners} ({j.tag} round)")

