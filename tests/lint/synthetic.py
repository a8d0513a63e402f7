"""Training scripts written for the tests (our own code, not the corpus): the field guide's
minimal DDP script and, for each rule, its wrong form and its right one (docs/lint.md), for the
tests of a mechanism (the CLI, the rule-word gate, ``--jobs``) that must run without the fetched
corpus."""

from __future__ import annotations

from pathlib import Path

GUIDE_MINIMAL = """
import os
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, TensorDataset, DistributedSampler
from torch.nn.parallel import DistributedDataParallel as DDP

def train(rank, world_size):
    dist.init_process_group(backend='nccl', rank=rank, world_size=world_size)
    torch.cuda.set_device(rank)
    dataset = TensorDataset(torch.randn(64, 10), torch.randn(64, 1))
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)
    model = DDP(torch.nn.Linear(10, 1).cuda(), device_ids=[rank])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.cuda(), y.cuda()

if __name__ == "__main__":
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    mp.spawn(train, args=(4,), nprocs=4)
"""

#: The minimal script without ``set_epoch``: DDP101 at line 13, column 15 (the sampler).
NO_SET_EPOCH = GUIDE_MINIMAL.replace("        sampler.set_epoch(epoch)\n", "")

_TORCHRUN = """
import os
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

def main(ds, net, wrap):
    dist.init_process_group("nccl")
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    node_rank = int(os.environ["NODE_RANK"])
    {device}
    sampler = DistributedSampler(ds, num_replicas={replicas}, rank={rank})
    loader = DataLoader(ds, batch_size=8, sampler=sampler)
    {model}
    {optimizer}
    if {is_main}:
        print("rank 0 of node", node_rank)
    for epoch in range(10):
        sampler.set_epoch(epoch)
        for batch in loader:
            model(batch.cuda())
"""

_RIGHT = {
    "device": "torch.cuda.set_device(local_rank)",
    "replicas": "dist.get_world_size()", "rank": "rank",
    "model": "model = wrap(net.cuda(), device_ids=[local_rank])",
    "optimizer": "optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)",
    "is_main": "rank == 0",
}

_WRONG = {
    "ddp102": {"replicas": "torch.cuda.device_count()", "rank": "local_rank"},
    "ddp103": {"device": "torch.cuda.set_device(rank)"},
    "ddp104": {"model": "model = wrap(net.cuda(0), device_ids=[0])"},
    "ddp105": {"is_main": 'os.environ["RANK"] == 0'},
    "ddp106": {"model": "optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)",
               "optimizer": "model = FSDP(net.cuda())"},
    "ddp107": {"device": "net = net.cuda()\n    torch.cuda.set_device(local_rank)"},
}


def _torchrun(**changes: str) -> str:
    return _TORCHRUN.format(**{**_RIGHT, **changes})


#: name -> (source, the rules it shows). Every rule wrong once, the right forms clean, and one
#: file holding no rule's words at all.
SCRIPTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "guide_minimal.py": (GUIDE_MINIMAL, ()),
    "ddp101_no_set_epoch.py": (NO_SET_EPOCH, ("DDP101",)),
    "torchrun_right.py": (_torchrun(), ()),
    **{f"{rule}_wrong.py": (_torchrun(**change), (rule.upper(),))
       for rule, change in _WRONG.items()},
    "model.py": ("import torch\n\nclass Net(torch.nn.Module):\n    pass\n", ()),
}


def write_tree(root: Path, copies: int) -> Path:
    """``copies`` folders of every script under ``root``, and one file that is not valid
    Python; ``root``."""
    for i in range(copies):
        folder = root / f"copy{i}"
        folder.mkdir(parents=True)
        for name, (src, _rules) in SCRIPTS.items():
            (folder / name).write_text(src)
    (root / "copy0" / "broken.py").write_text("import os\nos.environ['RANK'] = (\n")
    return root
