"""``preflight prolog``: the node checks as a Slurm Prolog / HealthCheckProgram.

Slurm drains a node and requeues (holds) the job on any non-zero prolog exit, so this command is
careful about what it lets through (Slurm docs, slurm.conf: Prolog, HealthCheckProgram; the
acts themselves are in :mod:`preflight.commands.slurmhook`):

- a check FAILED and the node is to blame (scope node): ``scontrol update nodename=<node>
  state=drain reason="preflight: <check> <Reason>, ..."``, then exit 1. The custom reason survives
  Slurm's own "Prolog error" drain, so ``sinfo -R`` says what is wrong. Before it, one ``sinfo``
  call counts the nodes preflight has drained; above ``max_drain_fraction`` the drain is held
  back (exit 0, said loudly).
- a check FAILED because of the job's own setting (scope job): reported on stderr, exit 0.
- WARN: exit 0 (warnings never drain a node).
- could not decide, a configuration error, an internal error: one line on stderr, exit 0, unless
  ``--fail-closed``.
- ``--report-only``: everything is reported, nothing drained or resumed, exit 0.
- ``--resume``: a node drained by preflight (its reason starts with ``preflight:``) that passed
  ``resume_after`` runs in a row is resumed.

The whole run ends inside ``prolog_budget_s`` (8 s) counted from the process start: the checks'
deadline is cut to leave time for sinfo and scontrol, a GPU probe that does not answer is a
verdict (``NvmlNotAnswering``), and a watchdog ends the process at the budget whatever hangs.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from preflight.cli import Formatter, add_config_options
from preflight.commands.hookopts import add_hook_options

if TYPE_CHECKING:
    from preflight.commands.slurmhook import HookRun

DESCRIPTION = """\
Run the node checks as a Slurm Prolog (or HealthCheckProgram) and act on the verdict:

  FAIL, the node's fault     drain this node, the failing checks as the reason; exit 1
  FAIL, the job's own fault  report it on stderr; exit 0 (a job's mistake never drains)
  WARN, PASS, SKIP           exit 0
  undecided (ERROR), a bad config, a preflight bug
                             one line on stderr; exit 0 (--fail-closed: drain, exit 1)

Before draining, one sinfo call counts the nodes already drained by preflight; when they are
more than max_drain_fraction of the cluster the drain is held back (exit 0, said on stderr and
in --prom-file), so a preflight bug cannot drain the fleet. The whole run ends within
prolog_budget_s (8 s) whatever hangs; a GPU driver that does not answer is a node fault
(NvmlNotAnswering).

Rollout: --report-only first (reports, drains nothing, exits 0), then drain; with --resume in
HealthCheckProgram a node that preflight drained is resumed after resume_after passing runs in
a row (never a node drained for another reason). The all-reduce and gpu_speed run only with
--bandwidth, the DDP ladder (preflight ddp) only with --ddp. Slurm gives a prolog no PATH:
scontrol and sinfo are looked up in /usr/bin and /usr/local/bin. Install, verdicts and
rollout: docs/slurm.md."""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "prolog", formatter_class=Formatter,
        help="run the node checks as a Slurm prolog or health check: drain this node with the "
             "reason on FAIL, resume it once fixed",
        description=DESCRIPTION, epilog="exit codes: 0 go (PASS, WARN, a job's own fault, "
        "undecided without --fail-closed, --report-only, a drain held back by the fleet "
        "guard), 1 this node is bad (drained)")
    p.add_argument("--expect-gpus", type=int, metavar="N",
                   help="GPUs this node must show (default: from SLURM_JOB_GPUS, else >= 1)")
    p.add_argument("--golden", metavar="FILE", help="fingerprint JSON this node must match")
    p.add_argument("--python", metavar="PATH", help="the training environment's interpreter")
    p.add_argument("--skip", default="", metavar="A,B", help="checks not to run")
    p.add_argument("--bandwidth", action="store_true",
                   help="also run the tests that load the GPUs: the timed all-reduce and gpu_speed "
                        "(seconds; off by default in a prolog; raise prolog_budget_s with it)")
    p.add_argument("--ddp", action="store_true",
                   help="also run the check ddp, the field guide's minimal DDP run (seconds: "
                        "torch's import; raise prolog_budget_s with it); a failure that a job "
                        "variable bears on never drains")
    p.add_argument("--resume", action="store_true",
                   help="resume this node when preflight drained it and it has passed "
                        "resume_after runs in a row (for HealthCheckProgram)")
    add_hook_options(p)
    add_config_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from preflight.commands.slurmhook import HookRun

    return HookRun("prolog", args).execute(_judge)


def _judge(hook: HookRun) -> int:
    from preflight.checks import CHECKS, GPU_LOAD_CHECKS
    from preflight.checks.site import site_checks
    from preflight.checks.versions import check_targets
    from preflight.commands.slurmhook import names
    from preflight.core.config import ConfigError
    from preflight.core.runner import SelectionError, run_checks, select

    args = hook.args
    try:
        ctx = hook.context({"expect_gpus": args.expect_gpus, "golden": args.golden,
                            "python": args.python})
        skip = names(args.skip)
        if not args.bandwidth:
            skip += GPU_LOAD_CHECKS
        every = (*CHECKS, *site_checks(ctx.config, [c.name for c in CHECKS]))
        if args.ddp:
            from preflight.ddp.check import CHECK

            every = (*every, CHECK)
        checks = select(every, skip=skip)
        hook.phase = "looking at --python and --golden"
        check_targets(ctx.config, [c.name for c in checks],
                      timeout_s=min(ctx.config.check_timeout_s, hook.budget.left() / 4))
    except (ConfigError, SelectionError) as exc:
        return hook.config_error(exc)
    hook.phase = "running the checks"
    report = run_checks(ctx, checks, mode="prolog")
    return hook.act(report, ctx)
