"""A plain torch.distributed all-reduce loop, for the side-by-side with ``preflight bench``.

The same sizes (1 MiB doubling to 1 GiB by default), the same float32 data type, the same method as
nccl-tests (nccl.md section 1): warm-up of each size, then a host clock around ``--iters``
back-to-back all-reduces and one device sync; busbw = size / time x 2(n-1)/n, GB/s = 1e9 B/s.
Nothing else: no deadlines, no subprocess orchestration, no data check, so any gap between the two
is the price of preflight's machinery (the target: preflight >= 0.98 x this at 1 GiB).

Run under torchrun::

    NCCL_NVLS_ENABLE=0 torchrun --nproc-per-node 2 benchmarks/plain_allreduce.py

or alone (spawns one process per visible GPU, or ``--nproc`` gloo ranks on CPU)::

    NCCL_NVLS_ENABLE=0 python3 benchmarks/plain_allreduce.py [--max-bytes 1G] [--iters 20]
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    return int(text[:-1]) * units[text[-1]] if text[-1:] in units else int(text)


def sizes(lo: int, hi: int) -> list[int]:
    out, s = [], lo
    while s < hi:
        out.append(s)
        s *= 2
    return [*out, hi]


def bench(rank: int, world: int, args: argparse.Namespace) -> None:
    backend = "nccl" if torch.cuda.is_available() and args.backend != "gloo" else "gloo"
    local = int(os.environ.get("LOCAL_RANK", rank))
    device = torch.device("cuda", local) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120),
                            **({"device_id": device} if backend == "nccl" else {}))

    def sync() -> None:
        if backend == "nccl":
            torch.cuda.synchronize(device)

    buf = torch.ones(args.max_bytes // 4, dtype=torch.float32, device=device)
    if rank == 0:
        print(f"# plain torch.distributed all_reduce: {backend}, {world} ranks, "
              f"torch {torch.__version__}"
              + (f", NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}"
                 if backend == "nccl" else ""))
        print(f"# {'size':>12} {'count':>12} {'type':>6} {'time':>10} {'algbw':>8} {'busbw':>8}")
        print(f"# {'(B)':>12} {'(elements)':>12} {'':>6} {'(us)':>10} {'(GB/s)':>8} {'(GB/s)':>8}")
    for size in sizes(args.min_bytes, args.max_bytes):
        t = buf[: size // 4]
        for _ in range(args.warmup):
            dist.all_reduce(t)
        sync()
        dist.barrier()
        sync()
        start = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(t)
        sync()
        elapsed = (time.perf_counter() - start) / args.iters
        # nccl-tests -a 1: the time averaged over ranks.
        avg = torch.tensor([elapsed], dtype=torch.float64, device=device)
        dist.all_reduce(avg)
        elapsed = avg.item() / world
        algbw = size / elapsed / 1e9
        busbw = algbw * 2 * (world - 1) / world
        if rank == 0:
            print(f"  {size:>12} {size // 4:>12} {'float':>6} {elapsed * 1e6:>10.1f} "
                  f"{algbw:>8.2f} {busbw:>8.2f}", flush=True)
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--min-bytes", type=parse_size, default=1 << 20)
    p.add_argument("--max-bytes", type=parse_size, default=1 << 30)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--backend", choices=("nccl", "gloo"), default=None)
    p.add_argument("--nproc", type=int, default=None, help="ranks when not under torchrun")
    args = p.parse_args()
    if "RANK" in os.environ:  # torchrun
        bench(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
        return
    world = args.nproc or (torch.cuda.device_count() if torch.cuda.is_available() else 2)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    mp.spawn(bench, args=(world, args), nprocs=world, join=True)


if __name__ == "__main__":
    main()
