"""``preflight prolog``: the node checks as a Slurm Prolog / HealthCheckProgram.

Slurm drains a node and requeues (holds) the job on any non-zero prolog exit, so this command is
careful about what it lets through (Slurm docs, slurm.conf: Prolog, HealthCheckProgram):

- a check FAILED and the node is to blame (scope node): ``scontrol update nodename=<node>
  state=drain reason="preflight: <check> <Reason>, ..."``, then exit 1. The custom reason survives
  Slurm's own "Prolog error" drain, so ``sinfo -R`` says what is wrong.
- a check FAILED because of the job's own setting (scope job: a duplicate CUDA_VISIBLE_DEVICES
  entry, RANK >= WORLD_SIZE, a MASTER_PORT in use, ...): reported on stderr, exit 0; a job's mistake
  never drains a node.
- WARN: exit 0 (warnings never drain a node).
- could not decide (a check ERRORED or timed out), a configuration error (a config that is not
  UTF-8, an out-of-range value, a ``--root`` that is not a directory) or any internal error of
  preflight: logged to stderr (the slurmd log) as one line, exit 0, so a preflight bug or a typo
  in the config does not drain the whole cluster; ``--fail-closed`` drains and exits 1 instead.
  The traceback of an internal error shows only at ``--log-level debug``.

The bandwidth test is off unless ``--bandwidth``: a prolog should take seconds (MessageTimeout,
10 s by default); run the all-reduce from the daemon or a timer. ``--ddp`` adds the DDP ladder
(``preflight ddp``) for sites that accept its seconds. Slurm sets no PATH for the
prolog: ``--scontrol`` defaults to the first of /usr/bin/scontrol, /usr/local/bin/scontrol.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import socket
import sys
from pathlib import Path

from preflight.checks import CHECKS, GPU_LOAD_CHECKS
from preflight.checks.site import site_checks
from preflight.cli import Formatter, add_config_options, build_context, help_text
from preflight.core.config import ConfigError
from preflight.core.procgroup import GroupTimeout, run_in_group
from preflight.core.result import Report, Scope, Status
from preflight.core.runner import SelectionError, run_checks, select
from preflight.core.textsafe import escape

log = logging.getLogger(__name__)

#: Slurm keeps reasons short in `sinfo -R`; longer ones are cut here, not by Slurm.
MAX_REASON_CHARS = 200
SCONTROL_TIMEOUT_S = 10.0


def _default_scontrol() -> str:
    for candidate in ("/usr/bin/scontrol", "/usr/local/bin/scontrol"):
        if Path(candidate).exists():
            return candidate
    return shutil.which("scontrol") or "/usr/bin/scontrol"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "prolog", formatter_class=Formatter,
        help="run the node checks as a Slurm prolog: drain this node with the reason on FAIL",
        description=help_text(__doc__), epilog="exit codes: 0 go (PASS, WARN, or undecided without "
        "--fail-closed), 1 this node is bad (drained)")
    p.add_argument("--expect-gpus", type=int, metavar="N",
                   help="GPUs this node must show (default: from SLURM_JOB_GPUS, else >= 1)")
    p.add_argument("--golden", metavar="FILE", help="fingerprint JSON this node must match")
    p.add_argument("--python", metavar="PATH", help="the training environment's interpreter")
    p.add_argument("--skip", default="", metavar="A,B", help="checks not to run")
    p.add_argument("--bandwidth", action="store_true",
                   help="also run the tests that load the GPUs: the timed all-reduce and gpu_speed "
                        "(seconds; off by default in a prolog)")
    p.add_argument("--ddp", action="store_true",
                   help="also run the check ddp, the field guide's minimal DDP run (seconds: "
                        "torch's import; a failure a job variable bears on never drains)")
    p.add_argument("--fail-closed", action="store_true",
                   help="drain and exit 1 also when preflight could not decide or its config is "
                        "bad (default: log and let the job run)")
    p.add_argument("--scontrol", default=None, metavar="PATH",
                   help="scontrol to call (default: /usr/bin/scontrol, /usr/local/bin/scontrol)")
    add_config_options(p)
    p.set_defaults(func=run)


def drain_reason(report: Report, *, undecided: bool = False) -> str:
    """``preflight: gpu_visible GpuLost, shm ShmTooSmall`` from the node's faults (or, with
    ``undecided``, from the checks that could not decide)."""
    want = Status.ERROR if undecided else Status.FAIL
    parts = [f"{r.check} {r.reason}" for r in report.results
             if r.status is want and r.scope is not Scope.JOB]
    text = "preflight: " + (", ".join(parts) or "undecided")
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."


def drain(scontrol: str, node: str, reason: str, *,
          timeout_s: float = SCONTROL_TIMEOUT_S) -> bool:
    """Drain ``node`` with ``reason``; False (and a log line) when scontrol fails.

    scontrol runs in its own process group; when it does not answer within ``timeout_s`` (a
    slurmctld that does not answer, a wrapper script that hangs) the whole group is killed, so
    nothing it started outlives the prolog.
    """
    argv = [scontrol, "update", f"nodename={node}", "state=drain", f"reason={escape(reason)}"]
    try:
        proc = run_in_group(argv, timeout_s=timeout_s)
    except GroupTimeout as exc:
        _say(f"could not drain {node}: {exc}. Drain by hand: scontrol update nodename={node} "
             "state=drain reason=preflight")
        return False
    except OSError as exc:
        _say(f"could not drain {node}: cannot run {scontrol}: {exc.strerror or exc}")
        return False
    if proc.returncode != 0:
        _say(f"scontrol exit {proc.returncode}: {proc.stderr.decode(errors='replace').strip()}")
        return False
    return True


def _say(line: str) -> None:
    """One line to stderr (the slurmd log), control characters escaped: a value from the job's
    environment cannot forge a second log line or drive a terminal."""
    print(f"preflight prolog: {escape(line, 2000)}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    scontrol = args.scontrol or _default_scontrol()
    try:
        return _judge(args, node, scontrol)
    except Exception as exc:  # preflight's own trouble never drains a node (unless asked)
        log.debug("traceback of the prolog's internal error", exc_info=True)
        _say(f"internal error, so the node is undecided: {type(exc).__name__}: {exc} (run "
             "`preflight prolog --log-level debug` by hand for the traceback and report it)")
        if args.fail_closed:
            drain(scontrol, node, "preflight: internal error")
            return 1
        return 0


def _judge(args: argparse.Namespace, node: str, scontrol: str) -> int:
    try:
        ctx = build_context(args, {"expect_gpus": args.expect_gpus, "golden": args.golden,
                                   "python": args.python})
        skip = [s for s in args.skip.split(",") if s]
        if not args.bandwidth:
            skip += GPU_LOAD_CHECKS
        every = (*CHECKS, *site_checks(ctx.config, [c.name for c in CHECKS]))
        if args.ddp:
            from preflight.ddp.check import CHECK

            every = (*every, CHECK)
        checks = select(every, skip=skip)
    except (ConfigError, SelectionError) as exc:
        _say(f"configuration error: {exc}")
        if args.fail_closed:
            drain(scontrol, node, "preflight: configuration error")
            return 1
        return 0
    report = run_checks(ctx, checks, mode="prolog")
    for r in report.results:
        if r.status >= Status.WARN:
            fix = f" fix: {r.remedy}" if r.remedy else ""
            _say(f"{r.status.name} {r.check} {r.reason} (scope {r.scope.value}): {r.message}{fix}")
    if report.node_status is Status.FAIL:
        drain(scontrol, node, drain_reason(report))
        return 1
    if report.node_status is Status.ERROR and args.fail_closed:
        drain(scontrol, node, drain_reason(report, undecided=True))
        return 1
    return 0
