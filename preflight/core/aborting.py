"""What a one-shot command must undo when it is stopped half-way (SIGTERM, SIGHUP, Ctrl-C).

The checks run in daemon threads (:mod:`preflight.core.runner`). When the process ends on a signal
those threads' ``finally`` clauses never run, so the worker processes they started (each in a
session of its own, out of reach of a signal to preflight's process group) and their scratch
directories would outlive it: a SIGTERM from Kubernetes or Slurm must not leave a GPU worker, a
directory in /tmp or a segment in /dev/shm behind. Code that starts such things registers how to
undo them for as long as they exist (:func:`register` / :func:`unregister`), and starts them
inside :func:`starting`: a child exists before ``Popen`` returns, so a signal that comes meanwhile
waits until the undo can see it. The CLI runs every command inside :func:`undo_on_signals`,
which on the signal calls :func:`abort` and then ends the process as the signal would have
(killed by it, as a prolog's caller expects); it calls :func:`abort` itself on Ctrl-C and
:func:`undo_abandoned` when a command returns. After :func:`abort` nothing new may be registered:
a thread about to start a worker gets :class:`Aborted` instead.

SIGKILL cannot be caught: the workers then die with their parent (Linux PR_SET_PDEATHSIG, set by
each worker), only the scratch directories stay.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

#: Re-entrant: a signal handler runs in the main thread, possibly while it holds the lock.
_lock = threading.RLock()
_pending: dict[int, Callable[[], None]] = {}
_keys = itertools.count()
_aborted = threading.Event()


class _Starts:
    """How many :func:`starting` blocks are open, and the signal that came meanwhile (guarded by
    ``_lock``)."""

    open = 0
    deferred: int | None = None


_starts = _Starts()


class Aborted(OSError):
    """The command is being stopped by a signal: nothing new is started."""


def aborted() -> bool:
    return _aborted.is_set()


def register(undo: Callable[[], None]) -> int:
    """Register ``undo`` (kill these processes, remove this directory) until :func:`unregister`
    with the key returned.

    Raises:
        Aborted: :func:`abort` already ran; start nothing.
    """
    with _lock:
        if _aborted.is_set():
            raise Aborted("preflight is being stopped by a signal: nothing new is started")
        key = next(_keys)
        _pending[key] = undo
        return key


def unregister(key: int) -> None:
    with _lock:
        _pending.pop(key, None)


def abort() -> None:
    """Refuse registrations from now on, then run every registered undo, newest first, once. An
    undo that fails does not stop the others."""
    with _lock:
        _aborted.set()
    undo_abandoned()


def undo_abandoned() -> None:
    """Run what is still registered when a command returns: the work of a check thread the
    runner gave up on (past its deadline), which would otherwise outlive the process. Unlike
    :func:`abort`, later registrations stay allowed (tests call the CLI many times in one
    process)."""
    with _lock:
        undos = list(_pending.values())
        _pending.clear()
    for undo in reversed(undos):
        with contextlib.suppress(Exception):
            undo()


@contextlib.contextmanager
def starting() -> Iterator[None]:
    """Around starting a process and recording it where its undo finds it.

    A child is visible (and can be signalled) before ``Popen`` returns; a signal handled in
    between would run an undo that misses it, and the process would die with a child in a session
    of its own left running. A signal that comes while a block is open only refuses new
    registrations; the process dies of it when the last open block closes.

    Raises:
        Aborted: :func:`abort` already ran; start nothing.
    """
    with _lock:
        if _aborted.is_set():
            raise Aborted("preflight is being stopped by a signal: nothing new is started")
        _starts.open += 1
    try:
        yield
    finally:
        with _lock:
            _starts.open -= 1
            signum = _starts.deferred if _starts.open == 0 else None
        if signum is not None:
            _die_of(signum)


def _die_of(signum: int) -> None:
    if threading.current_thread() is not threading.main_thread():
        # Only the main thread may reset a handler: the signal again, which it now handles
        # with no block open.
        os.kill(os.getpid(), signum)
        return
    abort()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


@contextlib.contextmanager
def undo_on_signals(signums: Sequence[int] = (signal.SIGTERM, signal.SIGHUP)) -> Iterator[None]:
    """While the block runs (main thread only; elsewhere it does nothing): on one of ``signums``,
    :func:`abort`, then die of that signal with its default action."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_signal(signum: int, _frame: Any) -> None:
        with _lock:
            if _starts.open:  # a process is being started: die once it is on record
                _starts.deferred = signum
                _aborted.set()
                return
        _die_of(signum)

    previous = {s: signal.signal(s, on_signal) for s in signums}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
