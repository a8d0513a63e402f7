"""A metrics file for node_exporter's textfile collector, never harming what is at the path.

The one writer every ``--prom-file`` goes through (``check``, the Slurm hooks). Rules:

* A **regular file or nothing** at the path: the text goes to a temporary file in the same
  directory (same filesystem, so the rename is atomic: node_exporter may read at any moment), is
  flushed to disk, made world-readable (node_exporter often runs as another user) and renamed over
  the path (:func:`preflight.core.atomicio.replace_file`).
* A **symlink**: followed to what it names (as far as it resolves); that file is then replaced by
  the same rule, in *its* directory. The link itself stays a link.
* Anything else (a **device** such as ``/dev/null``, a **FIFO**, a socket, a directory), also at
  the end of a symlink: refused with :class:`TextfileError` naming what it is. Nothing is opened,
  so a FIFO without a reader cannot block, and as root ``--prom-file /dev/null`` leaves
  ``/dev/null`` a device.

A write that fails (a full disk, a read-only mount, a missing directory) must not leave an old
verdict behind for node_exporter to keep serving: the stale file is removed, which frees its blocks,
and a short file with ``preflight_textfile_write_error 1`` and the verdict series (healthy,
undecided, last run) is written in its place where that fits. Every full write carries
``preflight_textfile_write_error 0`` (labelled ``hook`` in a Slurm hook's file, so that the
prolog's and the epilog's share a directory). The caller gets :class:`TextfileError` and says
so on stderr; the verdict (stdout, JSON, exit code) never depends on the file.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path

from preflight.core.atomicio import replace_file
from preflight.core.boundedio import file_kind

#: The gauge every textfile carries: 0 after a full write, 1 in the short file left by a failed one.
ERROR_METRIC = "preflight_textfile_write_error"
#: Families kept in the short file a failed write leaves (what alerts on the verdict need).
ESSENTIAL_FAMILIES = ("preflight_node_healthy", "preflight_node_undecided",
                      "preflight_last_run_timestamp_seconds")


class TextfileError(OSError):
    """The metrics file was not written (refused path, full disk, ...); the message says which,
    and what was left at the path."""


def destination(path: str | os.PathLike[str]) -> Path:
    """The file a write to ``path`` replaces: ``path`` itself, or what its symlinks name.

    Raises:
        TextfileError: the path (or what a link at it names) exists and is not a regular file,
            or its links do not end (a loop).
    """
    given = Path(path)
    target = given
    try:
        if given.is_symlink():
            target = Path(os.path.realpath(given))
        st = os.lstat(target)
    except FileNotFoundError:
        return target
    except OSError as exc:
        raise TextfileError(f"{given}: cannot inspect: {exc.strerror or exc}") from None
    if stat.S_ISLNK(st.st_mode):  # realpath stopped at a loop
        raise TextfileError(f"{given}: its symlinks do not resolve (a loop); expected a regular "
                            "file or a path that does not exist yet")
    if not stat.S_ISREG(st.st_mode):
        via = f" (through the symlink {given})" if target != given else ""
        raise TextfileError(f"{target}{via} is {file_kind(st.st_mode)}; refusing to write metrics "
                            "there: --prom-file takes a regular file or a path that does not "
                            "exist yet (it is replaced by rename)")
    return target


def essential_lines(text: bytes, families: Sequence[str] = ESSENTIAL_FAMILIES) -> bytes:
    """The ``# HELP``, ``# TYPE`` and sample lines of ``families`` in an exposition text."""
    names = set(families)
    kept = []
    for line in text.splitlines(keepends=True):
        if line.startswith(b"#"):  # "# HELP name ..." / "# TYPE name ..."
            words = line.split(None, 3)
            name = words[2] if len(words) > 2 else b""
        else:  # "name value" / "name{labels} value"
            name = re.split(rb"[{\s]", line, maxsplit=1)[0]
        if name.decode(errors="replace") in names:
            kept.append(line)
    return b"".join(kept)


def _error_family(value: int, labels: Mapping[str, str]) -> bytes:
    # One HELP text for every file: node_exporter refuses a family whose HELP differs between
    # two files of its directory.
    sample = ",".join(f'{k}="{_label_value(v)}"' for k, v in sorted(labels.items()))
    series = f"{ERROR_METRIC}{{{sample}}}" if sample else ERROR_METRIC
    return (f"# HELP {ERROR_METRIC} 1 when preflight could not write this file in full (disk "
            "full, read-only): only the verdict series are here; 0 after a full write.\n"
            f"# TYPE {ERROR_METRIC} gauge\n{series} {value}\n").encode()


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def write_metrics_file(path: str | os.PathLike[str], text: bytes, *,
                       essential: Sequence[str] = ESSENTIAL_FAMILIES,
                       labels: Mapping[str, str] | None = None) -> None:
    """Write the exposition ``text`` (plus ``preflight_textfile_write_error 0``) to ``path`` by the
    rules of this module.

    Args:
        essential: the families kept in the short file a failed write leaves.
        labels: labels of the error gauge, for files that share a textfile directory (the Slurm
            hooks' ``hook="prolog"``): without them two files would carry the same series.

    Raises:
        TextfileError: refused or failed; the message names the path, the cause, and what is at
            the path now (unchanged; removed; the short error file).
    """
    labels = labels or {}
    target = destination(path)
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise TextfileError(f"{target}: cannot create a file in {directory}: no such directory")
    try:
        replace_file(target, text + _error_family(0, labels), mode=0o644)
        return
    except OSError as exc:
        cause = exc.strerror or str(exc)
    left = _after_failure(target, essential_lines(text, essential) + _error_family(1, labels))
    raise TextfileError(f"{target}: cannot write: {cause}; {left}")


def _after_failure(target: Path, short: bytes) -> str:
    """Remove the stale file a failed write would leave and put the short error file there; say
    what is at ``target`` now."""
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        st = None
    except OSError:
        return "the previous file (if any) is unchanged"
    removed = False
    if st is not None and stat.S_ISREG(st.st_mode):
        try:
            os.unlink(target)  # also frees its blocks for the short file below
            removed = True
        except OSError:
            return "the previous file is unchanged (it could not be removed), so it shows an " \
                   "older run"
    try:
        replace_file(target, short, mode=0o644)
    except OSError:
        return ("removed the previous file so that it does not show an older run"
                if removed else "nothing was written")
    return f"wrote only {ERROR_METRIC} 1 and the verdict series there"


__all__ = ["ERROR_METRIC", "ESSENTIAL_FAMILIES", "TextfileError", "destination",
           "essential_lines", "write_metrics_file"]
