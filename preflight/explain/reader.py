"""Streaming reader: a log of any size as bounded byte blocks that end at a line break.

``preflight explain`` must read a 1 GB log at >= 50 MB/s in bounded memory, so the
classifier works on blocks of whole lines (4 MiB by default) instead of one Python call per line.
A "line" longer than ``max_line_bytes`` (a binary file, a progress bar without newlines) is cut
there, so memory stays bounded by ``block_bytes + max_line_bytes`` whatever the input.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

BLOCK_BYTES = 4 << 20
MAX_LINE_BYTES = 1 << 20


def iter_blocks(stream: BinaryIO, *, block_bytes: int = BLOCK_BYTES,
                max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[bytes]:
    """Yield blocks of ``stream`` that each end with ``b"\\n"`` (the last one is given one).

    Args:
        stream: a binary file object (a file, ``sys.stdin.buffer``).
        block_bytes: bytes read at a time.
        max_line_bytes: a line longer than this is cut (a newline is inserted) so that the
            carried remainder never grows without bound.
    """
    carry = b""
    while True:
        data = stream.read(block_bytes)
        if not data:
            break
        buf = carry + data if carry else data
        cut = buf.rfind(b"\n")
        if cut < 0:
            if len(buf) > max_line_bytes:
                yield buf + b"\n"
                carry = b""
            else:
                carry = buf
            continue
        carry = buf[cut + 1:]
        if len(carry) > max_line_bytes:
            yield buf + b"\n"
            carry = b""
        else:
            yield buf[:cut + 1]
    if carry:
        yield carry + b"\n"
