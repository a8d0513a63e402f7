"""``preflight cluster``: one agent per node; every node prints the same verdict, exits the same.

Exit codes as ``check``: 0 ok, 1 a node or the network failed, 2 usage error (bad options, node 0
cannot bind the port, the nodes disagree on --nnodes / --timeout / --backend, two hosts claim one
node rank), 3 undecided (the master did not resolve or answer by the deadline, or stopped
answering; torch missing is 2).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import TYPE_CHECKING, Any

from preflight.cli import Formatter, add_config_options, build_context, emit, nproc_arg, size_arg

if TYPE_CHECKING:
    from preflight.core.result import ExitCode


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "cluster", formatter_class=Formatter,
        help="one verdict for all nodes of a job: arrival, node checks, parity, world "
             "all-reduce, which node is slow or failed",
        description="Run one agent per node (srun --ntasks-per-node=1, torchrun --nproc-per-node "
                    "1, or an init container per pod). The agents meet on a TCPStore at the "
                    "master, run the node checks, compare versions and node facts, time an "
                    "all-reduce over every GPU of every node against each node's link, and with "
                    "3 or more nodes test disjoint node pairs against each other to name the "
                    "slow or failed node(s) in at most three rounds. See: preflight docs cluster.",
        epilog="exit codes: 0 ok, 1 a node or the network failed, 2 usage error, 3 undecided "
               "(the master did not answer by the deadline)")
    p.add_argument("--nnodes", type=int, metavar="N",
                   help="nodes in the job (default NNODES / GROUP_WORLD_SIZE / SLURM_NNODES)")
    p.add_argument("--node-rank", type=int, metavar="R",
                   help="this node's rank (default NODE_RANK / GROUP_RANK / SLURM_NODEID)")
    p.add_argument("--master-addr", metavar="HOST",
                   help="node 0's address (default MASTER_ADDR, else the first host of "
                        "SLURM_JOB_NODELIST); a name that does not resolve yet is retried "
                        "until --timeout")
    p.add_argument("--master-port", type=int, metavar="P",
                   help="the store's port on node 0 (default MASTER_PORT, else 29500)")
    p.add_argument("--nproc-per-node", type=nproc_arg, metavar="G",
                   help="ranks per node, 1..64 (default: the visible GPUs with nccl, 1 with "
                        "gloo)")
    p.add_argument("--backend", choices=("nccl", "gloo"),
                   help="nccl on GPUs (default when NVML sees GPUs), gloo on CPU")
    p.add_argument("--timeout", type=float, metavar="S",
                   help="deadline of each phase in seconds, also of reaching the master "
                        "(default 60; node 0's is the one every node keeps)")
    p.add_argument("--min-busbw", type=float, metavar="GBPS",
                   help="absolute busbw floor in GB/s for the world all-reduce and the node "
                        "pairs (default: min_busbw_gbps); the pairs are also judged against "
                        "each other and, with nccl, against the nodes' links")
    p.add_argument("--size", type=size_arg, metavar="B",
                   help="all-reduce size, 4 bytes .. 64G (default 256M with nccl, 1M with gloo)")
    p.add_argument("--no-bandwidth", action="store_true",
                   help="arrival, node checks and parity only")
    p.add_argument("--ddp", action="store_true",
                   help="then the DDP ladder's step 4: the field guide's minimal DDP training "
                        "over every rank of every node, its proofs across nodes (see preflight "
                        "docs ddp)")
    p.add_argument("--expect-gpus", type=int, metavar="N",
                   help="GPUs each node must show (0 = CPU-only nodes), as in preflight check")
    p.add_argument("--engine", choices=("auto", "torch", "nccl4py"),
                   help="what the all-reduce workers run (default bench_engine, auto): nccl4py "
                        "(no torch in the workers; auto takes it when every node's workers can "
                        "import it) or torch.distributed; see preflight docs cluster")
    p.add_argument("--python", metavar="PATH",
                   help="the training environment's interpreter (fingerprint and workers)")
    p.add_argument("--json", action="store_true", help="print the JSON verdict")
    p.add_argument("--verbose", action="store_true",
                   help="print the phases on stderr (the full table is node 0's: the other "
                        "nodes get the verdict without the per-node rows)")
    add_config_options(p)
    p.set_defaults(func=run)


def _fail(message: str, code: ExitCode) -> int:
    from preflight.core.textsafe import escape

    print(f"preflight cluster: {escape(message, 2000)}", file=sys.stderr)
    return int(code)


def run(args: argparse.Namespace) -> int:
    import os

    from preflight.cluster.options import ClusterUsageError, resolve
    from preflight.cluster.store import torch_missing
    from preflight.core.result import ExitCode

    try:
        opts = resolve(nnodes=args.nnodes, node_rank=args.node_rank,
                       master_addr=args.master_addr, master_port=args.master_port,
                       timeout_s=args.timeout, env=os.environ)
    except ClusterUsageError as exc:
        return _fail(str(exc), ExitCode.USAGE)
    why = torch_missing()
    if why:
        return _fail(f"needs torch.distributed for the rendezvous ({why}); install it next to "
                     "preflight: pip install 'cluster-preflight[torch]'", ExitCode.USAGE)
    ctx = build_context(args, {"expect_gpus": args.expect_gpus, "python": args.python,
                               "bench_engine": args.engine,
                               "min_busbw_gbps": args.min_busbw, "multi_node": opts.nnodes > 1})
    return _run(args, opts, ctx)


def _run(args: argparse.Namespace, opts: Any, ctx: Any) -> int:
    from preflight.bench import visible_gpus
    from preflight.cluster.agent import RunSettings
    from preflight.core.result import ExitCode
    from preflight.ddp.world import step_deadline_s

    _, visible, nvml_error = visible_gpus(ctx)
    backend = args.backend or ("nccl" if not nvml_error and visible else "gloo")
    nproc = args.nproc_per_node or (visible if backend == "nccl" else 1)
    if backend == "nccl" and nproc > visible:
        return _fail(f"--nproc-per-node {nproc} with nccl but this node shows {visible} GPU(s)",
                     ExitCode.USAGE)
    if backend == "gloo" and ctx.config.bench_engine == "nccl4py":
        return _fail("--engine nccl4py runs NCCL on GPUs; gloo needs --engine torch (or auto)",
                     ExitCode.USAGE)
    cfg = ctx.config
    size = args.size if args.size is not None else ((256 << 20) if backend == "nccl" else
                                                    (1 << 20))
    settings = RunSettings(backend=backend, nproc=nproc, size_bytes=size,
                           min_busbw_gbps=cfg.min_busbw_gbps, bandwidth=not args.no_bandwidth,
                           bench_timeout_s=min(cfg.bench_timeout_s, 2 * opts.timeout_s),
                           python=cfg.python or sys.executable, engine=cfg.bench_engine,
                           relative_floor=cfg.cluster_relative_floor,
                           link_floor=cfg.cluster_link_floor,
                           checks_timeout_s=cfg.check_timeout_s + 5.0, ddp=args.ddp,
                           ddp_deadline_s=step_deadline_s(ctx) if args.ddp else 0.0)
    me = opts.node_rank

    def progress(text: str) -> None:
        if args.verbose:
            print(f"preflight cluster: node {me}: {text}", file=sys.stderr, flush=True)

    code = _agent(args, opts, ctx, settings, progress)
    from preflight.cluster.store import abandoned_threads

    if abandoned_threads():
        # A store call was given up on its deadline; its thread is stuck in torch's C++ store
        # and would abort the process (SIGABRT) if it returned during the interpreter's
        # shutdown: end here, with the verdict's exit code, after what the CLI would undo.
        import os

        from preflight.core import aborting

        aborting.undo_abandoned()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _agent(args: argparse.Namespace, opts: Any, ctx: Any, settings: Any,
           progress: Any) -> int:
    from preflight.cluster.agent import Agent
    from preflight.cluster.nodework import BenchRunner
    from preflight.cluster.options import ClusterUsageError
    from preflight.cluster.store import MasterLost, hostname, open_store
    from preflight.cluster.verdict import render
    from preflight.core.result import ExitCode

    me = opts.node_rank
    progress("reaching the master")
    try:
        # The deadline starts now, torch imported: 8 agents importing it at once on a loaded
        # machine take seconds of the budget before they can try.
        store = open_store(opts, ctx.resolve_host, until=time.monotonic() + opts.timeout_s)
    except ClusterUsageError as exc:
        return _fail(str(exc), ExitCode.USAGE)
    except MasterLost as exc:
        return _fail(f"node {me}: {exc}", ExitCode.UNDECIDED)
    host = hostname()
    runner = BenchRunner(ctx, opts, settings, lambda: agent.store, host=host)
    agent = Agent(opts, settings, store, runner, host=host, progress=progress)
    try:
        verdict = agent.run()
    except ClusterUsageError as exc:
        return _fail(f"node {me}: {exc}", ExitCode.USAGE)
    except MasterLost as exc:
        return _fail(f"node {me}: {exc}", ExitCode.UNDECIDED)
    except Exception as exc:  # a bug must not leave a traceback instead of a verdict
        logging.getLogger(__name__).debug("cluster agent crashed", exc_info=True)
        return _fail(f"node {me}: could not decide: {type(exc).__name__}: {exc}; rerun with "
                     "--log-level debug and report the traceback", ExitCode.UNDECIDED)
    finally:
        store.close()
    emit(as_json=args.json, data=lambda: verdict,
         text=lambda: render(verdict, full=me == 0, node_rank=me))
    return int(verdict["exit_code"])
