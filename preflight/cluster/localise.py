"""Localisation: which node makes the job slow, in a fixed number of rounds whatever N is. Pure.

Round 1 ``intra``: every node with >= 2 GPUs runs its own all-reduce, all nodes at once (NVLink /
GPU trouble shows here, the network does not). Round 2 ``pairs``: disjoint node pairs (0,1),
(2,3), ... at once; a slow or failed pair makes both its nodes suspects, an odd last node is a
suspect untested. Round 3 ``suspects``: each suspect against a node of a passing pair, at once; a
suspect that is slow with a good partner is slow. Three rounds at 8 nodes or 1,000
(docs/cluster.md, the cost model).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

#: Without --min-busbw, a pair slower than this share of the median pair is slow.
RELATIVE_FLOOR = 0.5


def pairs(nodes: Sequence[int]) -> tuple[list[tuple[int, int]], list[int]]:
    """Disjoint pairs of consecutive nodes, and the odd one left over."""
    ordered = sorted(nodes)
    full = len(ordered) // 2 * 2
    return ([(ordered[i], ordered[i + 1]) for i in range(0, full, 2)], ordered[full:])


def floor_of(figures: Mapping[tuple[int, ...], float | None], min_busbw: float | None
             ) -> float | None:
    """The busbw a group must reach: --min-busbw, else RELATIVE_FLOOR x the median group."""
    if min_busbw is not None:
        return min_busbw
    measured = [v for v in figures.values() if v is not None]
    return RELATIVE_FLOOR * statistics.median(measured) if measured else None


def bad_groups(figures: Mapping[tuple[int, ...], float | None], floor: float | None
               ) -> list[tuple[int, ...]]:
    """Groups that failed (None) or fell below ``floor``."""
    return [g for g, v in figures.items() if v is None or (floor is not None and v < floor)]


def match(suspects: Sequence[int], good: Sequence[int]) -> tuple[list[tuple[int, int]], list[int]]:
    """Each suspect with a distinct good node (one round); suspects beyond the good nodes are
    returned unmatched (then most of the job is slow: the network, not one node)."""
    n = min(len(suspects), len(good))
    return [(s, g) for s, g in zip(suspects[:n], good[:n], strict=True)], list(suspects[n:])
