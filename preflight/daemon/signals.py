"""The daemon's main thread: SIGTERM/SIGINT stop it cleanly, SIGHUP reloads the config.

Handlers only record the signal; the work (reload, stop) runs in the main thread's loop, never in
the handler, so a signal cannot interrupt a reload half-way.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Protocol

log = logging.getLogger(__name__)


class Controlled(Protocol):
    """What the signal loop drives."""

    def start(self) -> None: ...

    def stop(self, timeout_s: float = ...) -> None: ...

    def reload(self) -> bool: ...


def serve_until_signalled(daemon: Controlled) -> None:
    """Start ``daemon``, reload it on SIGHUP, stop it on SIGTERM/SIGINT (main thread only)."""
    wake = threading.Event()
    pending: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        pending.append(signum)
        wake.set()

    previous = {s: signal.signal(s, on_signal)
                for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        daemon.start()
        while True:
            wake.wait(0.5)
            wake.clear()
            while pending:
                signum = pending.pop(0)
                if signum == signal.SIGHUP:
                    daemon.reload()
                else:
                    log.warning("%s: stopping", signal.Signals(signum).name)
                    return
    finally:
        daemon.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)
