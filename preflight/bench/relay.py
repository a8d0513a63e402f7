"""The nccl4py engine's NCCL unique id across nodes (``preflight cluster``).

On one node the parent writes what rank 0 publishes to the other ranks' stdin. Across nodes the
id goes through the cluster's store (:class:`~preflight.bench.options.StoreRelay`, the cluster
agent's client, so nothing here imports torch): the parent of the group's first node
(``rank_offset`` 0, whose local rank 0 is global rank 0) publishes it (:func:`publish_uid`); the
other nodes' parents fetch it within the init deadline (:class:`UidFetch`) and write it to every
local worker's stdin.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from preflight.bench.diagnosis import names
from preflight.bench.options import StoreRelay
from preflight.bench.records import Failure, WorkerState

#: The store key (under the group's prefix) of the NCCL unique id.
UID_KEY = "nccl-uid"
#: How long one fetch waits server-side before the parent checks for a stop.
FETCH_SLICE_S = 1.0


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


class UidFetch:
    """A thread that waits for the group's NCCL unique id in the cluster's store (every node but
    the group's first), in slices of :data:`FETCH_SLICE_S` so :meth:`stop` ends it promptly."""

    def __init__(self, relay: StoreRelay, timeout_s: float) -> None:
        self.relay, self.timeout_s = relay, timeout_s
        self.started = time.monotonic()
        self.value: str | None = None
        self.error: str | None = None
        self.timed_out = False
        self.relayed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._body, name="uid-fetch", daemon=True)
        self._thread.start()

    def _body(self) -> None:
        deadline = self.started + self.timeout_s
        try:
            while not self._stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    self.timed_out = True
                    return
                got = self.relay.get(UID_KEY, min(FETCH_SLICE_S, left))
                if got is not None:
                    self.value = got
                    return
        except Exception as exc:  # the store's own errors: reported as the rendezvous failing
            self.error = _short(exc)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=FETCH_SLICE_S + 5)


def publish_uid(relay: StoreRelay, uid: str, ranks: Sequence[WorkerState]) -> Failure | None:
    """The group's first node: rank 0's unique id into the store for the other nodes."""
    try:
        relay.set(UID_KEY, uid)
    except Exception as exc:  # the store's own errors
        return Failure("error", f"could not publish rank 0's NCCL unique id to {relay.where}: "
                       f"{_short(exc)}", (ranks[0].rank,))
    return None


def uid_missing(fetch: UidFetch | None, ranks: Sequence[WorkerState], init_s: float,
                now: float) -> Failure | None:
    """The unique id did not come through the store: a rendezvous timeout naming global rank 0
    (on another node) as what did not answer; this node's ranks are not blamed ("hung")."""
    if fetch is None or fetch.value is not None:
        return None
    if fetch.error is not None:
        return Failure("hung", f"{names(ranks)} could not get the NCCL unique id from "
                       f"{fetch.relay.where}: {fetch.error}", tuple(st.rank for st in ranks))
    late = any(st.phase == "init" and now - st.entered > init_s for st in ranks)
    if not (fetch.timed_out or late):
        return None
    return Failure("hung", f"no NCCL unique id from global rank 0 (on the group's first node) in "
                   f"{fetch.relay.where} within {now - fetch.started:.0f} s: that node's rank 0 "
                   f"did not reach init (look at that node's output); {names(ranks)} waited at "
                   f"the rendezvous", tuple(st.rank for st in ranks))
