"""``preflight lint PATH... [--format text|json|sarif]``: the training script's silent DDP
mistakes, found statically (the code is parsed, never imported or run).

Exit codes: 0 nothing found, 1 findings, 2 usage error (a path that does not exist, a bad
option), 3 nothing found but some file could not be linted (not Python, too large,
unreadable).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from preflight.cli import Formatter
from preflight.core.textsafe import escape

EPILOG = """\
rules: DDP101 set_epoch missing, DDP102 sampler sharded by the local rank, DDP103 device from
       the global rank, DDP104 hard-coded cuda:0, DDP105 env rank (str) compared with an int,
       DDP106 FSDP optimizer built before the wrap, DDP107 set_device after CUDA allocations.
       Each, with its fix: docs/lint.md. `# noqa: DDP101` (or a bare `# noqa`) silences a line.
exit codes: 0 nothing found, 1 findings, 2 usage error (a missing path),
            3 nothing found but a file could not be linted"""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "lint", formatter_class=Formatter,
        help="find a training script's silent DDP mistakes before the job is submitted",
        description="Read training scripts (files, or directories walked for *.py) and report "
                    "the distributed-training mistakes that raise no error: set_epoch never "
                    "called, shards or devices chosen by the wrong rank, cuda:0 on every rank, "
                    "an environment rank compared as a string, an FSDP optimizer built too "
                    "early, set_device called too late. The code is parsed, never run. "
                    "A finding that starts with 'not sure' (severity warning) saw only part "
                    "of the mistake.",
        epilog=EPILOG)
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="Python files or directories (walked for *.py; symlinked directories "
                        "are not followed)")
    p.add_argument("--format", choices=("text", "json", "sarif"), default="text",
                   help="text: path:line:col: DDP1xx message (as flake8); json; sarif: SARIF "
                        "2.1.0 for code-scanning UIs")
    p.add_argument("--json", action="store_true", help="same as --format json")
    p.add_argument("--sure-only", action="store_true",
                   help="leave out the 'not sure' findings (severity warning)")
    p.add_argument("--exclude", action="append", default=[], metavar="PATTERN",
                   help="file or directory names to skip (fnmatch, repeatable), added to "
                        ".git, .venv, venv, __pycache__, node_modules, site-packages...")
    p.add_argument("--max-bytes", type=_positive_int, default=None, metavar="N",
                   help="skip files larger than N bytes (default 4 MiB)")
    p.add_argument("--jobs", "-j", type=_positive_int, default=None, metavar="N",
                   help="worker processes for the files that must be parsed (default: the "
                        "CPUs this process may use; a handful of files is linted without "
                        "workers); the output order does not depend on it")
    p.set_defaults(func=run)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {escape(text, 40)}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def run(args: argparse.Namespace) -> int:
    from preflight.core.result import ExitCode
    from preflight.lint import DEFAULT_EXCLUDE, DEFAULT_MAX_BYTES, lint_paths
    from preflight.lint.jobs import usable_cpus
    from preflight.lint.output import render_skipped, render_text, to_json, to_sarif

    for path in args.paths:
        if not os.path.lexists(path):
            print(f"preflight lint: {escape(path, 300)}: no such file or directory",
                  file=sys.stderr)
            return int(ExitCode.USAGE)
    fmt = "json" if args.json else args.format
    summary = lint_paths(args.paths, exclude=(*DEFAULT_EXCLUDE, *args.exclude),
                         max_bytes=args.max_bytes or DEFAULT_MAX_BYTES,
                         sure_only=args.sure_only, jobs=args.jobs or usable_cpus())
    for result in summary.skipped:
        print(render_skipped(result), file=sys.stderr)
    if fmt == "text":
        text = render_text(summary)
        if text:
            sys.stdout.write(text + "\n")
    else:
        data = to_json(summary) if fmt == "json" else to_sarif(summary)
        json.dump(data, sys.stdout, indent=2)
        sys.stdout.write("\n")
    if summary.findings:
        return int(ExitCode.FAILED)
    return int(ExitCode.UNDECIDED if summary.skipped else ExitCode.OK)
