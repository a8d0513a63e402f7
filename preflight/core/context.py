"""What a check is given: config, environment, host paths, probes. Built once per run."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from preflight.core.config import Config
from preflight.probes.gpu import DeadlineGpuProbe, FixtureFileGpuProbe, GpuProbe, GpuSnapshot
from preflight.probes.net import IbSnapshot, NetProbe, NetSnapshot

T = TypeVar("T")
#: Deadline of one name lookup (MASTER_ADDR), seconds.
RESOLVE_TIMEOUT_S = 2.0
#: The GPU snapshot gives up this long before a check's deadline, so the check can still say
#: that the driver did not answer (a verdict) instead of being cut off (undecided).
GPU_PROBE_MARGIN_S = 0.5

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


@dataclass
class Context:
    """Dependencies of the checks, passed in (tests build one with a fixture GPU probe).

    Attributes:
        config: validated configuration.
        env: the environment the job will see (a copy of ``os.environ`` by default).
        root: where the host's filesystem is mounted (``/``; ``/host`` in a container); every
            ``/proc``, ``/sys``, ``/dev/shm`` path goes through :meth:`host_path`.
        gpu_probe: source of GPU facts (NVML, or a fixture).
        net_probe: source of network facts (the live kernel, or a fixture).
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

    def env_int(self, name: str) -> int | None:
        """``int(env[name])`` as torch reads it; None when unset, empty or not an integer
        (``launcher_env`` reports that)."""
        from preflight.jobenv.launcher import read_int

        return read_int(self.env.get(name))

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
        return self.cached("gpus", self.probe_gpus)

    def _net(self) -> NetProbe:
        if self.net_probe is None:
            from preflight.probes.net import LiveNetProbe

            self.net_probe = LiveNetProbe()
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

    def resolve(self, host: str) -> tuple[tuple[int, str], ...]:
        """``host``'s addresses, once per run, within RESOLVE_TIMEOUT_S (a third of a check's
        deadline at most).

        Raises:
            socket.gaierror: it does not resolve; TimeoutError: the resolver hangs.
        """
        timeout = min(RESOLVE_TIMEOUT_S, self.config.check_timeout_s / 3)
        with activity(f"resolving MASTER_ADDR {host} (getaddrinfo)"):
            return self.cached(f"net.resolve:{host}",
                               lambda: self._net().resolve(host, timeout_s=timeout))

    def route_source(self, family: int, address: str) -> str:
        """The source address the kernel picks to reach ``address``; raises OSError: no route."""
        with activity(f"route lookup to {address} (UDP connect)"):
            return self._net().route_source(family, address)

    def probe_gpus(self) -> GpuSnapshot:
        """A new GPU snapshot (not this run's cached one: the epilog watches memory being
        released), within the probe deadline."""
        if self.gpu_probe is None:
            from preflight.probes.nvml import NvmlGpuProbe

            self.gpu_probe = NvmlGpuProbe(sys_root=self.host_path("/sys"))
        # A driver that does not answer must be a verdict, not a check deadline (probes/gpu.py).
        from preflight.probes.driverstate import warm_evidence

        longest = max(0.1, self.config.check_timeout_s - GPU_PROBE_MARGIN_S)
        with activity("NVML snapshot (nvmlInit and the queries of every GPU)"):
            return DeadlineGpuProbe(
                self.gpu_probe, timeout_s=min(self.config.gpu_probe_timeout_s, longest),
                longest_s=longest,
                driver_warm=lambda: warm_evidence(self.host_path("/proc"))).snapshot()


def default_gpu_probe(env: Mapping[str, str]) -> GpuProbe | None:
    """A fixture probe when ``PREFLIGHT_NVML_FIXTURE`` names a snapshot file, else None (NVML).

    The fixture replays a captured or made-up node (tests, demos, docs); NVML is used otherwise.
    """
    fixture = env.get("PREFLIGHT_NVML_FIXTURE")
    return FixtureFileGpuProbe(fixture) if fixture else None


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


def make_context(config: Config, *, env: Mapping[str, str] | None = None,
                 root: str | Path = "/") -> Context:
    env = dict(os.environ if env is None else env)
    return Context(config=config, env=env, root=Path(root), gpu_probe=default_gpu_probe(env))
