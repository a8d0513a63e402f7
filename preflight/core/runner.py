"""Runs the selected checks, each on a thread with a deadline; never raises.

Checks run concurrently, except those that share a ``serial`` key (:class:`Check`): they run one
after the other on one thread, in the order given, each with its own deadline counted from its
own start (the GPU tests: each would disturb the other's figures). A check that raises becomes
ERROR (``CheckCrashed``); one that passes its deadline becomes ERROR (``CheckTimeout``) naming
what it was waiting on, and the checks after it in its serial group are not started (ERROR
``CheckTimeout`` naming the check they waited for). Threads are daemons, so a hung probe cannot
keep a one-shot process alive; the daemon runs checks in a child process it can kill.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from preflight import __version__
from preflight.core.check import Check
from preflight.core.context import Context, waiting_on
from preflight.core.result import Report, Result, Scope, Status

log = logging.getLogger(__name__)

#: How long the collector waits for a serial check to start once the one before it returned
#: (its thread starts it at once; this only bounds a thread the scheduler has not woken yet).
START_WAIT_S = 5.0
REMEDY_TIMEOUT = ("Something on this node does not answer; look at the named call (a hung GPU "
                  "or driver shows in dmesg as Xid errors), or raise {key}.")


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


@dataclass
class _Group:
    """Checks run on one thread, in order (one check, or a serial group)."""

    checks: list[Check]
    given_up: threading.Event = field(default_factory=threading.Event)
    started_at: dict[str, float] = field(default_factory=dict)
    started: dict[str, threading.Event] = field(default_factory=dict)
    done: dict[str, threading.Event] = field(default_factory=dict)
    ident: int = -1


def _groups(checks: Sequence[Check]) -> list[_Group]:
    groups: list[_Group] = []
    serial: dict[str, _Group] = {}
    for check in checks:
        if check.serial is not None and check.serial in serial:
            serial[check.serial].checks.append(check)
            continue
        group = _Group([check])
        groups.append(group)
        if check.serial is not None:
            serial[check.serial] = group
    for group in groups:
        for check in group.checks:
            group.started[check.name] = threading.Event()
            group.done[check.name] = threading.Event()
    return groups


def _crashed(check: Check, exc: Exception) -> Result:
    log.debug("check %s crashed:\n%s", check.name, traceback.format_exc())
    return Result(check.name, Status.ERROR, "CheckCrashed",
                  f"{check.name} could not decide: {type(exc).__name__}: {exc}",
                  "This is a bug or an unexpected node state; rerun with --log-level debug and "
                  "report the traceback.", scope=Scope.UNDECIDED)


def run_checks(ctx: Context, checks: Sequence[Check], *, mode: str = "check") -> Report:
    """Run ``checks`` (concurrently, serial groups in order), each within its deadline; results
    in ``checks`` order."""
    slots: dict[str, Result] = {}
    groups = _groups(checks)
    group_of = {c.name: g for g in groups for c in g.checks}

    def one(check: Check, failed: Exception | None) -> None:
        t0 = time.monotonic()
        try:
            if failed is not None:
                raise failed
            result = check.run(ctx)
        except TimeoutError as exc:
            # A probe's own deadline (a resolver, NVML): the node did not answer, no bug.
            result = Result(check.name, Status.ERROR, "ProbeTimeout",
                            f"{check.name} could not decide: {exc}",
                            "Something on this node did not answer in time (named above); "
                            "rerun, and look at it if it recurs.", scope=Scope.UNDECIDED)
        except Exception as exc:
            result = _crashed(check, exc)
        # ERROR means "could not decide": never the node's nor the job's fault.
        scope = Scope.UNDECIDED if result.status is Status.ERROR else result.scope
        slots[check.name] = replace(result, check=check.name, duration_s=time.monotonic() - t0,
                                    scope=scope)

    def body(group: _Group) -> None:
        group.ident = threading.get_ident()
        failed: dict[str, Exception] = {}
        for check in group.checks:
            if check.prepare is not None:
                try:
                    check.prepare(ctx)
                except Exception as exc:  # reported as that check's own crash
                    failed[check.name] = exc
        for i, check in enumerate(group.checks):
            if group.given_up.is_set():
                return  # the collector reported this check as not started: start nothing
            if i:  # the first one's clock started with the thread (its prepares count)
                group.started_at[check.name] = time.monotonic()
            group.started[check.name].set()
            one(check, failed.get(check.name))
            group.done[check.name].set()

    for group in groups:
        group.started_at[group.checks[0].name] = time.monotonic()
        threading.Thread(target=body, args=(group,), daemon=True,
                         name=f"check-{'+'.join(c.name for c in group.checks)}").start()
    results = [_collect(ctx, check, group_of[check.name], slots) for check in checks]
    return _lift(results, mode=mode)


def _collect(ctx: Context, check: Check, group: _Group, slots: dict[str, Result]) -> Result:
    """``check``'s result once it is in, or the ERROR that replaces it at its deadline."""
    timeout = check.timeout_s(ctx) if check.timeout_s else ctx.config.check_timeout_s
    first = group.checks[0] is check
    if not first and not group.started[check.name].wait(START_WAIT_S) and \
            group.given_up.is_set():
        before = group.checks[group.checks.index(check) - 1]
        waiting = waiting_on(group.ident)
        on = f" (still waiting on: {waiting})" if waiting else ""
        return Result(check.name, Status.ERROR, "CheckTimeout",
                      f"{check.name} did not run: {before.name}, before it in the "
                      f"'{check.serial}' checks that run one after the other, did not finish "
                      f"within its deadline{on}", REMEDY_TIMEOUT.format(key=before.timeout_key),
                      details={"timeout_s": timeout, "waiting_on": waiting,
                               "waited_for": before.name}, scope=Scope.UNDECIDED)
    started = group.started_at.get(check.name, time.monotonic())
    group.done[check.name].wait(max(0.0, started + timeout - time.monotonic()))
    if check.name in slots:
        return slots[check.name]
    group.given_up.set()
    waiting = waiting_on(group.ident)
    on = f" (still waiting on: {waiting})" if waiting else ""
    return Result(check.name, Status.ERROR, "CheckTimeout",
                  f"{check.name} did not finish within its {timeout:g} s deadline{on}",
                  REMEDY_TIMEOUT.format(key=check.timeout_key),
                  details={"timeout_s": timeout, "waiting_on": waiting},
                  duration_s=time.monotonic() - started, scope=Scope.UNDECIDED)


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
