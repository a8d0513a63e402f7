"""Formatting of sizes and rates for messages (1024-based sizes as nccl-tests prints them)."""

from __future__ import annotations


def fmt_bytes(n: float) -> str:
    """``fmt_bytes(64 * 2**20) == '64 MiB'``; one decimal where it matters."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            text = f"{value:.1f}".rstrip("0").rstrip(".") if unit != "B" else f"{int(value)}"
            return f"{text} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
