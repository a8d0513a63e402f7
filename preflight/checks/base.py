"""What a check is to the runner: a name, a function from Context to Result, a summary line."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from preflight.core.context import Context
from preflight.core.result import Result


@dataclass(frozen=True)
class Check:
    """One check: its name (module name, metric label), its function, and its own deadline if it
    needs longer than ``Config.check_timeout_s`` (the bandwidth test)."""

    name: str
    run: Callable[[Context], Result]
    summary: str
    timeout_s: Callable[[Context], float] | None = None
