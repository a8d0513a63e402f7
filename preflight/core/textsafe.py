"""Text from the environment, shown to a person on one line without taking over their terminal.

A job's environment can hold anything: ``CUDA_VISIBLE_DEVICES=$'0\\e[2J'`` would clear the screen
of whoever reads the table, and a newline in a value would forge a second line in the slurmd log
(``preflight prolog: PASS ...``). :func:`escape` writes every control character (C0, DEL, C1, and
the Unicode line and paragraph separators) as a visible escape.
"""

from __future__ import annotations

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\x1b": "\\e"}


def _is_control(ch: str) -> bool:
    code = ord(ch)
    return code < 0x20 or 0x7F <= code < 0xA0 or code in (0x2028, 0x2029)


def escape(text: str, limit: int | None = None) -> str:
    """``text`` with control characters escaped (``\\n``, ``\\e``, ``\\x07``...), cut to
    ``limit`` characters (ending in ``...``) when given."""
    if limit is not None and len(text) > 4 * limit:
        text = text[:4 * limit]  # escaping grows text at most 4x: never escape more than needed
    if any(_is_control(ch) for ch in text):
        text = "".join(_NAMED.get(ch, f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else
                                  f"\\u{ord(ch):04x}") if _is_control(ch) else ch
                       for ch in text)
    if limit is not None and len(text) > limit:
        text = text[:max(0, limit - 3)] + "..."
    return text


__all__ = ["escape"]
