"""Make real PyTorch flight recorder dumps for ``preflight explain`` (docs/explain.md).

Runs small jobs whose ranks are started here as plain processes (no torchrun: each case needs
its own world and environment), every one under a deadline:

* ``skip`` (gloo, 2 ranks, CPU or CUDA tensors): rank 1 does not call the 4th all_reduce of
  the default group; rank 0 times out (5 s) in it. gloo has no dump-on-timeout: each rank
  takes its dump itself afterwards (``_dump_fr_trace`` and ``_dump_fr_trace_json``).
* ``mismatch`` (gloo, 2 ranks): the 4th collective is an all_reduce of 16 floats on rank 0 and
  of 8 on rank 1; gloo takes a process down on that, so each rank dumps as soon as the op is
  recorded (it is issued asynchronously), then waits for it.
* ``nccl-timeout`` (NCCL, 1 rank, 1 GPU): a world of one cannot miss a peer, and two ranks on
  one GPU are refused by NCCL ("Duplicate GPU detected"), so the rank holds its own stream with
  ``torch.cuda._sleep`` (a GPU spin kernel) before an all_reduce: the collective cannot start,
  the watchdog's 5 s timeout fires and ProcessGroupNCCL writes the dump itself
  (``TORCH_NCCL_DUMP_ON_TIMEOUT=1``) at ``TORCH_FR_DUMP_TEMP_FILE``.
* ``nccl-skip`` (NCCL, 2 ranks, only with 2 GPUs): rank 1 skips the 4th all_reduce; rank 0's
  watchdog times out and both dump on timeout (rank 1 through the store's dump signal).

Usage: ``python3 scripts/device/explain_fr_worker.py --out DIR [--cases skip,mismatch]``;
each case writes ``DIR/<case>/`` with the pickled dumps (``rank_<R>``, as torch's analyser
``fr_trace`` reads them), each rank's stderr (``rank<R>.log``) and ``torch.txt`` (torch, CUDA
and NCCL versions); the JSON form of a dump taken on demand goes to ``DIR/<case>-json/``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path

CASES = ("skip", "mismatch", "nccl-timeout", "nccl-skip")
TIMEOUT_S = 5
CASE_DEADLINE_S = 90


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


def _dump(out: Path, rank: int) -> None:
    import torch  # noqa: TID251  (a job that makes dumps needs torch)

    c10d = torch._C._distributed_c10d
    # the backend-neutral names (torch >= 2.8), else ProcessGroupNCCL's own
    dump = getattr(c10d, "_dump_fr_trace", None) or c10d._dump_nccl_trace
    (out / f"rank_{rank}").write_bytes(dump())
    dump_json = (getattr(c10d, "_dump_fr_trace_json", None)
                 or getattr(c10d, "_dump_nccl_trace_json", None))
    if dump_json is not None:
        js = out.parent / f"{out.name}-json"
        js.mkdir(exist_ok=True)
        (js / f"rank_{rank}.json").write_bytes(dump_json())


def rank_main(case: str, out: Path) -> int:
    import torch  # noqa: TID251  (a job that makes dumps needs torch)
    import torch.distributed as dist  # noqa: TID251

    rank = int(os.environ["RANK"])
    cuda = case.startswith("nccl") or os.environ.get("FR_DEVICE") == "cuda"
    if cuda:
        torch.cuda.set_device(rank if case == "nccl-skip" else 0)
    dev = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    backend = "nccl" if case.startswith("nccl") else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=TIMEOUT_S),
                            device_id=dev if backend == "nccl" else None)
    t = torch.ones(4, 8, device=dev)
    try:
        for _ in range(3):
            dist.all_reduce(t)
        if cuda:
            torch.cuda.synchronize()
        if case in ("skip", "nccl-skip"):
            if rank != 1:
                dist.all_reduce(torch.ones(16, device=dev))
                if cuda:
                    torch.cuda.synchronize()
            else:
                time.sleep(TIMEOUT_S + 25 if case == "nccl-skip" else TIMEOUT_S + 3)
        elif case == "mismatch":
            # gloo aborts the receiver of too many bytes (rank 1): each rank dumps as soon as
            # its op is recorded, rank 0 issuing its op after rank 1 has dumped
            if rank == 0:
                time.sleep(8)  # a dump symbolizes its stacks: over a second each
            work = dist.all_reduce(torch.ones(16 if rank == 0 else 8, device=dev),
                                   async_op=True)
            _dump(out, rank)
            work.wait()
        elif case == "nccl-timeout":
            torch.cuda._sleep(int(40e9))  # about 20 s of GPU spin on the current stream
            dist.all_reduce(torch.ones(16, device=dev))
            time.sleep(TIMEOUT_S + 25)  # the watchdog dumps and takes the process down
    except Exception:
        traceback.print_exc()
    if backend == "gloo" and case != "mismatch":
        _dump(out, rank)
    elif case == "nccl-skip" and not (out / f"rank_{rank}").exists():
        _dump(out, rank)  # the rank that skipped: its own view, unless the watchdog's is there
    sys.stderr.flush()
    os._exit(0)


def run_case(case: str, out: Path, device: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    world = 1 if case == "nccl-timeout" else 2
    port = _free_port()
    env = dict(os.environ, WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port), FR_DEVICE=device, TORCH_FR_BUFFER_SIZE="2000",
               TORCH_NCCL_TRACE_BUFFER_SIZE="2000", TORCH_NCCL_DUMP_ON_TIMEOUT="1",
               TORCH_FR_DUMP_TEMP_FILE=str(out / "rank_"),
               TORCH_NCCL_DEBUG_INFO_TEMP_FILE=str(out / "rank_"),
               TORCH_NCCL_ASYNC_ERROR_HANDLING="3", NCCL_DEBUG="WARN",
               PYTHONUNBUFFERED="1")
    procs = []
    for r in range(world):
        log = (out / f"rank{r}.log").open("wb")
        procs.append((subprocess.Popen(
            [sys.executable, __file__, "--rank-of", case, "--out", str(out)],
            env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=log,
            stderr=subprocess.STDOUT), log))
    deadline = time.monotonic() + CASE_DEADLINE_S
    for p, log in procs:
        try:
            p.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)
        log.close()
        print(f"{case}: rank exited {p.returncode}", file=sys.stderr)
    import torch  # noqa: TID251  (a job that makes dumps needs torch)

    cuda = getattr(torch.version, "cuda", None)
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if cuda and torch.cuda.is_available(
    ) else None
    (out / "torch.txt").write_text(f"torch {torch.__version__}\ncuda {cuda}\nnccl {nccl}\n"
                                   f"case {case}, world {world}, device {device}, timeout "
                                   f"{TIMEOUT_S} s\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default="skip,mismatch")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                    help="tensors of the gloo cases")
    ap.add_argument("--rank-of", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_of:
        return rank_main(args.rank_of, Path(args.out))
    for case in args.cases.split(","):
        if case not in CASES:
            ap.error(f"unknown case {case}; cases: {', '.join(CASES)}")
        run_case(case, Path(args.out) / case, args.device)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
