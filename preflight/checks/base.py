"""What a check is: :class:`preflight.core.check.Check`, the runner's type (kept here for the
checks that import it from this module)."""

from __future__ import annotations

from preflight.core.check import Check

__all__ = ["Check"]
