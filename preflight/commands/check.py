"""``preflight check``: every node-local check once, a table or JSON, an exit code."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from preflight.cli import (
    Formatter,
    add_config_options,
    build_context,
    describe_on_help,
    emit_report,
    report_exit,
)
from preflight.core.textsafe import escape

if TYPE_CHECKING:
    from preflight.core.check import Check
    from preflight.core.result import Report

#: node-problem-detector keeps the first 80 characters of a plugin's output (max_output_length).
SUMMARY_CHARS = 80


def summary_line(report: Report, limit: int = SUMMARY_CHARS) -> str:
    """One line of at most ``limit`` characters: the verdict and the checks that made it,
    ``preflight FAIL: gpu_visible GpuLost, shm ShmTooSmall`` (worst first, as they ran)."""
    from preflight.core.result import Status

    status = report.status
    if status in (Status.PASS, Status.SKIP):
        counted = sum(1 for r in report.results if r.status is Status.PASS)
        text = (f"preflight PASS: {counted} checks pass" if status is Status.PASS
                else "preflight SKIP: no check applied")
    else:
        names = ", ".join(f"{r.check} {r.reason}" for r in report.results if r.status is status)
        text = f"preflight {status.name}: {names}"
    return escape(text, limit)


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def _description() -> str:
    from preflight.checks import CHECKS

    checks = "\n".join(f"  {c.name:<14} {c.summary}" for c in CHECKS)
    return ("Run the node-local checks once and print a verdict per check.\n\n"
            f"checks:\n{checks}\n\nand the site checks the config's site_checks "
            "adds (preflight docs site-checks); --ddp adds ddp, the field guide's "
            "minimal DDP run (preflight docs ddp).")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "check", formatter_class=Formatter,
        help="run the node-local checks once (Slurm prolog, init container, a person)",
        epilog="exit codes: 0 ok or warnings, 1 a check failed, 2 usage/config error, "
               "3 a check errored or timed out")
    describe_on_help(p, _description)  # the check list is imported for --help only
    form = p.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true",
                      help="print the JSON report instead of a table")
    form.add_argument("--summary", action="store_true",
                      help=f"print one line of at most {SUMMARY_CHARS} characters instead of a "
                           "table, e.g. 'preflight FAIL: gpu_visible GpuLost' (for "
                           "node-problem-detector's custom plugins, which keep 80)")
    p.add_argument("--only", type=_names, default=[], metavar="A,B",
                   help="run only these checks")
    p.add_argument("--skip", type=_names, default=[], metavar="A,B", help="do not run these checks")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 on WARN too (default: WARN exits 0, so a prolog does not drain "
                        "a node for a warning)")
    p.add_argument("--expect-gpus", type=int, metavar="N",
                   help="GPUs this node must show (default: from the job's SLURM_JOB_GPUS or "
                        "LOCAL_WORLD_SIZE, else at least one); 0 = CPU-only node, GPU checks skip")
    p.add_argument("--no-bandwidth", action="store_true",
                   help="skip the tests that load the GPUs (allreduce, gpu_speed)")
    p.add_argument("--ddp", action="store_true",
                   help="also run the check ddp: the field guide's minimal DDP run, one variable "
                        "at a time, as preflight ddp runs it (seconds: torch's import)")
    p.add_argument("--golden", metavar="FILE",
                   help="fingerprint JSON (preflight fingerprint --json) this node must match")
    p.add_argument("--python", metavar="PATH",
                   help="interpreter of the training environment: fingerprinted by versions, "
                        "runs the all-reduce workers (default: the one running preflight)")
    p.add_argument("--multi-node", action="store_true", default=None,
                   help="judge the network for a multi-node job even if WORLD_SIZE does not say so")
    p.add_argument("--probe-master", action="store_true", default=None,
                   help="on a non-master node, try a TCP connect to MASTER_ADDR:MASTER_PORT")
    p.add_argument("--min-busbw", type=float, metavar="GBPS",
                   help="all-reduce bus bandwidth floor in GB/s (default: built-in table per GPU "
                        "model and count)")
    p.add_argument("--timeout", type=float, metavar="S", dest="check_timeout_s",
                   help="deadline of each check in seconds (default 10; the all-reduce has "
                        "its own)")
    p.add_argument("--prom-file", metavar="PATH",
                   help="also write the metrics in node_exporter textfile format to PATH "
                        "(a regular file or a new path, replaced atomically; a symlink is "
                        "followed; a device or FIFO is refused). A failed write is reported on "
                        "stderr and never changes the verdict or the exit code")
    add_config_options(p)
    p.set_defaults(func=run)


def _ddp(wanted: bool) -> tuple[Check, ...]:
    if not wanted:
        return ()
    from preflight.ddp.check import CHECK

    return (CHECK,)


def run(args: argparse.Namespace) -> int:
    from preflight.checks import CHECKS, GPU_LOAD_CHECKS
    from preflight.checks.site import site_checks
    from preflight.checks.versions import check_targets
    from preflight.core.result import ExitCode
    from preflight.core.runner import SelectionError, run_checks, select

    ctx = build_context(args, {
        "expect_gpus": args.expect_gpus, "golden": args.golden, "python": args.python,
        "multi_node": args.multi_node, "probe_master": args.probe_master,
        "min_busbw_gbps": args.min_busbw, "check_timeout_s": args.check_timeout_s,
    })
    names = {c.name for c in CHECKS}
    skip = [*args.skip, *([n for n in GPU_LOAD_CHECKS if n in names]
                          if args.no_bandwidth else [])]
    every = (*CHECKS, *site_checks(ctx.config, names), *_ddp(args.ddp))
    try:
        checks = select(every, only=args.only, skip=skip)
    except SelectionError as exc:
        print(f"preflight check: {escape(str(exc), 600)}", file=sys.stderr)
        return int(ExitCode.USAGE)
    # A --python or golden file that cannot be used is a configuration error (exit 2), not a
    # verdict about this node.
    check_targets(ctx.config, [c.name for c in checks], timeout_s=ctx.config.check_timeout_s)
    report = run_checks(ctx, checks)
    if args.summary:
        print(summary_line(report))
    else:
        emit_report(report, as_json=args.json)
    if args.prom_file:
        sys.stdout.flush()  # the verdict is out before a slow or failing disk is touched
        from preflight.outputs.prom import TextfileError, write_textfile

        try:
            write_textfile(report, args.prom_file)
        except TextfileError as exc:
            # The metrics file is a side channel: its failure never changes the verdict.
            print(f"preflight check: --prom-file {escape(str(exc), 600)}", file=sys.stderr)
    return report_exit(report, strict=args.strict)
