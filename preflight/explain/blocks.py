"""Windows into a block of whole log lines: the candidate lines, the lines around one.

A block is bytes that end with a newline (reader.py). The classifier looks only at lines that
hold an anchor substring (``rules.ANCHORS``: :class:`AnchorScan`) and, around some of them, at a
few lines above or below (NCCL's ``Last error:`` detail, a traceback frame's source line). These
helpers find those lines; they keep no state.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from preflight.explain.ranks import MAX_MATCH_CHARS

#: google-re2 (the ``re2`` extra) where installed, else None: every anchor (matching.py: every
#: literal of a candidate line) in one pass.
RE2: Any
try:
    import re2 as _re2_module
    RE2 = _re2_module
except ImportError:  # pragma: no cover - exercised by forcing the fallback in tests
    RE2 = None

#: Bytes one :class:`AnchorScan` search covers before the anchors are looked for one by one:
#: the lines of a stretch with no anchor cost one pass, not one per anchor.
SCAN_CHUNK = 1 << 16


def decode(raw: bytes) -> str:
    """A line's head as text (invalid UTF-8 replaced), without its line break."""
    return raw[:MAX_MATCH_CHARS * 4].decode("utf-8", errors="replace").rstrip("\r\n")


def hit_starts(block: bytes, anchors: Iterable[bytes], lo: int = 0,
               hi: int | None = None) -> list[int]:
    """Start offsets of the lines holding an anchor, sorted, each once (one ``bytes.find``
    pass per anchor over ``block[lo:hi]``; ``lo`` is a line's start, ``hi`` one's end)."""
    end = len(block) if hi is None else hi
    starts: set[int] = set()
    for anchor in anchors:
        i = block.find(anchor, lo, end)
        while i >= 0:
            starts.add(block.rfind(b"\n", 0, i) + 1)
            e = block.find(b"\n", i, end)
            i = block.find(anchor, e + 1, end) if e >= 0 else -1
    return sorted(starts)


class AnchorScan:
    """The lines of a block that hold any of a set of anchors.

    ``bytes.find`` makes one pass over the block per anchor: with 37 anchors that was two thirds
    of ``preflight explain``'s time on a large log. With google-re2 installed, one search for
    all of them at once (RE2 runs a DFA, linear in the text whatever the number of words)
    skips every ``SCAN_CHUNK`` stretch that holds none; a stretch that holds one is scanned
    anchor by anchor from its first hit's line, as without it. The result is the same either
    way (a test holds the two equal).
    """

    def __init__(self, anchors: Iterable[bytes], *, one_pass: bool = True) -> None:
        self.anchors = tuple(anchors)
        self._any: Any = None
        if one_pass and RE2 is not None and self.anchors:
            options = RE2.Options()
            options.encoding = RE2.Options.Encoding.LATIN1  # bytes as they are, not UTF-8
            options.never_capture = True
            self._any = RE2.compile(b"|".join(re.escape(a) for a in self.anchors), options)

    @property
    def one_pass(self) -> bool:
        """Whether stretches without an anchor are skipped by one search (google-re2)."""
        return self._any is not None

    def starts(self, block: bytes) -> list[int]:
        """Start offsets of the lines holding an anchor, sorted, each once."""
        if self._any is None:
            return hit_starts(block, self.anchors)
        out: list[int] = []
        pos, n = 0, len(block)
        while pos < n:
            nl = block.find(b"\n", min(pos + SCAN_CHUNK, n) - 1)
            end = n if nl < 0 else nl + 1
            m = self._any.search(block, pos, end)
            if m is not None:
                first = block.rfind(b"\n", 0, m.start()) + 1
                out.extend(hit_starts(block, self.anchors, first, end))
            pos = end
        return out


def every_start(block: bytes) -> list[int]:
    """Start offsets of every line of ``block`` (a block ends with a newline)."""
    out = [0]
    i = block.find(b"\n")
    while 0 <= i < len(block) - 1:
        out.append(i + 1)
        i = block.find(b"\n", i + 1)
    return out


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
