"""``preflight explain FILE... [--json]``: classify a failed job's logs (issue 6).

Exit codes: 0 nothing recognised, 1 findings, 2 usage error (a missing or unreadable file).
"""

from __future__ import annotations

import argparse
import os
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
                    "the fix. Reasons: docs/explain.md.",
        epilog="exit codes: 0 nothing recognised, 1 findings, 2 usage error (missing file)")
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="log files; '-' reads standard input. A name like rank3.log or "
                        "attempt_0/3/stderr.log gives unprefixed lines rank 3")
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


def run(args: argparse.Namespace) -> int:
    from preflight.explain import explain_streams
    from preflight.explain.output import render_text, to_json

    files: list[str] = list(args.files)
    if files.count("-") > 1:
        print("preflight explain: '-' (standard input) can be given once", file=sys.stderr)
        return int(ExitCode.USAGE)
    for name in files:
        if name != "-" and not os.path.isfile(name):
            what = "is a directory" if os.path.isdir(name) else "no such file"
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
