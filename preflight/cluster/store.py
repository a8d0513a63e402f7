"""The rendezvous: torch.distributed's TCPStore on the master, JSON values, deadlines everywhere.

The only module of ``preflight cluster`` that imports torch (lazily, so ``preflight --help`` and
the daemon never do). Node 0 hosts the store on ``--master-port`` unless torchrun's own agent store
already listens there (``TORCHELASTIC_USE_AGENT_STORE=True``), then every node is a client. All
keys live under ``preflight-cluster/e<epoch>/``: node 0 takes a new epoch each time it starts, so
a run never reads keys an earlier run left in torchrun's store (it outlives restarts).

Every wait is bounded and every blocking call of the store runs on a thread the main thread waits
for with a deadline, so a master that accepts connections and never answers (a stopped agent, a
stale listener) cannot hold an agent past ``--timeout``, and SIGTERM / SIGINT are handled at
once. Resolving the master and connecting to it are retried until the deadline (a gang's pod 0
that is not in DNS yet, node 0 not yet listening). Operations and bytes are counted (the store
traffic of docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import os
import queue
import socket
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from preflight.cluster import wire
from preflight.cluster.options import ClusterOptions, ClusterUsageError

#: Values fetched per request when a log is read in bulk (TCPStore multi_get).
BATCH = 64

BASE = "preflight-cluster/"
#: Waiting is cut into slices of this length, so deadlines are checked while nothing arrives.
SLICE_S = 1.0
#: One connection attempt waits at most this long before the next one.
CONNECT_TRY_S = 10.0
#: How long node 0 keeps trying to bind a port another process holds (a stopping agent).
BIND_RETRY_S = 10.0
#: Pause between two attempts to resolve or reach the master.
RETRY_PAUSE_S = 0.5
#: How far past its own timeout a TCPStore client may still be retrying a refused connection.
OVERSHOOT_S = 5.0
#: How far past the deadline the last connection attempt is waited for.
LAST_TRY_GRACE_S = 0.5
#: Whether a store call was given up on its deadline: its thread is stuck in the C++ library,
#: and when it returns during the interpreter's shutdown it aborts the process (SIGABRT). The
#: command then ends with os._exit (see :func:`abandoned_threads`).
_ABANDONED = threading.Event()


def abandoned() -> None:
    _ABANDONED.set()


def abandoned_threads() -> bool:
    return _ABANDONED.is_set()

Resolver = Callable[[str], Any]


class MasterLost(RuntimeError):
    """The master could not be reached by the deadline, or stopped answering (exit code 3)."""


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


@dataclass
class Traffic:
    """Requests and bytes one agent sent to the store (shared by its scoped views)."""

    ops: int = 0
    bytes: int = 0


class Caller:
    """Runs blocking store calls on one long-lived thread and waits for each with a deadline (a
    thread per call costs more than the call at 1,000 nodes). A call that misses its deadline
    leaves that thread behind, stuck in the store, and the next call starts a new one."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._queue: queue.SimpleQueue[Any] | None = None

    def _start(self) -> queue.SimpleQueue[Any]:
        q: queue.SimpleQueue[Any] = queue.SimpleQueue()

        def serve() -> None:
            while True:
                item = q.get()
                if item is None:
                    return
                fn, box, done = item
                try:
                    box["value"] = fn()
                except BaseException as exc:  # handed to the caller
                    box["error"] = exc
                done.set()

        threading.Thread(target=serve, name=self.name, daemon=True).start()
        return q

    def call(self, fn: Callable[[], Any], timeout_s: float, what: str) -> Any:
        """``fn()`` within ``timeout_s``; TimeoutError names ``what`` when it does not return."""
        if self._queue is None:
            self._queue = self._start()
        box: dict[str, Any] = {}
        done = threading.Event()
        self._queue.put((fn, box, done))
        if not done.wait(timeout_s):
            self._queue.put(None)  # the thread ends if the call ever returns
            self._queue = None
            abandoned()
            raise TimeoutError(f"{what} did not answer within {timeout_s:g} s")
        if "error" in box:
            raise box["error"]
        return box["value"]

    def close(self) -> None:
        if self._queue is not None:
            self._queue.put(None)
            self._queue = None


def resolve_master(host: str, resolver: Resolver, until: float) -> None:
    """Resolve ``host`` until it works or the monotonic ``until`` passes.

    Raises:
        MasterLost: it did not resolve by then (the message has the resolver's last word).
    """
    last = ""
    while True:
        try:
            resolver(host)
            return
        except (OSError, TimeoutError) as exc:
            last = _one_line(exc)
        if time.monotonic() + RETRY_PAUSE_S >= until:
            raise MasterLost(f"the master address {host!r} did not resolve by the deadline "
                             f"({last}); pass --master-addr with a name every node resolves "
                             "(getent hosts NAME) or an IP")
        time.sleep(RETRY_PAUSE_S)


def connect(opts: ClusterOptions, *, hosting: bool, until: float) -> Any:
    """A raw TCPStore: the server on node 0 (``hosting``), else a client, by ``until``.

    Raises:
        ClusterUsageError: node 0 cannot bind the port (another process holds it).
        MasterLost: the master did not accept, or accepted and never answered, by ``until``.
    """
    import torch.distributed as dist

    tcp_store: Any = dist.TCPStore  # type: ignore[attr-defined]
    master = f"{opts.master_addr}:{opts.master_port}"
    started = time.monotonic()
    last = ""
    while True:
        left = until - time.monotonic()
        if left <= 0:
            break
        try_s = min(left, CONNECT_TRY_S)
        make = functools.partial(tcp_store, opts.master_addr, opts.master_port, None, hosting,
                                 timeout=datetime.timedelta(seconds=try_s),
                                 wait_for_workers=False)
        caller = Caller(f"connect-{master}")
        try:
            # TCPStore overshoots its own timeout by a few seconds while it retries a refused
            # connection: wait that long before giving the thread up, except on the last try,
            # which ends at the deadline.
            wait_s = try_s + OVERSHOOT_S if try_s < left else left + LAST_TRY_GRACE_S
            return caller.call(make, wait_s, f"the master {master}")
        except TimeoutError:
            # TCPStore's own timeout does not cover its handshake, and it retries a refused
            # connection past it: the thread is abandoned (Caller.call marked it). What the
            # port does, asked once more, says which it was.
            last = why_silent(opts.master_addr, opts.master_port)
        except Exception as exc:  # torch raises DistNetworkError / RuntimeError subclasses
            last = " ".join(str(exc).split())[:300]
            if not hosting and "timed out" in last:
                # TCPStore's retries end at a random moment, sometimes inside our own wait: the
                # same silence as above, and the port says which it was.
                last = why_silent(opts.master_addr, opts.master_port)
            left = until - time.monotonic()
            if hosting and (time.monotonic() - started >= BIND_RETRY_S
                            or left <= RETRY_PAUSE_S):
                raise ClusterUsageError(
                    f"node 0 cannot listen on port {opts.master_port} ({last}); another process "
                    f"holds it (ss -ltnp 'sport = :{opts.master_port}'): pass a free "
                    "--master-port to every node") from None
        finally:
            caller.close()
        time.sleep(min(RETRY_PAUSE_S, max(0.0, until - time.monotonic())))
    raise MasterLost(f"the master {master} did not answer within {opts.timeout_s:g} s ({last}); "
                     "is node 0's agent running, and the port open between the nodes?")


def why_silent(host: str, port: int, timeout_s: float = 2.0) -> str:
    """Why a TCPStore connect to ``host:port`` did not return: what one plain TCP connect to
    it meets (refused, no answer to the SYN, or accepted)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return "it accepted the connection but never answered the store's handshake"
    except ConnectionRefusedError:
        return "nothing listens on that port: connection refused"
    except TimeoutError:
        return (f"a connection attempt got no answer within {timeout_s:g} s (a firewall that "
                "drops packets, a host that is down)")
    except OSError as exc:
        return f"it cannot be reached ({_one_line(exc)})"


class Rendezvous:
    """A store client (or the server, on node 0) with JSON values and counted traffic."""

    def __init__(self, store: Any, *, hosting: bool, master: str, op_timeout_s: float,
                 traffic: Traffic | None = None, raw: Any = None, prefix: str = BASE,
                 caller: Caller | None = None) -> None:
        self._store = store
        self._caller = caller or Caller(f"store-{master}")
        #: the keys' prefix as text (unique per scope: the workers' own clients use it)
        self.prefix = prefix
        self._raw = raw if raw is not None else store
        self.hosting = hosting
        self.master = master
        #: A stopped master (SIGSTOP) accepts requests into its socket and never answers, and
        #: the store client would wait for ever: every request runs with this deadline.
        self.op_timeout_s = op_timeout_s
        self.traffic = traffic or Traffic()

    @classmethod
    def wrap(cls, raw: Any, *, hosting: bool, master: str, op_timeout_s: float) -> Rendezvous:
        """Our view of a raw TCPStore: keys under :data:`BASE`."""
        import torch.distributed as dist

        prefix: Any = dist.PrefixStore  # type: ignore[attr-defined]
        return cls(prefix(BASE, raw), hosting=hosting, master=master,
                   op_timeout_s=op_timeout_s, raw=raw)

    def scoped(self, name: str) -> Rendezvous:
        """The same store, keys under ``name/`` (an epoch), the traffic counted together."""
        import torch.distributed as dist

        prefix: Any = dist.PrefixStore  # type: ignore[attr-defined]
        return Rendezvous(prefix(f"{name}/", self._store), hosting=self.hosting,
                          master=self.master, op_timeout_s=self.op_timeout_s,
                          traffic=self.traffic, raw=self._raw, prefix=f"{self.prefix}{name}/",
                          caller=self._caller)

    @property
    def ops(self) -> int:
        return self.traffic.ops

    def set(self, key: str, value: Any) -> None:
        data = wire.encode(value)
        self._call(self._store.set, key, data)
        self.traffic.bytes += len(key) + len(data)

    def get(self, key: str, kind: str) -> Any:
        """The JSON value of ``key`` within the size limit of ``kind``.

        Raises:
            wire.Garbage: too large, or not JSON.
        """
        raw = self._call(self._store.get, key)
        self.traffic.bytes += len(key) + len(raw)
        return wire.decode(raw, kind)

    def add(self, key: str, amount: int) -> int:
        self.traffic.bytes += len(key) + 8
        return int(self._call(self._store.add, key, amount))

    def has(self, *keys: str) -> bool:
        """Whether every one of ``keys`` is set (one request)."""
        self.traffic.bytes += sum(map(len, keys))
        return bool(self._call(self._store.check, list(keys)))

    def wait_for(self, key: str, deadline: float) -> bool:
        """Wait until ``key`` exists or the monotonic ``deadline`` passes; False on the deadline.

        Raises:
            MasterLost: the connection to the master broke, or the master stopped answering.
        """
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            piece = min(SLICE_S, left)
            if self.wait_slice(key, piece):
                return True

    def wait_slice(self, key: str, seconds: float) -> bool:
        """One server-side wait of at most ``seconds``: True when ``key`` is set."""
        store = self._store
        self.traffic.ops += 1
        try:
            self._caller.call(functools.partial(store.wait, [key],
                                                datetime.timedelta(seconds=seconds)),
                              seconds + self.op_timeout_s, f"the master {self.master}")
            return True
        except TimeoutError as exc:
            raise MasterLost(f"{exc}: it stopped answering (SIGSTOP, overload)") from None
        except Exception as exc:
            if not _is_timeout(exc):
                raise MasterLost(f"lost the master {self.master}: {_one_line(exc)}") from None
            return False

    def get_many(self, keys: list[str], kind: str) -> list[Any]:
        """The values of ``keys`` (all set: a missing key would wait), in bulk where the store
        can (``multi_get``); each item a value or the :class:`wire.Garbage` it raised."""
        out: list[Any] = []
        bulk = getattr(self._store, "multi_get", None)
        for i in range(0, len(keys), BATCH):
            chunk = keys[i:i + BATCH]
            raws = (self._call(bulk, chunk) if bulk is not None and len(chunk) > 1
                    else [self._call(self._store.get, k) for k in chunk])
            for key, raw in zip(chunk, raws, strict=True):
                self.traffic.bytes += len(key) + len(raw)
                try:
                    out.append(wire.decode(raw, kind))
                except wire.Garbage as exc:
                    out.append(exc)
        return out

    def close(self) -> None:
        """Drop the store; on node 0 this stops the server and frees the port."""
        self._store = None
        self._raw = None
        self._caller.close()

    def _call(self, fn: Any, *args: Any) -> Any:
        self.traffic.ops += 1
        try:
            return self._caller.call(lambda: fn(*args), self.op_timeout_s,
                                     f"the master {self.master}")
        except TimeoutError as exc:
            raise MasterLost(f"{exc}: it stopped answering (SIGSTOP, overload)") from None
        except Exception as exc:
            raise MasterLost(f"the master {self.master} did not answer: {_one_line(exc)}") from None


def open_store(opts: ClusterOptions, resolver: Resolver, *, until: float) -> Rendezvous:
    """Resolve the master, then host (node 0) or join the store, all by ``until``.

    Raises:
        ClusterUsageError: node 0 cannot bind the port.
        MasterLost: the master did not resolve, accept or answer by ``until``.
    """
    resolve_master(opts.master_addr, resolver, until)
    host = opts.node_rank == 0 and not opts.use_agent_store
    raw = connect(opts, hosting=host, until=until)
    return Rendezvous.wrap(raw, hosting=host, master=f"{opts.master_addr}:{opts.master_port}",
                           op_timeout_s=max(5.0, min(opts.timeout_s, 30.0)))


class GroupRelay:
    """The bench parent's :class:`preflight.bench.options.StoreRelay` over this store, scoped to one
    all-reduce group's keys (``prefix``, e.g. ``s3/g0/``): carries the nccl4py engine's unique id
    from the group's first node to the others (docs/cluster.md)."""

    def __init__(self, store: Rendezvous, prefix: str) -> None:
        self._store = store
        self._prefix = prefix
        self.where = f"the cluster store at {store.master} (key {store.prefix}{prefix}...)"

    def set(self, key: str, value: str) -> None:
        self._store.set(self._prefix + key, value)

    def get(self, key: str, timeout_s: float) -> str | None:
        """The value once set, None when not set within ``timeout_s``; MasterLost when the master
        stops answering (or the value is not the text the first node writes)."""
        full = self._prefix + key
        if not self._store.wait_for(full, time.monotonic() + timeout_s):
            return None
        try:
            value = self._store.get(full, "uid")
        except wire.Garbage as exc:
            raise MasterLost(f"the NCCL unique id in the store is not valid: {exc}") from None
        if not isinstance(value, str):
            raise MasterLost("the NCCL unique id in the store is not text")
        return value


def _is_timeout(exc: BaseException) -> bool:
    return "timeout" in type(exc).__name__.lower() or "timeout" in str(exc).lower()[:200]


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"


def hostname() -> str:
    with contextlib.suppress(OSError):
        return socket.gethostname()
    return "unknown"
