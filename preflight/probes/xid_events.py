"""Xid errors as they happen: NVML's event API, in the daemon, on a thread of its own.

The daemon must never block on NVML (a GPU that fell off the bus can hang ``nvmlInit`` or a query
for minutes), so everything NVML happens on the watcher's thread: :meth:`XidWatcher.counts` only
copies a dict under a lock, :meth:`XidWatcher.stop` waits at most its timeout, and a watcher whose
NVML does not answer within ``open_timeout_s`` says so in :meth:`XidWatcher.status` while the
daemon serves on. The thread is a daemon thread: a hung driver call cannot keep the process alive.

At start the watcher catches up from the kernel log (the Xids since boot, as the ``xid`` check
reads them), then counts each ``nvmlEventTypeXidCriticalError`` event per GPU and code. An Xid
logged between the catch-up read and the event registration (milliseconds) can be missed; the
next ``xid`` check run still sees it in the log.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class XidNotice:
    """One Xid event: the GPU (NVML index as text) and the code."""

    gpu: str
    code: int


class XidEventSource(Protocol):
    """Where Xid events come from (NVML, or a fake in tests)."""

    def open(self) -> Mapping[str, str]:
        """Start listening (may block: NVML init). Returns ``{dddd:bb:dd: gpu label}`` so that
        kernel-log Xids, which name PCI addresses, count under the same GPU label."""

    def wait(self, timeout_s: float) -> list[XidNotice]:
        """The events that arrived within ``timeout_s``; [] when none."""

    def close(self) -> None: ...


class NvmlXidEvents:
    """NVML's event set with every GPU registered for ``nvmlEventTypeXidCriticalError``
    (NVML API reference, Event Handling Methods: nvmlEventSetWait_v2 returns the Xid in
    ``eventData``)."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._set: Any = None
        #: ``{dddd:bb:dd: index}`` of every GPU, once open.
        self.gpus: dict[str, str] = {}

    def open(self) -> Mapping[str, str]:
        import pynvml

        from preflight.probes.kernlog import gpu_key

        pynvml.nvmlInit()
        self._nvml = pynvml
        self._set = pynvml.nvmlEventSetCreate()
        bus: dict[str, str] = {}
        registered = 0
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            busid = pynvml.nvmlDeviceGetPciInfo(handle).busId
            bus[gpu_key(busid.decode() if isinstance(busid, bytes) else str(busid))] = str(i)
            try:
                supported = pynvml.nvmlDeviceGetSupportedEventTypes(handle)
                if supported & pynvml.nvmlEventTypeXidCriticalError:
                    pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError,
                                                    self._set)
                    registered += 1
            except pynvml.NVMLError as exc:
                log.info("GPU %d: no Xid events from NVML: %s", i, exc)
        self.gpus = bus
        if not registered:
            raise RuntimeError("no GPU supports NVML Xid events")
        return bus

    def wait(self, timeout_s: float) -> list[XidNotice]:
        pynvml = self._nvml
        try:
            data = pynvml.nvmlEventSetWait_v2(self._set, max(1, int(timeout_s * 1000)))
        except pynvml.NVMLError_Timeout:
            return []
        if not data.eventType & pynvml.nvmlEventTypeXidCriticalError:
            return []
        try:
            gpu = str(pynvml.nvmlDeviceGetIndex(data.device))
        except pynvml.NVMLError:
            gpu = "unknown"
        return [XidNotice(gpu, int(data.eventData))]

    def close(self) -> None:
        if self._nvml is None:
            return
        try:
            if self._set is not None:
                self._nvml.nvmlEventSetFree(self._set)
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as exc:
            log.debug("NVML shutdown: %s", exc)


class FakeXidEvents:
    """Events from a queue: tests put :class:`XidNotice` items (or an exception to raise from
    :meth:`open`) and watch the counts."""

    def __init__(self, bus: Mapping[str, str] | None = None, *,
                 open_error: Exception | None = None, open_delay_s: float = 0.0) -> None:
        self.events: queue.Queue[XidNotice] = queue.Queue()
        self.bus = dict(bus or {})
        self.open_error = open_error
        self.open_delay_s = open_delay_s
        self.closed = threading.Event()

    def open(self) -> Mapping[str, str]:
        time.sleep(self.open_delay_s)
        if self.open_error is not None:
            raise self.open_error
        return self.bus

    def wait(self, timeout_s: float) -> list[XidNotice]:
        try:
            return [self.events.get(timeout=timeout_s)]
        except queue.Empty:
            return []

    def close(self) -> None:
        self.closed.set()


CatchUp = Callable[[Mapping[str, str]], Iterable[XidNotice]]


def kernel_log_catch_up(root: Path, *, deadline_s: float = 5.0) -> CatchUp:
    """The Xids since boot from the kernel log under ``root``, labelled like NVML events."""

    def catch_up(bus: Mapping[str, str]) -> list[XidNotice]:
        from preflight.probes.kernlog import scan
        from preflight.probes.kmsg import read_kernel_log

        kl = read_kernel_log(root, deadline_s=deadline_s)
        return [XidNotice(bus.get(x.bus_id, x.bus_id), x.code) for x in scan(kl.text, kl.form)[0]]

    return catch_up


class XidWatcher:
    """Counts Xids per (gpu, code) on its own thread; every public method returns at once.

    Args:
        source: the event source (:class:`NvmlXidEvents`, or a fake).
        catch_up: reads the Xids logged before the watcher started (the kernel log).
        wait_s: longest single wait for an event (how fast :meth:`stop` is noticed).
        open_timeout_s: after this, a source whose ``open()`` has not returned is reported as
            not answering (the thread stays parked in the driver; nothing else waits on it).
    """

    def __init__(self, source: XidEventSource, *, catch_up: CatchUp | None = None,
                 wait_s: float = 1.0, open_timeout_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._source = source
        self._catch_up = catch_up
        self._wait_s = wait_s
        self._open_timeout_s = open_timeout_s
        self._clock = clock
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, int], int] = {}
        self._version = 0
        self._state = "not started"
        self._watching = False
        self._started_at: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._started_at = self._clock()
        self._set_state("opening NVML")
        self._thread = threading.Thread(target=self._run, name="xid-events", daemon=True)
        self._thread.start()

    def counts(self) -> dict[tuple[str, int], int]:
        with self._lock:
            return dict(self._counts)

    @property
    def version(self) -> int:
        """Grows whenever the counts or the watching state change (the daemon's render cache)."""
        with self._lock:
            return self._version

    @property
    def watching(self) -> bool:
        with self._lock:
            return self._watching

    def status(self) -> str:
        """What the watcher does now, in words (``watching``, or why not)."""
        with self._lock:
            state, started = self._state, self._started_at
        if state == "opening NVML" and started is not None \
                and self._clock() - started > self._open_timeout_s:
            return (f"NVML did not answer within {self._open_timeout_s:g} s (nvmlInit / device "
                    "registration); Xids show at each check run only")
        return state

    def stop(self, timeout_s: float = 1.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _set_state(self, state: str, *, watching: bool = False) -> None:
        with self._lock:
            self._state, self._watching = state, watching
            self._version += 1

    def _add(self, notices: Iterable[XidNotice]) -> None:
        with self._lock:
            for n in notices:
                self._counts[(n.gpu, n.code)] = self._counts.get((n.gpu, n.code), 0) + 1
                self._version += 1

    def _run(self) -> None:
        bus: Mapping[str, str] = {}
        opened = False
        try:
            bus = self._source.open()
            opened = True
        except Exception as exc:
            self._set_state(f"no NVML Xid events: {type(exc).__name__}: {exc}")
            log.warning("Xid events: %s; Xids show at each check run only", exc)
        if self._catch_up is not None:
            try:
                self._add(self._catch_up(bus))
            except Exception as exc:
                log.warning("Xid catch-up from the kernel log failed: %s", exc)
        if not opened:
            return
        self._set_state("watching", watching=True)
        try:
            while not self._stop.is_set():
                self._add(self._source.wait(self._wait_s))
        except Exception as exc:
            self._set_state(f"NVML event wait failed: {type(exc).__name__}: {exc}")
            log.warning("Xid events stopped: %s", exc)
        finally:
            try:
                self._source.close()
            except Exception as exc:
                log.debug("closing the Xid event source: %s", exc)


def node_watcher(root: str | Path) -> XidWatcher:
    """The daemon's watcher: NVML events, kernel-log catch-up under ``root``."""
    return XidWatcher(NvmlXidEvents(), catch_up=kernel_log_catch_up(Path(root)))


__all__ = ["FakeXidEvents", "NvmlXidEvents", "XidEventSource", "XidNotice", "XidWatcher",
           "kernel_log_catch_up", "node_watcher"]
