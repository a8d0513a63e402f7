"""What a check is to the runner: a name, a function from Context to Result, a summary line,
and how it runs beside the others (its own deadline; a ``serial`` group)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from preflight.core.context import Context
from preflight.core.result import Result


@dataclass(frozen=True)
class Check:
    """One check.

    Attributes:
        name: its module name and metric label.
        run: Context -> Result; raises when it cannot decide (the runner makes that ERROR).
        summary: one line for ``preflight check --help``.
        timeout_s: its own deadline when it needs longer than ``Config.check_timeout_s``
            (the GPU tests), counted from when it starts.
        timeout_key: the configuration key that sets that deadline (named in the fix of a
            check that passed it).
        serial: checks that share a ``serial`` key run one after the other on one thread, in
            the order of the check list, never beside each other (the tests that load the GPUs:
            each would disturb the other's figures). Each keeps its own deadline, counted from
            its own start.
        prepare: called for every selected check of a serial group, in order, before the first
            of them runs: a check says there what it will need, so that checks sharing a piece
            of work can plan it together (one GPU worker runs the speed test and the
            all-reduce). Its time counts against the group's first check.
    """

    name: str
    run: Callable[[Context], Result]
    summary: str
    timeout_s: Callable[[Context], float] | None = None
    timeout_key: str = "check_timeout_s"
    serial: str | None = None
    prepare: Callable[[Context], None] | None = None
