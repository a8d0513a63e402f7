"""``preflight bench``: the timed all-reduce sweep alone, an nccl-tests-like table or JSON.

Exit codes as every one-shot command: 0 PASS/SKIP/WARN, 1 FAIL (slow, stalled rank, wrong sum),
2 usage error, 3 could not decide (a worker died, torch missing, the run timed out).
"""

from __future__ import annotations

import argparse
import sys

from preflight.cli import Formatter, add_config_options, build_context, emit, nproc_arg, size_arg
from preflight.core.textsafe import escape


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "bench", formatter_class=Formatter,
        help="timed all-reduce over the local GPUs (gloo on CPU without NVML), nccl-tests style",
        description="Timed all-reduce sweep as nccl-tests all_reduce_perf measures it: warm-up "
                    "per size, back-to-back timed iterations, algbw and busbw in GB/s (1e9 B/s), "
                    "an exact check of the sum. Judged at the largest size against --min-busbw "
                    "or the built-in table per GPU model and count. Never hangs: each phase has "
                    "a deadline and a stalled rank is named.",
        epilog="exit codes: 0 pass/skip/warn, 1 fail (slow, stalled, wrong sum), 2 usage error, "
               "3 could not decide (a worker died, the run timed out)")
    p.add_argument("--backend", choices=("nccl", "gloo"),
                   help="nccl on GPUs (default when NVML works: with fewer than 2 GPUs visible the "
                        "test SKIPs), gloo on CPU (default without NVML)")
    p.add_argument("--nproc", type=nproc_arg, metavar="N",
                   help="ranks (default: one per visible GPU with nccl, 2 with gloo)")
    p.add_argument("--min-bytes", type=size_arg, metavar="B",
                   help="smallest size, bytes or 1024-based K/M/G (default bench_min_bytes, 1M)")
    p.add_argument("--max-bytes", type=size_arg, metavar="B",
                   help="largest size (default bench_max_bytes, 1G, lowered to what GPU memory "
                        "allows; 64M with gloo)")
    p.add_argument("--min-busbw", type=float, metavar="GBPS",
                   help="busbw floor in GB/s at the largest size (default: min_busbw_gbps, else "
                        "the built-in table: FAIL below 0.9 x expected)")
    p.add_argument("--timeout", type=float, metavar="S",
                   help="deadline of the whole run in seconds (default bench_timeout_s, 120; "
                        "with --gpu gpu_speed_timeout_s, 30)")
    p.add_argument("--python", metavar="PATH",
                   help="interpreter whose torch/NCCL the workers use: the training environment, "
                        "of which they import nothing but their engines; the JSON's environment "
                        "says what they loaded, from where (default: config key python, else the "
                        "one running preflight)")
    p.add_argument("--engine", choices=("auto", "torch", "nccl4py"),
                   help="what the workers run (default bench_engine, auto): nccl4py (NVIDIA's "
                        "NCCL bindings, no torch: the fast path) when the interpreter has it, "
                        "else torch; torch tests the training environment's own torch")
    p.add_argument("--gpu", action="store_true",
                   help="instead of the all-reduce: per-GPU device copy, pinned host<->device "
                        "copies and bf16 matrix multiply against each GPU's limits and the node "
                        "median (the gpu_speed check; GPUs in use are measured too, with a note; "
                        "preflight docs gpu-speed)")
    p.add_argument("--gpu-engine", choices=("auto", "cuda", "torch", "cpu"),
                   help="with --gpu: worker engine (default gpu_speed_engine, auto: cuda-bindings"
                        " + cuBLAS, else torch; cpu is a plumbing test)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--debug", action="store_true",
                   help="keep the workers' output in a directory (path printed); for the "
                        "all-reduce, run them with NCCL_DEBUG=INFO and summarise what NCCL chose")
    add_config_options(p)
    p.set_defaults(func=run)


def run_gpu(args: argparse.Namespace) -> int:
    from preflight.core.result import exit_code
    from preflight.gpuspeed import render_table, run_speed

    ctx = build_context(args, {"gpu_speed_timeout_s": args.timeout, "python": args.python,
                               "gpu_speed_engine": args.gpu_engine})
    verdict = run_speed(ctx, include_busy=True, debug=args.debug)
    kept = verdict.extra.get("debug_log")
    if kept:
        print(f"preflight bench: worker output kept in {kept}", file=sys.stderr)
    emit(as_json=args.json, data=verdict.to_json, text=lambda: render_table(verdict))
    return int(exit_code(verdict.status))


def run(args: argparse.Namespace) -> int:
    if args.gpu:
        return run_gpu(args)
    from preflight.bench import BenchUsageError, plan, run_bench
    from preflight.bench.verdict import render_table
    from preflight.core.result import ExitCode, exit_code

    ctx = build_context(args, {"min_busbw_gbps": args.min_busbw,
                               "bench_timeout_s": args.timeout, "python": args.python,
                               "bench_engine": args.engine})
    try:
        the_plan = plan(ctx, backend=args.backend, nproc=args.nproc, min_bytes=args.min_bytes,
                        max_bytes=args.max_bytes, debug=args.debug,
                        engine=ctx.config.bench_engine)
    except BenchUsageError as exc:
        print(f"preflight bench: {escape(str(exc), 600)}", file=sys.stderr)
        return int(ExitCode.USAGE)
    tty = sys.stderr.isatty() and not args.json

    def progress(where: str) -> None:
        sys.stderr.write(f"\r\033[Kpreflight bench: {where}")
        sys.stderr.flush()

    source = "--min-busbw" if args.min_busbw is not None else "min_busbw_gbps (config)"
    result = run_bench(ctx, the_plan, min_busbw_gbps=ctx.config.min_busbw_gbps,
                       floor_source=source, on_progress=progress if tty else None)
    if tty:
        sys.stderr.write("\r\033[K")
    if result.debug_log:
        print(f"preflight bench: worker output (NCCL_DEBUG=INFO) kept in {result.debug_log}",
              file=sys.stderr)
    emit(as_json=args.json, data=result.to_json, text=lambda: render_table(result))
    return int(exit_code(result.status))
