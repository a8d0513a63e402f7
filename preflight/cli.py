"""The ``preflight`` command line. Results go to stdout, logs to stderr.

Exit codes of every one-shot command: 0 nothing worse than WARN (``--strict``: WARN fails too),
1 a check FAILED, 2 usage or configuration error, 3 the validator could not decide (ERROR).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from preflight import __version__
from preflight.config import Config, ConfigError, load
from preflight.context import Context, make_context
from preflight.model import ExitCode, Report, exit_code

log = logging.getLogger("preflight")

#: Modules that add one subcommand each through ``add_parser(subparsers)``; the parser they add
#: sets ``func(args) -> int``. Imported when the parser is built, so they must stay light.
SUBCOMMAND_MODULES = (
    "preflight.commands.check",
    "preflight.commands.bench",
    "preflight.commands.fingerprint",
    "preflight.commands.serve",
    "preflight.commands.explain",
    "preflight.commands.prolog",
    "preflight.commands.cluster",
)

EPILOG = """\
exit codes: 0 ok (nothing worse than WARN), 1 a check failed (node is bad),
            2 usage or configuration error, 3 could not decide (a check errored or timed out)
environment: PREFLIGHT_<KEY>=value overrides any config key (PREFLIGHT_EXPECT_GPUS=8);
             PREFLIGHT_CONFIG=FILE names the config file.
docs: README.md and docs/ in the source tree."""


class Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows defaults and keeps the epilog's line breaks.

    An option whose help already names its default (it comes from the config, so the parser's
    own default is None), or that has no meaningful one (a flag), gets no "(default: ...)"."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text or action.default in (None, False, [], argparse.SUPPRESS):
            return text
        return super()._get_help_string(action)


def add_config_options(p: argparse.ArgumentParser) -> None:
    """Options every node-checking command shares."""
    p.add_argument("--config", metavar="FILE",
                   help="YAML or TOML config file (keys: see docs/configuration.md); "
                        "default $PREFLIGHT_CONFIG, else built-in defaults")
    p.add_argument("--root", metavar="DIR", default="/",
                   help="where the host filesystem is mounted (a container mounting the host at "
                        "/host passes --root /host); /dev/shm, /sys, /proc are read under it")


def build_context(args: argparse.Namespace, overrides: dict[str, Any]) -> Context:
    config = load(path=args.config, env=os.environ, overrides=overrides)
    return make_context(config, root=args.root)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="preflight",
        description="Prove that torchrun + NCCL will work on this node, and at full speed: GPUs, "
                    "CUDA_VISIBLE_DEVICES, launcher variables, /dev/shm, NICs, master port, "
                    "library versions, and a timed NCCL all-reduce.",
        epilog=EPILOG, formatter_class=Formatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--log-level", default=os.environ.get("PREFLIGHT_LOG_LEVEL", "warning"),
                        choices=("debug", "info", "warning", "error"),
                        help="verbosity of the log on stderr ($PREFLIGHT_LOG_LEVEL)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).add_parser(sub)
    for command in sub.choices.values():
        # Also accepted after the subcommand (`preflight check --log-level debug`).
        command.add_argument("--log-level", default=argparse.SUPPRESS,
                             choices=("debug", "info", "warning", "error"),
                             help="verbosity of the log on stderr (default: warning)")
    return parser


def emit_report(report: Report, *, as_json: bool) -> None:
    """Write a Report to stdout as JSON or as the terminal table."""
    if as_json:
        json.dump(report.to_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        from preflight.outputs.table import render

        sys.stdout.write(render(report, colour=sys.stdout.isatty()) + "\n")


def report_exit(report: Report, *, strict: bool) -> int:
    return int(exit_code(report.status, strict=strict))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="preflight: %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"preflight: configuration error: {exc}", file=sys.stderr)
        return int(ExitCode.USAGE)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `preflight check | head` is not an error of the node.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return int(ExitCode.OK)


__all__ = ["Config", "add_config_options", "build_context", "emit_report", "main",
           "report_exit"]
