"""``preflight ddp``: the field guide's minimal DDP run, one variable at a time, on this node.

One worker per local rank (one per GPU the job's CUDA_VISIBLE_DEVICES leaves visible; 2 CPU ranks
without a GPU) runs the field guide's minimal DDP training (a linear layer, a small synthetic data
set, a DistributedSampler with set_epoch) under the training environment's torch (--python), in
three steps that each change one variable: (1) each rank alone on its GPU, no process group (CUDA,
the driver, the torch build, the device mapping); (2) every local rank with DDP over gloo; (3) the
same over NCCL. It stops at the first step that fails and names the layer: environment,
communication (rendezvous, ports, GLOO_SOCKET_IFNAME) or nccl (with NCCL's WARN lines and the
network, shm and nccl_env checks); when every step passes, the node and the launcher are fine: look
at the model and data.

Each step proves what it claims: the parameters bitwise equal on every rank after training (and
right after DDP's broadcast, though every rank starts from its own), the loss down, the
sampler's shards disjoint and covering the data set, the order changed between epochs with
set_epoch, each rank on the GPU its LOCAL_RANK maps to, every parameter used with
find_unused_parameters=False. Nothing waits out NCCL's 10-30 minute default: each phase has a
deadline, a stopped rank is named and every worker is killed; nothing is left (the output says
what it checked). The GPU steps SKIP on a node without a GPU.
"""

from __future__ import annotations

import argparse
import sys

from preflight.cli import Formatter, add_config_options, build_context, count_arg, emit, help_text


def _nproc(text: str) -> int:
    from preflight.ddp.ladder import MAX_NPROC  # (the parser is built without the ladder)

    return count_arg("ranks", MAX_NPROC, "one rank per GPU; without a GPU, a few CPU ranks")(text)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "ddp", formatter_class=Formatter,
        help="the field guide's minimal DDP run, one variable at a time: is it the cluster or "
             "the code?",
        description=help_text(__doc__),
        epilog="exit codes: 0 every step passed (or skipped), 1 a step failed (the layer is "
               "named), 2 usage error, 3 could not decide (the workers did not start in time, "
               "torch missing)")
    p.add_argument("--nproc", type=_nproc, metavar="N",
                   help="local ranks (default: one per visible GPU; 2 on the CPU)")
    p.add_argument("--timeout", type=float, metavar="S",
                   help="deadline of each step in seconds (default ddp_timeout_s, 60); the "
                        "process group and DDP's broadcast get half, every other phase a quarter "
                        "(2..30 s), the workers' start-up 60 s")
    p.add_argument("--python", metavar="PATH",
                   help="the training environment's interpreter, whose torch the workers run "
                        "(default: config key python, else the one running preflight)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--debug", action="store_true",
                   help="run NCCL with NCCL_DEBUG=INFO (unless the job sets NCCL_DEBUG) and "
                        "keep each rank's output in a directory whose path is printed")
    add_config_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from preflight.core.result import ExitCode, exit_code
    from preflight.ddp import DdpUsageError, plan, render_table
    from preflight.ddp import run as run_plan

    ctx = build_context(args, {"ddp_timeout_s": args.timeout, "python": args.python})
    try:
        the_plan = plan(ctx, nproc=args.nproc, debug=args.debug)
    except DdpUsageError as exc:
        print(f"preflight ddp: {exc}", file=sys.stderr)
        return int(ExitCode.USAGE)
    tty = sys.stderr.isatty() and not args.json

    def progress(where: str) -> None:
        sys.stderr.write(f"\r\033[Kpreflight ddp: rank 0 in {where}")
        sys.stderr.flush()

    result = run_plan(ctx, the_plan, on_progress=progress if tty else None)
    if tty:
        sys.stderr.write("\r\033[K")
    if result.debug_log:
        print(f"preflight ddp: each rank's output kept in {result.debug_log}", file=sys.stderr)
    emit(as_json=args.json, data=result.to_json, text=lambda: render_table(result))
    return int(exit_code(result.status))
