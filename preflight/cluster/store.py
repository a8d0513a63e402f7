"""The rendezvous: torch.distributed's TCPStore on the master, JSON values, deadlines everywhere.

The only module of ``preflight cluster`` that imports torch (lazily, so ``preflight --help`` and
the daemon never do). Node 0 hosts the store on ``--master-port`` unless torchrun's own agent store
already listens there (``TORCHELASTIC_USE_AGENT_STORE=True``), then every node is a client. All
keys live under ``preflight-cluster/``, so they never meet a job's own keys in torchrun's store.

Every wait is bounded: the store's own timeout is the phase deadline, and waits are cut into
1 s slices so a deadline is checked even while the master is silent. Operations and bytes are
counted (``ops``, ``bytes``): the store traffic figure of docs/benchmarks.md.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import socket
import time
import warnings
from collections.abc import Iterable
from typing import Any

from preflight.cluster.options import ClusterOptions, ClusterUsageError
from preflight.probes.net import resolve_host, with_deadline

PREFIX = "preflight-cluster/"
#: Waiting is cut into slices of this length, so deadlines are checked while nothing arrives.
SLICE_S = 1.0
#: How often node 0 polls a phase's counter while gathering.
POLL_S = 0.05


class MasterLost(RuntimeError):
    """The master's store stopped answering or closed the connection (exit code 3)."""


def torch_missing() -> str | None:
    """None when torch.distributed imports, else the one-line reason."""
    # c10 reads TORCH_CPP_LOG_LEVEL once, when torch loads. The 1 s wait slices time out by
    # design, and a connection that times out logs a 30-line C++ stack trace at ERROR: each
    # failure is said here in one line instead (FATAL). Restored after the import, so the
    # workers this process starts keep the job's own level.
    previous = os.environ.get("TORCH_CPP_LOG_LEVEL")
    if previous is None:
        os.environ["TORCH_CPP_LOG_LEVEL"] = "FATAL"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Failed to initialize NumPy" on a numpy-less venv
            import torch.distributed as dist
    except ImportError as exc:
        return f"{exc}"
    finally:
        if previous is None:
            os.environ.pop("TORCH_CPP_LOG_LEVEL", None)
    if not dist.is_available():
        return "this torch build has no torch.distributed"
    return None


class Rendezvous:
    """A store client (or the server, on node 0) with JSON values and counted traffic."""

    def __init__(self, store: Any, *, hosting: bool, master: str, op_timeout_s: float) -> None:
        self._store = store
        self.hosting = hosting
        self.master = master
        #: A stopped master (SIGSTOP) accepts requests into its socket and never answers, and
        #: the store client would wait for ever: every request runs with this deadline.
        self.op_timeout_s = op_timeout_s
        self.ops = 0
        self.bytes = 0

    @classmethod
    def open(cls, opts: ClusterOptions) -> Rendezvous:
        """Resolve the master, then host (node 0) or join the store within ``opts.timeout_s``.

        Raises:
            ClusterUsageError: the master does not resolve, or node 0 cannot bind the port.
            MasterLost: a non-master node could not reach the master before the deadline.
        """
        import torch.distributed as dist

        master = f"{opts.master_addr}:{opts.master_port}"
        try:
            resolve_host(opts.master_addr, timeout_s=min(10.0, opts.timeout_s))
        except (OSError, TimeoutError) as exc:
            raise ClusterUsageError(
                f"the master address {opts.master_addr!r} does not resolve ({exc}); pass "
                "--master-addr with a name every node resolves (getent hosts NAME) or an IP"
            ) from None
        host = opts.node_rank == 0 and not opts.use_agent_store
        timeout = datetime.timedelta(seconds=opts.timeout_s)
        tcp_store: Any = dist.TCPStore  # type: ignore[attr-defined]
        prefix_store: Any = dist.PrefixStore  # type: ignore[attr-defined]
        try:
            if host:
                raw = tcp_store(opts.master_addr, opts.master_port, None, True, timeout=timeout,
                                wait_for_workers=False)
            else:
                raw = tcp_store(opts.master_addr, opts.master_port, None, False, timeout=timeout)
        except Exception as exc:  # torch raises DistNetworkError / RuntimeError subclasses
            text = " ".join(str(exc).split())[:300]
            if host:
                raise ClusterUsageError(
                    f"node 0 cannot listen on port {opts.master_port} ({text}); another process "
                    f"holds it (ss -ltnp 'sport = :{opts.master_port}'): pass a free "
                    "--master-port to every node") from None
            raise MasterLost(f"the master {master} did not accept a connection within "
                             f"{opts.timeout_s:g} s ({text}); is node 0's agent running and the "
                             "port open between the nodes?") from None
        return cls(prefix_store(PREFIX, raw), hosting=host, master=master,
                   op_timeout_s=opts.timeout_s)

    def set(self, key: str, value: Any) -> None:
        data = json.dumps(value, separators=(",", ":"))
        self._call(self._store.set, key, data)
        self.bytes += len(key) + len(data)

    def get(self, key: str) -> Any:
        raw = self._call(self._store.get, key)
        self.bytes += len(key) + len(raw)
        return json.loads(raw)

    def add(self, key: str, amount: int) -> int:
        self.bytes += len(key) + 8
        return int(self._call(self._store.add, key, amount))

    def has(self, key: str) -> bool:
        self.bytes += len(key)
        return bool(self._call(self._store.check, [key]))

    def wait_for(self, key: str, deadline: float) -> bool:
        """Wait until ``key`` exists or the monotonic ``deadline`` passes; False on the deadline.

        Raises:
            MasterLost: the connection to the master broke.
        """
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            piece = datetime.timedelta(seconds=min(SLICE_S, left))
            store = self._store
            try:
                self.ops += 1
                with_deadline(functools.partial(store.wait, [key], piece),
                              piece.total_seconds() + self.op_timeout_s,
                              f"the master {self.master}")
                return True
            except TimeoutError as exc:
                raise MasterLost(f"{exc}: it stopped answering (SIGSTOP, overload)") from None
            except Exception as exc:
                if not _is_timeout(exc):
                    raise MasterLost(f"lost the master {self.master}: {_one_line(exc)}") from None

    def gather(self, prefix: str, ranks: Iterable[int], deadline: float) -> dict[int, Any]:
        """Values of ``prefix/<rank>`` for the ranks that set them before ``deadline``; each
        setter also adds 1 to ``prefix/n``, so waiting costs one request per poll."""
        want = list(ranks)
        while self.add(f"{prefix}/n", 0) < len(want) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        return {r: self.get(f"{prefix}/{r}") for r in want if self.has(f"{prefix}/{r}")}

    def put(self, prefix: str, rank: int, value: Any) -> None:
        """Set ``prefix/<rank>`` and count it in ``prefix/n`` (see :meth:`gather`)."""
        self.set(f"{prefix}/{rank}", value)
        self.add(f"{prefix}/n", 1)

    def close(self) -> None:
        """Drop the store; on node 0 this stops the server and frees the port."""
        self._store = None

    def _call(self, fn: Any, *args: Any) -> Any:
        self.ops += 1
        try:
            return with_deadline(lambda: fn(*args), self.op_timeout_s, f"the master {self.master}")
        except TimeoutError as exc:
            raise MasterLost(f"{exc}: it stopped answering (SIGSTOP, overload)") from None
        except Exception as exc:
            raise MasterLost(f"the master {self.master} did not answer: {_one_line(exc)}") from None


class GroupRelay:
    """The bench parent's :class:`preflight.bench.options.StoreRelay` over this store, scoped to one
    all-reduce group's keys (``prefix``, e.g. ``s3/g0/``): carries the nccl4py engine's unique id
    from the group's first node to the others (docs/cluster.md)."""

    def __init__(self, store: Rendezvous, prefix: str) -> None:
        self._store = store
        self._prefix = prefix
        self.where = f"the cluster store at {store.master} (key {PREFIX}{prefix}...)"

    def set(self, key: str, value: str) -> None:
        self._store.set(self._prefix + key, value)

    def get(self, key: str, timeout_s: float) -> str | None:
        """The value once set, None when not set within ``timeout_s``; MasterLost when the master
        stops answering."""
        full = self._prefix + key
        if not self._store.wait_for(full, time.monotonic() + timeout_s):
            return None
        return str(self._store.get(full))


def _is_timeout(exc: BaseException) -> bool:
    return "timeout" in type(exc).__name__.lower() or "timeout" in str(exc).lower()[:200]


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"


def hostname() -> str:
    return socket.gethostname()
