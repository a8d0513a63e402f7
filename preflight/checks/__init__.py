"""The list of checks: one module each, one line here, nothing registers itself on import."""

from __future__ import annotations

from preflight.checks import shm
from preflight.runner import Check

CHECKS: tuple[Check, ...] = (
    Check(shm.NAME, shm.run, "/dev/shm exists, is writable, big enough for NCCL"),
)
