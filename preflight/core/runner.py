"""Runs the selected checks, each on its own thread with a deadline; never raises.

A check that raises becomes ERROR (``CheckCrashed``); one that passes its deadline becomes ERROR
(``CheckTimeout``) naming what it was waiting on. Threads are daemons, so a hung probe cannot keep a
one-shot process alive; the daemon runs checks in a child process it can kill.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from preflight import __version__
from preflight.checks.base import Check
from preflight.core.context import Context, waiting_on
from preflight.core.result import Report, Result, Scope, Status

log = logging.getLogger(__name__)


class SelectionError(ValueError):
    """--only / --skip named a check that does not exist."""


def select(checks: Sequence[Check], *, only: Sequence[str] = (),
           skip: Sequence[str] = ()) -> tuple[Check, ...]:
    names = {c.name for c in checks}
    unknown = sorted((set(only) | set(skip)) - names)
    if unknown:
        raise SelectionError(
            f"unknown check(s): {', '.join(unknown)}; known: {', '.join(c.name for c in checks)}")
    return tuple(c for c in checks if (not only or c.name in only) and c.name not in skip)


def run_checks(ctx: Context, checks: Sequence[Check], *, mode: str = "check") -> Report:
    """Run ``checks`` concurrently, each within its deadline; results in ``checks`` order."""
    slots: dict[str, Result] = {}
    idents: dict[str, int] = {}
    started = time.monotonic()

    def one(check: Check) -> None:
        idents[check.name] = threading.get_ident()
        t0 = time.monotonic()
        try:
            result = check.run(ctx)
        except TimeoutError as exc:
            # A probe's own deadline (a resolver, NVML): the node did not answer, no bug.
            result = Result(check.name, Status.ERROR, "ProbeTimeout",
                            f"{check.name} could not decide: {exc}",
                            "Something on this node did not answer in time (named above); "
                            "rerun, and look at it if it recurs.", scope=Scope.UNDECIDED)
        except Exception as exc:
            log.debug("check %s crashed:\n%s", check.name, traceback.format_exc())
            result = Result(check.name, Status.ERROR, "CheckCrashed",
                            f"{check.name} could not decide: {type(exc).__name__}: {exc}",
                            "This is a bug or an unexpected node state; rerun with "
                            "--log-level debug and report the traceback.", scope=Scope.UNDECIDED)
        # ERROR means "could not decide": never the node's nor the job's fault.
        scope = Scope.UNDECIDED if result.status is Status.ERROR else result.scope
        slots[check.name] = replace(result, check=check.name, duration_s=time.monotonic() - t0,
                                    scope=scope)

    threads = []
    for check in checks:
        t = threading.Thread(target=one, args=(check,), name=f"check-{check.name}", daemon=True)
        t.start()
        threads.append((check, t))

    results = []
    for check, t in threads:
        timeout = check.timeout_s(ctx) if check.timeout_s else ctx.config.check_timeout_s
        t.join(max(0.0, started + timeout - time.monotonic()))
        if check.name in slots:
            results.append(slots[check.name])
            continue
        waiting = waiting_on(idents.get(check.name, -1))
        on = f" (still waiting on: {waiting})" if waiting else ""
        results.append(Result(
            check.name, Status.ERROR, "CheckTimeout",
            f"{check.name} did not finish within its {timeout:g} s deadline{on}",
            "Something on this node does not answer; look at the named call (a hung GPU or "
            "driver shows in dmesg as Xid errors), or raise check_timeout_s.",
            details={"timeout_s": timeout, "waiting_on": waiting},
            duration_s=time.monotonic() - started, scope=Scope.UNDECIDED))
    return _lift(results, mode=mode)


#: Detail keys whose (large) value belongs to the Report rather than to one result.
_REPORT_FIELDS = ("fingerprint", "bandwidth")


def _lift(results: Sequence[Result], *, mode: str) -> Report:
    """Move ``details["fingerprint"]`` / ``details["bandwidth"]`` into the Report's own fields, so
    the JSON carries them once."""
    lifted: dict[str, Any] = {}
    out = []
    for result in results:
        found = {k: result.details[k] for k in _REPORT_FIELDS if k in result.details}
        lifted.update(found)
        out.append(replace(result, details={k: v for k, v in result.details.items()
                                            if k not in found}) if found else result)
    return Report(results=tuple(out), version=__version__, mode=mode,
                  fingerprint=lifted.get("fingerprint"), bandwidth=lifted.get("bandwidth"))
