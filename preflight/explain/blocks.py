"""Windows into a block of whole log lines: the candidate lines, the lines around one.

A block is bytes that end with a newline (reader.py). The classifier looks only at lines that
hold an anchor substring (``rules.ANCHORS``, one ``bytes.find`` pass each) and, around some of
them, at a few lines above or below (NCCL's ``Last error:`` detail, a traceback frame's source
line). These helpers find those lines; they keep no state.
"""

from __future__ import annotations

from collections.abc import Iterable

from preflight.explain.ranks import MAX_MATCH_CHARS


def decode(raw: bytes) -> str:
    """A line's head as text (invalid UTF-8 replaced), without its line break."""
    return raw[:MAX_MATCH_CHARS * 4].decode("utf-8", errors="replace").rstrip("\r\n")


def hit_starts(block: bytes, anchors: Iterable[bytes]) -> list[int]:
    """Start offsets of the lines holding an anchor, sorted, each once."""
    starts: set[int] = set()
    for anchor in anchors:
        i = block.find(anchor)
        while i >= 0:
            starts.add(block.rfind(b"\n", 0, i) + 1)
            e = block.find(b"\n", i)
            i = block.find(anchor, e + 1) if e >= 0 else -1
    return sorted(starts)


def lines_from(block: bytes, pos: int, n: int) -> tuple[list[tuple[int, str]], int]:
    """Up to ``n`` lines from offset ``pos``: ``[(offset, text)]`` and how many the block
    lacked (they are in the next block)."""
    out: list[tuple[int, str]] = []
    while len(out) < n and pos < len(block):
        nxt = block.find(b"\n", pos)
        if nxt < 0:
            nxt = len(block)
        out.append((pos, decode(block[pos:nxt])))
        pos = nxt + 1
    return out, n - len(out)


def lines_above(block: bytes, start: int, n: int) -> tuple[list[tuple[int, str]], int]:
    """Up to ``n`` lines above the line at ``start``, nearest first, and how many the block
    lacked (they were in the previous block)."""
    out: list[tuple[int, str]] = []
    pos = start
    while len(out) < n and pos > 0:
        prev = block.rfind(b"\n", 0, pos - 1) + 1
        out.append((prev, decode(block[prev:pos - 1])))
        pos = prev
    return out, n - len(out)


def last_lines(block: bytes, n: int) -> list[tuple[int, str]]:
    """The block's last ``n`` lines, ``[(offset, text)]`` in file order."""
    out: list[tuple[int, str]] = []
    end = len(block) - 1
    while len(out) < n and end > 0:
        start = block.rfind(b"\n", 0, end) + 1
        out.insert(0, (start, decode(block[start:end])))
        end = start - 1
    return out
