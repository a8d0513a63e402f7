"""Which RDMA ports NCCL's IB transport takes for ``NCCL_IB_HCA`` (the list syntax of
:mod:`.iflist`, tokens ``device[:port]``; only ACTIVE ports count; unset: every port)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from preflight.jobenv.netvars.iflist import parse_if_list
from preflight.probes.ib import IbPort


@dataclass(frozen=True)
class IbSelection:
    """What NCCL_IB_HCA selects among the ports.

    Attributes:
        active: ACTIVE ports NCCL will use.
        inactive: ports the list matches that are not ACTIVE (NCCL skips them).
        ambiguous: (token, other devices) for a prefix token that is a device's full name and
            also matches other devices (``mlx5_1`` also takes ``mlx5_10``).
        unmatched: tokens that match no device at all.
    """

    active: tuple[IbPort, ...]
    inactive: tuple[IbPort, ...] = ()
    ambiguous: tuple[tuple[str, tuple[str, ...]], ...] = ()
    unmatched: tuple[str, ...] = ()


def select_ib(ports: Iterable[IbPort], value: str | None) -> IbSelection:
    """Which ports NCCL's IB transport takes for ``NCCL_IB_HCA=value`` (unset: every port)."""
    ports = tuple(ports)
    spec = parse_if_list(value or "")
    chosen = [p for p in ports if spec.matches(p.device, p.port)]
    devices = sorted({p.device for p in ports})
    ambiguous: list[tuple[str, tuple[str, ...]]] = []
    unmatched: list[str] = []
    for tok in spec.tokens:
        hits = [d for d in devices if (d == tok.name if spec.exact else d.startswith(tok.name))]
        if not hits:
            unmatched.append(tok.name)
        elif not spec.exact and tok.name in hits and len(hits) > 1:
            ambiguous.append((tok.name, tuple(d for d in hits if d != tok.name)))
    return IbSelection(tuple(p for p in chosen if p.active),
                       tuple(p for p in chosen if not p.active), tuple(ambiguous),
                       tuple(unmatched))
