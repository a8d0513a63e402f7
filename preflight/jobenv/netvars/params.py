"""NCCL's integer and on/off parameters (``NCCL_IB_DISABLE``, ``NCCL_P2P_DISABLE``, ...) read as
NCCL reads them (src/misc/param.cc: ``strtoll(value, &end, 0)``)."""

from __future__ import annotations

import re

_NCCL_INT = re.compile(r"[ \t\n\v\f\r]*([+-]?)(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)")


def nccl_int(value: str | None) -> int | None:
    """An integer NCCL parameter as NCCL reads it (``strtoll(value, &end, 0)`` with the whole value
    consumed: decimal, 0x hex, 0 octal, leading blanks); None when unset or invalid, and then NCCL
    keeps its default."""
    m = _NCCL_INT.fullmatch(value) if value is not None else None
    if m is None:
        return None
    sign, body = (-1 if m.group(1) == "-" else 1), m.group(2)
    if body[:2] in ("0x", "0X"):
        return sign * int(body[2:], 16)
    return sign * int(body, 8 if body.startswith("0") else 10)


def nccl_flag(value: str | None, *, default: bool = False) -> bool:
    """An on/off NCCL parameter (NCCL_IB_DISABLE, NCCL_P2P_DISABLE, ...): on when it reads as a
    non-zero integer; ``default`` when unset or not an integer ("yes" and "true" are not: NCCL
    ignores them and keeps its default)."""
    number = nccl_int(value)
    return default if number is None else number != 0
