"""The ``preflight`` command line. Results go to stdout, logs to stderr.

Exit codes of every one-shot command: 0 nothing worse than WARN (``--strict``: WARN fails too),
1 a check FAILED, 2 usage or configuration error, 3 the validator could not decide (ERROR).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import io
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from preflight import __version__
from preflight.core import aborting
from preflight.core.errors import ConfigError
from preflight.core.textsafe import escape

if TYPE_CHECKING:
    from preflight.core.context import Context
    from preflight.core.result import Report

log = logging.getLogger("preflight")

#: Modules that add one subcommand each through ``add_parser(subparsers)``; the parser they add
#: sets ``func(args) -> int``. Imported when the parser is built (``--version`` and ``--help``
#: too), so they must stay light: argparse and this module at the top, everything a command
#: runs imported inside its ``run`` (an interpreter without bytecode compiles every module it
#: imports, on every start).
SUBCOMMAND_MODULES = (
    "preflight.commands.check",
    "preflight.commands.bench",
    "preflight.commands.ddp",
    "preflight.commands.fingerprint",
    "preflight.commands.serve",
    "preflight.commands.explain",
    "preflight.commands.prolog",
    "preflight.commands.epilog",
    "preflight.commands.xid",
    "preflight.commands.cluster",
    "preflight.commands.lint",
    "preflight.commands.docs",
)

EPILOG = """\
exit codes: 0 ok (nothing worse than WARN), 1 a check failed (node is bad),
            2 usage or configuration error, 3 could not decide (a check errored or timed out)
environment: PREFLIGHT_<KEY>=value overrides any config key (PREFLIGHT_EXPECT_GPUS=8);
             PREFLIGHT_CONFIG=FILE names the config file.
docs: preflight docs lists the documentation topics; preflight docs TOPIC prints one."""


class Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows defaults and keeps the epilog's line breaks.

    An option whose help already names its default (it comes from the config, so the parser's
    own default is None), or that has no meaningful one (a flag), gets no "(default: ...)"."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text or action.default in (None, False, [], "", argparse.SUPPRESS):
            return text
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """argparse's parser whose description may be written only when the help is shown
    (:func:`describe_on_help`): building the parser then imports nothing the help alone needs."""

    describe: Callable[[], str] | None = None

    def format_help(self) -> str:
        if self.describe is not None:
            self.description, self.describe = self.describe(), None
        return super().format_help()


def describe_on_help(parser: argparse.ArgumentParser, make: Callable[[], str]) -> None:
    """``parser``'s description is ``make()``, called when its help is formatted (at once for a
    parser that is no :class:`Parser`)."""
    if isinstance(parser, Parser):
        parser.describe = make
    else:
        parser.description = make()


def help_text(doc: str | None) -> str:
    """A docstring as ``--help`` text: reST's ``literal`` marks and ``:role:`name``` dropped, so
    a terminal shows the words, not the markup."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", doc or "")
    return text.replace("``", "")


def count_arg(what: str, most: int, hint: str) -> Callable[[str], int]:
    """An argparse ``type``: a whole number 1..``most`` of ``what`` ("ranks"), else a one-line
    error that ends with ``hint`` (what a sane value is)."""

    def parse(text: str) -> int:
        try:
            n = int(text, 10) if len(text) <= 20 else -1
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of {what}") from None
        if not 1 <= n <= most:
            raise argparse.ArgumentTypeError(f"{text!r} {what}: expected 1..{most} ({hint})")
        return n

    return parse


def nproc_arg(text: str) -> int:
    """Ranks for argparse (``bench --nproc``, ``cluster --nproc-per-node``): 1..64."""
    from preflight.bench.method import MAX_NPROC  # (the parser is built without the bench)

    return count_arg("ranks", MAX_NPROC,
                     "one rank per GPU; with gloo, a few CPU ranks suffice")(text)


def size_arg(text: str) -> int:
    """An all-reduce size for argparse (``bench --min-bytes/--max-bytes``, ``cluster --size``):
    bytes or 1024-based K/M/G, 4 bytes up to the config's own bound (bench_max_bytes)."""
    from preflight.bench.method import parse_size
    from preflight.core.config import RANGES

    most = RANGES["bench_max_bytes"][1]
    try:
        size = parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not 4 <= size <= most:
        raise argparse.ArgumentTypeError(f"{text!r} is {size} bytes; expected 4 bytes .. "
                                         f"{int(most) >> 30}G")
    return size


def add_config_options(p: argparse.ArgumentParser) -> None:
    """Options every node-checking command shares."""
    p.add_argument("--config", metavar="FILE",
                   help="YAML or TOML config file (keys: preflight docs configuration); "
                        "default $PREFLIGHT_CONFIG, else built-in defaults")
    p.add_argument("--root", metavar="DIR", default="/",
                   help="where the host filesystem is mounted (a container mounting the host at "
                        "/host passes --root /host); /dev/shm, /sys, /proc are read under it")


def check_root(root: str) -> str:
    """``--root`` as given, or ConfigError when it is not a directory (a typo there made every
    path under it missing: /dev/shm "missing" drained the node)."""
    if not os.path.isdir(root):
        raise ConfigError(f"--root {root!r} is not a directory (where the host filesystem is "
                          "mounted, e.g. --root /host)")
    return root


def build_context(args: argparse.Namespace, overrides: dict[str, Any]) -> Context:
    from preflight.core.config import load
    from preflight.probes.node import make_context

    config = load(path=args.config, env=os.environ, overrides=overrides)
    return make_context(config, root=check_root(args.root))


LOG_LEVELS = ("debug", "info", "warning", "error")


def _env_log_level(env: Mapping[str, str]) -> str:
    """``$PREFLIGHT_LOG_LEVEL`` when it names a level, else ``warning`` with a note on stderr (a
    typo in a logging variable must not stop a prolog)."""
    value = env.get("PREFLIGHT_LOG_LEVEL", "warning").strip().lower()
    if value in LOG_LEVELS:
        return value
    sys.stderr.write(f"preflight: PREFLIGHT_LOG_LEVEL={escape(value, 40)} is not one of "
                     f"{', '.join(LOG_LEVELS)}; using warning\n")
    return "warning"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="preflight",
        description="Prove that torchrun + NCCL will work on this node, and at full speed: GPUs, "
                    "CUDA_VISIBLE_DEVICES, launcher variables, /dev/shm, NICs, master port, "
                    "library versions, and a timed NCCL all-reduce.",
        epilog=EPILOG, formatter_class=Formatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--log-level", default=_env_log_level(os.environ),
                        choices=LOG_LEVELS,
                        help="verbosity of the log on stderr ($PREFLIGHT_LOG_LEVEL)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).add_parser(sub)
    for command in sub.choices.values():
        # Also accepted after the subcommand (`preflight check --log-level debug`).
        command.add_argument("--log-level", default=argparse.SUPPRESS,
                             choices=LOG_LEVELS,
                             help="verbosity of the log on stderr (default: warning)")
    return parser


def emit(*, as_json: bool, data: Callable[[], Any], text: Callable[[], str]) -> None:
    """Write a command's result to stdout: ``data()`` as indented JSON, or ``text()`` (only the
    chosen form is built)."""
    if as_json:
        json.dump(data(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(text() + "\n")


def emit_report(report: Report, *, as_json: bool) -> None:
    """Write a Report to stdout as JSON or as the terminal table."""

    def table() -> str:
        from preflight.outputs.table import render

        return render(report, colour=sys.stdout.isatty())

    emit(as_json=as_json, data=report.to_json, text=table)


class PrintableFormatter(logging.Formatter):
    """Log lines with control characters escaped: a message quotes what a job, a peer or a check
    child wrote, and a newline in it would forge a second log line (an ESC sequence would drive
    the terminal of whoever tails the journal). Tracebacks keep their lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return escape(super().formatMessage(record))


def report_exit(report: Report, *, strict: bool) -> int:
    from preflight.core.result import exit_code

    return int(exit_code(report.status, strict=strict))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return _prolog_usage_fail_open(argv, exc)
    from preflight.core.result import ExitCode  # past the parser: a command runs

    if sys.stdout is None:  # started with stdout closed (>&-): fail on the first write, once
        sys.stdout = _ClosedStdout()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(PrintableFormatter("preflight: %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=args.log_level.upper(), handlers=[handler])
    try:
        # SIGTERM / SIGHUP: the workers and scratch files of the checks' threads are removed
        # before the process dies of the signal (core/aborting.py).
        with aborting.undo_on_signals():
            code = int(args.func(args))
        sys.stdout.flush()
        return code
    except ConfigError as exc:
        print(f"preflight: configuration error: {escape(str(exc), 2000)}", file=sys.stderr)
        return int(ExitCode.USAGE)
    except KeyboardInterrupt:
        aborting.abort()
        return 130
    except BrokenPipeError:
        # `preflight check | head` is not an error of the node.
        _silence_stdout()
        return int(ExitCode.OK)
    except OSError as exc:
        if not _is_stdout_error(exc):
            return _undecided(exc)
        # stdout closed (>&-) or full (>/dev/full): say so once, without a traceback.
        _silence_stdout()
        print(f"preflight: cannot write the result to standard output: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return int(ExitCode.UNDECIDED)
    except Exception as exc:  # the command boundary: a preflight bug is "undecided", not a FAIL
        return _undecided(exc)
    finally:
        # A check thread the runner gave up on may still have workers: none outlives the command.
        aborting.undo_abandoned()


def _prolog_usage_fail_open(argv: Sequence[str], exc: SystemExit) -> int:
    """A usage error in the prolog's own command line (slurm.conf) would drain every node: Slurm
    drains on any non-zero prolog exit. Like a config error, it lets the job run, unless
    ``--fail-closed`` is among the arguments. Other commands keep argparse's exit (2; 0 for
    --help)."""
    code = exc.code if isinstance(exc.code, int) else 2
    commands = {"check", "bench", "ddp", "fingerprint", "diff", "serve", "explain", "prolog",
                "epilog", "xid", "cluster", "lint", "docs"}
    command = next((a for a in argv if a in commands), None)
    if code == 0 or command not in ("prolog", "epilog"):
        raise exc
    from preflight.core.result import ExitCode

    if "--fail-closed" in argv and "--report-only" not in argv:
        return int(ExitCode.FAILED)
    print(f"preflight {command}: usage error in the {command}'s command line (above); letting "
          "the job run (--fail-closed would drain the node)", file=sys.stderr)
    return int(ExitCode.OK)


def _undecided(exc: BaseException) -> int:
    from preflight.core.result import ExitCode

    log.debug("traceback of the internal error", exc_info=exc)
    print(f"preflight: internal error, so the node is undecided: {type(exc).__name__}: "
          f"{escape(str(exc), 300)} (run with --log-level debug for the traceback and report it)",
          file=sys.stderr)
    return int(ExitCode.UNDECIDED)


class _ClosedStdout(io.TextIOBase):
    def write(self, _text: str) -> int:
        raise OSError(errno.EBADF, "standard output is closed")


def _is_stdout_error(exc: OSError) -> bool:
    return exc.errno in (errno.EBADF, errno.ENOSPC, errno.EPIPE, errno.EIO, errno.EDQUOT)


def _silence_stdout() -> None:
    """Point fd 1 at /dev/null so the interpreter's final flush cannot fail again."""
    import contextlib

    with contextlib.suppress(OSError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    with contextlib.suppress(OSError, ValueError):
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives until exit


__all__ = ["Parser", "add_config_options", "build_context", "describe_on_help", "emit_report",
           "main", "report_exit"]
