"""``preflight explain PATH... [--json]``: classify a failed job's logs and flight recorder dumps.

Exit codes: 0 nothing recognised, 1 findings, 2 usage error (a missing or unreadable path, a
device: only regular files, pipes and directories of files end) or nothing recognised while an
input could not be read (a corrupt gzip, a zstd file without a decoder, a refused dump).
"""

from __future__ import annotations

import argparse
import os
import stat
import sys

from preflight.cli import Formatter


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "explain", formatter_class=Formatter,
        help="read a failed job's torchrun / PyTorch / NCCL logs and flight recorder dumps: "
             "what broke, where, the fix",
        description="Read the logs of a failed torchrun job (any size, streamed; gzip, zstd and "
                    "UTF-16/32 with a byte-order mark are decoded) and PyTorch's flight "
                    "recorder dumps (read as plain data, nothing in them is executed), and "
                    "print the failure classes found, root cause first: layer (environment, "
                    "communication, data, model, hardware), evidence lines, ranks involved and "
                    "the fix; from dumps, the ranks that never entered a collective the others "
                    "entered, and collectives whose op or sizes differ between ranks. With "
                    "nothing recognised, the log's first exception (or else its first "
                    "'error:' line) is named as the place to start reading. "
                    "Reasons: preflight docs explain.",
        epilog="flight recorder dumps on an NCCL timeout: TORCH_FR_BUFFER_SIZE=2000 "
               "TORCH_NCCL_DUMP_ON_TIMEOUT=1 TORCH_FR_DUMP_TEMP_FILE=/shared/fr/rank_ (torch < "
               "2.8: TORCH_NCCL_TRACE_BUFFER_SIZE, TORCH_NCCL_DEBUG_INFO_TEMP_FILE), then "
               "preflight explain /shared/fr/. exit codes: 0 nothing recognised, 1 findings, 2 "
               "usage error (a missing path or a device) or nothing recognised while an input "
               "could not be read")
    p.add_argument("files", nargs="+", metavar="PATH",
                   help="log files, pipes (<(kubectl logs POD)), flight recorder dumps "
                        "(TORCH_FR_DUMP_TEMP_FILE's <prefix><rank> files) or directories of "
                        "them; '-' reads standard input. A name like rank3.log or "
                        "attempt_0/3/stderr.log gives unprefixed lines rank 3")
    p.add_argument("--json", action="store_true",
                   help="print JSON: {findings: [{reason, layer, message, remedy, evidence, "
                        "ranks}], ranks: {...}, first_error: null or {source, line, text, "
                        "exception, frame, rank}}")
    p.set_defaults(func=run)


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
    if stat.S_ISREG(mode) or stat.S_ISFIFO(mode) or stat.S_ISDIR(mode):
        return None
    kind = ("is a character device" if stat.S_ISCHR(mode) else
            "is a block device" if stat.S_ISBLK(mode) else
            "is a socket" if stat.S_ISSOCK(mode) else "is not a regular file")
    return f"{kind}; give a log file, a pipe, a directory, or - for standard input"


def run(args: argparse.Namespace) -> int:
    from preflight.core.result import ExitCode
    from preflight.explain.output import render_text, to_json
    from preflight.explain.sources import expand, explain_streams, open_paths

    files: list[str] = list(args.files)
    if files.count("-") > 1:
        print("preflight explain: '-' (standard input) can be given once", file=sys.stderr)
        return int(ExitCode.USAGE)
    for name in files:
        what = None if name == "-" else _not_a_log(name)
        if what is not None:
            print(f"preflight explain: {name}: {what}", file=sys.stderr)
            return int(ExitCode.USAGE)
    paths: list[str] = []
    notes: list[str] = []
    for name in files:
        found, note = expand(name)
        paths.extend(found)
        if note:
            notes.append(note)
    try:
        expl = explain_streams(open_paths(paths, sys.stdin.buffer), notes=notes)
    except OSError as exc:
        print(f"preflight explain: cannot read {exc.filename or 'input'}: {exc.strerror or exc}",
              file=sys.stderr)
        return int(ExitCode.USAGE)
    sys.stdout.write((to_json(expl) if args.json else render_text(expl)) + "\n")
    if expl.findings:
        return int(ExitCode.FAILED)
    return int(ExitCode.USAGE if expl.unread else ExitCode.OK)
