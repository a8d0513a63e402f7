"""A log as UTF-8 bytes whatever it was saved as: gzip, zstd, UTF-16/UTF-32 with a byte-order mark.

People hand over what they have: ``kubectl logs ... | gzip``, a ``.zst`` from a log shipper,
PowerShell's ``> job.log`` (UTF-16 LE with a BOM). Content decides, not the file name: gzip
(every member, as ``zcat`` reads them) and zstd (every frame, as ``zstdcat``) by their magic
bytes, then a BOM picks the text encoding. Without a BOM the bytes are read as UTF-8 (invalid
bytes are replaced later, line by line). zstd needs the ``zstandard`` package (or Python's own
``compression.zstd``); without either a zstd file is not read and :class:`Unreadable` says why
in one line. A stream that breaks part way (a truncated gzip) raises :class:`Unreadable` too.
"""

from __future__ import annotations

import codecs
import gzip
import io
from typing import Any, BinaryIO

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
#: Longest first: the UTF-32 LE mark starts with the UTF-16 LE one.
BOMS: tuple[tuple[bytes, str], ...] = (
    (b"\x00\x00\xfe\xff", "utf-32-be"), (b"\xff\xfe\x00\x00", "utf-32-le"),
    (b"\xfe\xff", "utf-16-be"), (b"\xff\xfe", "utf-16-le"), (b"\xef\xbb\xbf", "utf-8"),
)
CHUNK = 1 << 20


class Unreadable(Exception):
    """A log that cannot be read (further): the message is one line saying why."""


class Prefixed(io.RawIOBase):
    """``head`` then the rest of ``stream``: content that was read ahead, given back."""

    def __init__(self, head: bytes, stream: BinaryIO) -> None:
        self._head = head
        self._stream = stream

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        view = memoryview(b)
        n = 0
        if self._head:
            n = min(len(view), len(self._head))
            view[:n] = self._head[:n]
            self._head = self._head[n:]
            if n == len(view):
                return n
        data = self._stream.read(len(view) - n)
        view[n:n + len(data)] = data
        return n + len(data)


class _Guarded(io.RawIOBase):
    """A decompressing stream whose errors become :class:`Unreadable` naming the format."""

    def __init__(self, stream: Any, kind: str) -> None:
        self._stream = stream
        self._kind = kind

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        try:
            data = self._stream.read(len(b))
        except Exception as exc:  # EOFError, OSError, zlib.error, the zstd libraries' own
            raise Unreadable(f"{self._kind} data is truncated or corrupt "
                             f"({type(exc).__name__}: {exc})") from None
        view = memoryview(b)
        view[:len(data)] = data
        return len(data)


class _Transcoded(io.RawIOBase):
    """Text in ``encoding`` (its BOM already read) as UTF-8 bytes, decoded incrementally."""

    def __init__(self, stream: BinaryIO, encoding: str) -> None:
        self._stream = stream
        self._decoder = codecs.getincrementaldecoder(encoding)(errors="replace")
        self._out = b""
        self._eof = False

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._out and not self._eof:
            raw = self._stream.read(CHUNK)
            self._eof = not raw
            self._out = self._decoder.decode(raw, final=self._eof).encode("utf-8", "replace")
        n = min(len(b), len(self._out))
        memoryview(b)[:n] = self._out[:n]
        self._out = self._out[n:]
        return n


def _zstd_reader(stream: BinaryIO) -> Any:
    try:
        from compression import zstd  # type: ignore[import-not-found]  # Python >= 3.14
        return zstd.ZstdFile(stream)
    except ImportError:
        pass
    try:
        import zstandard  # type: ignore[import-not-found]
    except ImportError:
        raise Unreadable("zstd-compressed, and no zstd decoder is installed (pip install "
                         "zstandard, or decompress it with zstdcat)") from None
    return zstandard.ZstdDecompressor().stream_reader(stream, read_across_frames=True)


def _read_head(stream: BinaryIO, n: int) -> bytes:
    head = b""
    while len(head) < n:
        data = stream.read(n - len(head))
        if not data:
            break
        head += data
    return head


def open_log(stream: BinaryIO) -> tuple[BinaryIO, str]:
    """``stream`` as UTF-8 bytes, and what it was (``"gzip, utf-16-le"``; ``""`` for plain).

    A plain log is ``stream`` itself (looked at with ``peek``, nothing copied); what comes back
    always has ``peek``.

    Raises:
        Unreadable: zstd without a decoder.
    """
    kinds: list[str] = []
    src: BinaryIO = stream
    if not hasattr(src, "peek"):
        src = io.BufferedReader(Prefixed(b"", src), CHUNK)  # type: ignore[arg-type]
    head = src.peek(4)[:4]  # type: ignore[attr-defined]
    if len(head) < 4:  # a pipe that has less at hand: read on, and give it back
        head = _read_head(src, 4)
        src = io.BufferedReader(Prefixed(head, src), CHUNK)  # type: ignore[arg-type]
    if head.startswith(GZIP_MAGIC):
        kinds.append("gzip")
        gz = gzip.GzipFile(fileobj=src, mode="rb")
        src = io.BufferedReader(_Guarded(gz, "gzip"), CHUNK)  # type: ignore[arg-type]
    elif head.startswith(ZSTD_MAGIC):
        kinds.append("zstd")
        src = io.BufferedReader(_Guarded(_zstd_reader(src), "zstd"),  # type: ignore[arg-type]
                                CHUNK)
    if kinds:
        head = _read_head(src, 4)
        src = io.BufferedReader(Prefixed(head, src), CHUNK)  # type: ignore[arg-type]
    for bom, encoding in BOMS:
        if head.startswith(bom):
            src.read(len(bom))
            if encoding != "utf-8":
                kinds.append(encoding)
                src = io.BufferedReader(_Transcoded(src, encoding), CHUNK)  # type: ignore[arg-type]
            break
    return src, ", ".join(kinds)
