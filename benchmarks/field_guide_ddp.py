"""The field guide's minimal DDP script (its section 6.1), as a user runs it under torchrun: the
yardstick of ``preflight ddp``'s time.

Nothing of preflight: a ``Linear(10, 1)`` on 64 random samples through a ``DistributedSampler``
(shuffle, drop_last) with ``set_epoch``, ``torch.cuda.set_device`` and the model on its GPU
before ``DDP(...)``, SGD after it, three epochs of batches of 8, a barrier, the process group
destroyed. Launched by torchrun (``RANK`` / ``LOCAL_RANK`` / ``WORLD_SIZE`` from it) instead of
the script's own ``mp.spawn`` of 4 ranks with ``MASTER_PORT=29500``; NCCL on GPUs, gloo on the
CPU. Prints where its own seconds went (``# phases``) on rank 0::

    python3 -m torch.distributed.run --nproc_per_node=1 benchmarks/field_guide_ddp.py
"""

import os
import time

T0 = time.perf_counter()
import torch  # noqa: E402 - the import is one of the phases timed
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset  # noqa: E402

T_IMPORT = time.perf_counter()


def train() -> dict[str, float]:
    marks = {"import": T_IMPORT - T0}
    t = time.perf_counter()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ["LOCAL_RANK"])
    gpu = torch.cuda.is_available()
    dist.init_process_group(backend="nccl" if gpu else "gloo", init_method="env://")
    if gpu:
        torch.cuda.set_device(local)
    marks["init_process_group"] = time.perf_counter() - t
    t = time.perf_counter()
    dataset = TensorDataset(torch.randn(64, 10), torch.randn(64, 1))
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True,
                                 drop_last=True)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)
    model = torch.nn.Linear(10, 1)
    model = DDP(model.cuda(), device_ids=[local]) if gpu else DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.MSELoss()
    marks["setup_and_ddp"] = time.perf_counter() - t
    t = time.perf_counter()
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for x, y in loader:
            if gpu:
                x, y = x.cuda(), y.cuda()  # noqa: PLW2901 - as the field guide writes it
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
    dist.barrier()
    marks["train"] = time.perf_counter() - t
    t = time.perf_counter()
    dist.destroy_process_group()
    marks["destroy"] = time.perf_counter() - t
    return marks


if __name__ == "__main__":
    phases = train()
    if int(os.environ.get("RANK", "0")) == 0:
        print("# phases (s): " + ", ".join(f"{k} {v:.3f}" for k, v in phases.items()),
              flush=True)
