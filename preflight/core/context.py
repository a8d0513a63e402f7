"""What a check is given: config, environment, host paths, probes. Built once per run.

The Context serves the probes' data but builds no probe itself: the caller hands it the probes
(:func:`preflight.probes.node.make_context` for this node, fixtures in tests), so core imports
nothing above it; the probes' types are named here for the type checker only.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from preflight.core.config import Config

if TYPE_CHECKING:
    from preflight.probes.gpu import GpuProbe, GpuSnapshot
    from preflight.probes.net import IbSnapshot, NetProbe, NetSnapshot

T = TypeVar("T")
#: Deadline of one name lookup (MASTER_ADDR), seconds.
RESOLVE_TIMEOUT_S = 2.0

_activity: dict[int, str] = {}
_activity_lock = threading.Lock()


@contextlib.contextmanager
def activity(what: str) -> Iterator[None]:
    """Say what the current check is waiting on, so a deadline can name it ("NVML query")."""
    ident = threading.get_ident()
    with _activity_lock:
        previous = _activity.get(ident)
        _activity[ident] = what
    try:
        yield
    finally:
        with _activity_lock:
            if previous is None:
                _activity.pop(ident, None)
            else:
                _activity[ident] = previous


def waiting_on(thread_ident: int) -> str | None:
    """What the check running on thread ``thread_ident`` said it waits on (:func:`activity`)."""
    with _activity_lock:
        return _activity.get(thread_ident)


class MissingProbe(RuntimeError):
    """A check asked for facts whose probe this Context was not given (a wiring bug)."""


@dataclass
class Context:
    """Dependencies of the checks, passed in (tests build one with a fixture GPU probe).

    Attributes:
        config: validated configuration.
        env: the environment the job will see (a copy of ``os.environ`` by default).
        root: where the host's filesystem is mounted (``/``; ``/host`` in a container); every
            ``/proc``, ``/sys``, ``/dev/shm`` path goes through :meth:`host_path`.
        gpu_probe: source of GPU facts (NVML, or a fixture); None: none given, and a check that
            asks for GPU facts raises :class:`MissingProbe` (an ERROR, never a verdict).
        net_probe: source of network facts (the live kernel, or a fixture); None as above.
    """

    config: Config
    env: Mapping[str, str]
    root: Path = Path("/")
    gpu_probe: GpuProbe | None = None
    net_probe: NetProbe | None = None
    _cache: dict[str, object] = field(default_factory=dict, repr=False)
    #: One lock per cache key, so two checks needing the same probe wait for one pass of it.
    _key_locks: dict[str, threading.Lock] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def host_path(self, path: str) -> Path:
        """``path`` (absolute, e.g. ``/dev/shm``) under the host root, symlinks resolved as the
        host would resolve them (see :func:`resolve_under`)."""
        return resolve_under(self.root, path)

    def cached(self, key: str, make: Callable[[], T]) -> T:
        """Compute ``make()`` once per run, shared by the checks that need it (thread-safe)."""
        with self._lock:
            lock = self._key_locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._cache:
                self._cache[key] = make()
            return self._cache[key]  # type: ignore[return-value]

    def gpus(self) -> GpuSnapshot:
        """The GPU snapshot of this run (one NVML pass shared by every check)."""
        return self.cached("gpus", self._probe_gpus)

    def _net(self) -> NetProbe:
        if self.net_probe is None:
            raise MissingProbe("this run was given no network probe")
        return self.net_probe

    def interfaces(self) -> NetSnapshot:
        """This run's network interfaces (one pass shared by ``network`` and ``master_port``)."""
        with activity("reading network interfaces (getifaddrs, ioctl)"):
            return self.cached("net.interfaces", lambda: self._net().interfaces())

    def ib(self) -> IbSnapshot:
        """This run's RDMA ports under ``<root>/sys/class/infiniband``."""
        path = self.host_path("/sys/class/infiniband")
        with activity(f"reading {path}"):
            return self.cached("net.ib", lambda: self._net().ib(path))

    def resolve_host(self, host: str) -> tuple[tuple[int, str], ...]:
        """``host``'s addresses, once per run, within RESOLVE_TIMEOUT_S (a third of a check's
        deadline at most).

        Raises:
            socket.gaierror: it does not resolve; TimeoutError: the resolver hangs.
        """
        timeout = min(RESOLVE_TIMEOUT_S, self.config.check_timeout_s / 3)
        with activity(f"resolving MASTER_ADDR {host} (getaddrinfo)"):
            return self.cached(f"net.resolve:{host}",
                               lambda: self._net().resolve_host(host, timeout_s=timeout))

    def route_source(self, family: int, address: str) -> str:
        """The source address the kernel picks to reach ``address``; raises OSError: no route."""
        with activity(f"route lookup to {address} (UDP connect)"):
            return self._net().route_source(family, address)

    def _probe_gpus(self) -> GpuSnapshot:
        if self.gpu_probe is None:
            raise MissingProbe("this run was given no GPU probe")
        return self.gpu_probe.snapshot()


#: Symlinks followed while resolving one path under --root (Linux's own limit, MAXSYMLINKS).
MAX_SYMLINKS = 40


def resolve_under(root: str | Path, path: str) -> Path:
    """``path`` inside the tree mounted at ``root``, symlinks followed as if ``root`` were ``/``.

    A host's ``/dev/shm`` is often a symlink to ``/run/shm``: joined naively under ``--root
    /host`` its absolute target points into the *container's* filesystem, which then gets
    measured (a false PASS). Here an absolute target restarts at ``root`` and ``..`` never climbs
    above it, like ``chroot``. A missing component ends the walk (the rest is appended as is); a
    loop or more than :data:`MAX_SYMLINKS` links leaves the path unresolved, so the check that
    opens it reports the error.
    """
    base = Path(root)
    if str(base) == "/":
        return Path("/" + path.lstrip("/"))
    todo = [p for p in path.split("/") if p and p != "."]
    todo.reverse()
    done: list[str] = []
    links = 0
    while todo:
        part = todo.pop()
        if part == "..":
            if done:
                done.pop()
            continue
        candidate = base.joinpath(*done, part)
        try:
            target = os.readlink(candidate)
        except OSError:  # not a link, or missing: keep it as is
            done.append(part)
            continue
        links += 1
        if links > MAX_SYMLINKS:
            return base.joinpath(*done, part, *reversed(todo))
        if target.startswith("/"):
            done = []
        todo.extend(reversed([p for p in target.split("/") if p and p != "."]))
    return base.joinpath(*done)
