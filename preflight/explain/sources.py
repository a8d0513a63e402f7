"""What ``preflight explain`` reads: logs and flight recorder dumps, files and directories.

Each input is opened as text (decode.py: gzip, zstd, a UTF-16/32 BOM) and told apart by its
first bytes: a flight recorder dump (pickle or JSON, flightrec.py) is read whole and matched
across ranks; anything else is a log, streamed through the classifier. An input that cannot be
read, or a dump that is refused, is named in the answer with one line saying why (``unread``);
the others still count. A directory stands for the regular files under it (sorted, at most
``MAX_FILES``; symbolic links are not followed).
"""

from __future__ import annotations

import io
import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO

from preflight.explain.classifier import Classifier, Kept, reread
from preflight.explain.decode import Prefixed, Unreadable, open_log
from preflight.explain.flightrec import (
    MAX_DUMP_BYTES,
    DumpRefused,
    RankDump,
    analyse,
    load_dump,
    sniff,
)
from preflight.explain.model import Explanation
from preflight.explain.reader import iter_blocks

#: Files taken from one directory (a run's log folder, a dump folder).
MAX_FILES = 10_000


def expand(path: str) -> tuple[list[str], str | None]:
    """The files a path stands for, and a note when a directory held more than ``MAX_FILES``."""
    if path == "-" or not os.path.isdir(path):
        return [path], None
    found: list[str] = []
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            full = os.path.join(root, name)
            try:
                mode = os.lstat(full).st_mode
            except OSError:
                continue
            if stat.S_ISREG(mode):
                found.append(full)
                if len(found) > MAX_FILES:
                    return found[:MAX_FILES], (f"{path}: more than {MAX_FILES:,} files; the "
                                               f"first {MAX_FILES:,} (by name) were read")
    return found, None


def explain_streams(streams: Iterable[tuple[str, BinaryIO]], *,
                    notes: Iterable[str] = ()) -> Explanation:
    """Classify ``(name, binary stream)`` pairs, streaming, in bounded memory."""
    c = Classifier()
    kept = Kept()
    dumps: list[RankDump] = []
    unread: list[tuple[str, str]] = []
    for name, stream in streams:
        try:
            text, _ = open_log(stream)
            head = text.peek(64)[:64]  # type: ignore[attr-defined]
            kind = sniff(head)
            if kind:
                data = text.read(MAX_DUMP_BYTES + 1)
                try:
                    dumps.append(load_dump(data, name))
                except DumpRefused:
                    if kind == "pickle":
                        raise
                    # a log of JSON lines that happens to start like a dump: read it as a log
                    text = io.BufferedReader(Prefixed(data, text))  # type: ignore[arg-type]
                else:
                    c.count_source(name)
                    c.facts.see(dumps[-1].rank)
                    continue
            c.begin(name)
            kept.begin(name)
            for block in iter_blocks(text):
                c.feed(block)
                kept.add(block)
        except (Unreadable, DumpRefused) as exc:
            unread.append((name, str(exc)))
    fr_findings, fr_notes = analyse(dumps)
    c.add_external(fr_findings)
    expl = c.finish() if dumps else reread(c.finish(), kept)
    return replace(expl, notes=(*notes, *expl.notes, *fr_notes), unread=tuple(unread))


def open_paths(paths: Iterable[str], stdin: BinaryIO) -> Iterator[tuple[str, BinaryIO]]:
    """Open the files one at a time, so that any number of them uses one descriptor."""
    for name in paths:
        if name == "-":
            yield "-", stdin
        else:
            with Path(name).open("rb") as stream:
                yield name, stream
