"""The rules of ``preflight lint``: ids, one-line summaries and the fix, for every output form.

A finding is ``sure`` (the mistake is visible in the file) or ``not sure`` (the file shows most
of it, but a part the rule needs lives elsewhere, such as the epoch loop in another module);
docs/lint.md says for each rule when it says which, and when it stays quiet.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Severity(str, Enum):
    """``error``: the mistake is visible in the file. ``warning``: not sure (part of it is not)."""

    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True, slots=True)
class Rule:
    id: str
    name: str
    summary: str
    fix: str


RULES: tuple[Rule, ...] = (
    Rule("DDP101", "sampler-set-epoch-missing",
         "DistributedSampler shuffles, its loader is iterated over several epochs, and "
         "set_epoch is never called on it: every epoch sees the same order",
         "call sampler.set_epoch(epoch) at the start of every epoch, before iterating the "
         "loader, with the same epoch on every rank"),
    Rule("DDP102", "sampler-local-rank",
         "DistributedSampler sharded by the local rank (or the GPUs of one node): on several "
         "nodes the shards of different nodes overlap",
         "pass the global rank and world size (rank=dist.get_rank(), "
         "num_replicas=dist.get_world_size()), or leave both out"),
    Rule("DDP103", "device-from-global-rank",
         "CUDA device chosen by the global rank: on the second node the index is past the "
         "node's GPUs (invalid device ordinal)",
         "choose the device by the local rank: local_rank = int(os.environ['LOCAL_RANK']); "
         "torch.cuda.set_device(local_rank)"),
    Rule("DDP104", "hard-coded-cuda-0",
         "cuda:0 hard-coded in code every rank runs: all ranks use (or load onto) GPU 0",
         "derive the device from the local rank: device = torch.device('cuda', local_rank)"),
    Rule("DDP105", "env-rank-compared-with-int",
         "a rank or world size read from os.environ is a str; compared with an int it never "
         "matches, so `if rank == 0` never runs",
         "convert it once where it is read: rank = int(os.environ['RANK'])"),
    Rule("DDP106", "fsdp-optimizer-before-wrap",
         "FSDP: the optimizer was built from the model's parameters before the model was "
         "wrapped; it updates the unsharded originals, not the parameters FSDP trains",
         "build the optimizer after FSDP(model) / fully_shard(model), from the wrapped "
         "model's parameters"),
    Rule("DDP107", "set-device-too-late",
         "torch.cuda.set_device is called only after CUDA tensors or modules were created on "
         "the default device (GPU 0)",
         "call torch.cuda.set_device(local_rank) first, before any .cuda() or CUDA tensor"),
)

RULES_BY_ID: dict[str, Rule] = {rule.id: rule for rule in RULES}

__all__ = ["RULES", "RULES_BY_ID", "Rule", "Severity"]
