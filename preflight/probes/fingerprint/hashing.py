"""sha256 of a file or of a directory tree, deterministic and bounded (``hashes``)."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Any

from preflight.core.units import fmt_bytes

#: Trees with more entries (files + directories), or more bytes, than this are not hashed (the
#: entry says so): hashing is for code and data manifests, not datasets, and must stay within a
#: check's deadline.
HASH_MAX_FILES = 20_000
HASH_MAX_BYTES = 512 * (1 << 20)
#: Directory names skipped when hashing a tree: their content differs between identical checkouts
#: (.pyc files embed source mtimes; .git holds index timestamps and packs).
HASH_SKIP_DIRS = frozenset({"__pycache__", ".git"})
_CHUNK = 1 << 20


class _TooLarge(Exception):
    pass


def _hash_file(path: str, into: Any, budget: list[int]) -> None:
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            budget[0] -= len(chunk)
            if budget[0] < 0:
                raise _TooLarge(f"more than {fmt_bytes(budget[1])}")
            into.update(chunk)


def hash_path(path: str | Path, *, max_files: int = HASH_MAX_FILES,
              max_bytes: int = HASH_MAX_BYTES) -> str:
    """sha256 of a file's bytes, or of a directory tree, deterministically.

    A tree's hash covers, for each entry in sorted relative-path order (``/`` separators): the
    path, its kind and its content (a symlink's target text, not what it points to, so links
    cannot loop or escape). ``__pycache__`` and ``.git`` are skipped. Modes, owners and times are
    not hashed: they differ between identical copies.

    Returns:
        64 hex digits, or a text in angle brackets saying why there is no hash: ``<missing>``,
        ``<unreadable: ...>``, ``<too large: ...>`` (trees beyond
        ``max_files`` / ``max_bytes`` are refused rather than hashed in part, because a partial
        hash would claim a sameness it never checked).
    """
    p = os.fspath(path)
    budget = [max_bytes, max_bytes]  # [left, limit]
    try:
        st = os.lstat(p)
        if stat.S_ISREG(st.st_mode):
            h = hashlib.sha256()
            _hash_file(p, h, budget)
            return h.hexdigest()
        if stat.S_ISLNK(st.st_mode):
            # A configured path that is a link: hash what it names, as a user would expect.
            return hash_path(os.path.realpath(p), max_files=max_files, max_bytes=max_bytes)
        if not stat.S_ISDIR(st.st_mode):
            return "<not a file or directory>"
        tree = hashlib.sha256()
        for rel, kind, full in _walk(p, max_entries=max_files):
            tree.update(f"{kind}\0{rel}\0".encode("utf-8", "surrogateescape"))
            if kind == "f":
                h = hashlib.sha256()
                _hash_file(full, h, budget)
                tree.update(h.digest())
            elif kind == "l":
                tree.update(os.readlink(full).encode("utf-8", "surrogateescape"))
            tree.update(b"\n")
        return tree.hexdigest()
    except FileNotFoundError:
        return "<missing>"
    except _TooLarge as exc:
        return f"<too large: {exc}; hash a manifest file instead>"
    except RecursionError:
        return "<too large: directories nested too deeply>"
    except OSError as exc:
        return f"<unreadable: {exc.strerror or exc}>"


def _walk(root: str, *, max_entries: int) -> list[tuple[str, str, str]]:
    """(relative path, kind f/d/l/o, full path) of every entry under ``root``, sorted by path;
    stops with _TooLarge past ``max_entries`` (directories count too) so a huge tree is not
    listed in full before being refused."""
    out: list[tuple[str, str, str]] = []

    def visit(directory: str, prefix: str) -> None:
        with os.scandir(directory) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            rel = f"{prefix}{e.name}"
            if e.is_symlink():
                out.append((rel, "l", e.path))
            elif e.is_dir(follow_symlinks=False):
                if e.name in HASH_SKIP_DIRS:
                    continue
                out.append((rel, "d", e.path))
                visit(e.path, rel + "/")
            elif e.is_file(follow_symlinks=False):
                out.append((rel, "f", e.path))
            else:
                out.append((rel, "o", e.path))
            if len(out) > max_entries:
                raise _TooLarge(f"more than {max_entries} files and directories")

    visit(root, "")
    return out
