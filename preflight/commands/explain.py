"""``preflight explain FILE... [--json]``: classify a failed job's logs.

Exit codes: 0 nothing recognised, 1 findings, 2 usage error (a missing or unreadable file, a
directory or a device: only regular files and pipes end).
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from collections.abc import Iterator
from typing import BinaryIO

from preflight.cli import Formatter
from preflight.core.result import ExitCode


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "explain", formatter_class=Formatter,
        help="read a failed job's torchrun / PyTorch / NCCL logs: what broke, where, the fix",
        description="Read the logs of a failed torchrun job (any size, streamed) and print the "
                    "failure classes found, root cause first: layer (environment, "
                    "communication, data, model, hardware), evidence lines, ranks involved and "
                    "the fix. Reasons: preflight docs explain.",
        epilog="exit codes: 0 nothing recognised, 1 findings, 2 usage error (a missing file, a "
               "directory or a device)")
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="log files or pipes (<(kubectl logs POD)); '-' reads standard input. "
                        "A name like rank3.log or attempt_0/3/stderr.log gives unprefixed "
                        "lines rank 3")
    p.add_argument("--json", action="store_true",
                   help="print JSON: {findings: [{reason, layer, message, remedy, evidence, "
                        "ranks}], ranks: {...}}")
    p.set_defaults(func=run)


def _streams(files: list[str]) -> Iterator[tuple[str, BinaryIO]]:
    """Open the files one at a time, so that any number of them uses one descriptor."""
    for name in files:
        if name == "-":
            yield "-", sys.stdin.buffer
        else:
            with open(name, "rb") as stream:
                yield name, stream


def _not_a_log(name: str) -> str | None:
    """Why ``name`` cannot be read as a log, None when it can: a regular file, or a pipe
    (``<(kubectl logs POD)``, a named FIFO), which ends when its writer closes it. A device such
    as /dev/zero never ends, so it is refused rather than read forever."""
    try:
        mode = os.stat(name).st_mode
    except FileNotFoundError:
        return "no such file"
    except OSError as exc:
        return f"cannot read: {exc.strerror or exc}"
    if stat.S_ISREG(mode) or stat.S_ISFIFO(mode):
        return None
    kind = ("is a directory" if stat.S_ISDIR(mode) else
            "is a character device" if stat.S_ISCHR(mode) else
            "is a block device" if stat.S_ISBLK(mode) else
            "is a socket" if stat.S_ISSOCK(mode) else "is not a regular file")
    return f"{kind}; give a log file, a pipe, or - for standard input"


def run(args: argparse.Namespace) -> int:
    from preflight.explain import explain_streams
    from preflight.explain.output import render_text, to_json

    files: list[str] = list(args.files)
    if files.count("-") > 1:
        print("preflight explain: '-' (standard input) can be given once", file=sys.stderr)
        return int(ExitCode.USAGE)
    for name in files:
        what = None if name == "-" else _not_a_log(name)
        if what is not None:
            print(f"preflight explain: {name}: {what}", file=sys.stderr)
            return int(ExitCode.USAGE)
    try:
        expl = explain_streams(_streams(files))
    except OSError as exc:
        print(f"preflight explain: cannot read {exc.filename or 'input'}: {exc.strerror or exc}",
              file=sys.stderr)
        return int(ExitCode.USAGE)
    sys.stdout.write((to_json(expl) if args.json else render_text(expl)) + "\n")
    return int(ExitCode.FAILED if expl.findings else ExitCode.OK)
