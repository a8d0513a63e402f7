"""Each rule on the field guide's wrong and right forms (the snippets of docs/lint.md)."""

from __future__ import annotations

import textwrap

import pytest

from preflight.lint import Severity, lint_source, noqa_codes
from tests.lint.synthetic import GUIDE_MINIMAL, NO_SET_EPOCH, SCRIPTS


def rules(src: str) -> list[tuple[int, str, str]]:
    return [(f.line, f.rule, f.severity.value)
            for f in lint_source(textwrap.dedent(src), "train.py")]


def test_the_field_guides_minimal_script_is_clean() -> None:
    assert rules(GUIDE_MINIMAL) == []


def test_ddp101_without_set_epoch() -> None:
    assert rules(NO_SET_EPOCH) == [(13, "DDP101", "error")]


def test_the_scripts_other_tests_lint_show_their_rules_and_no_other() -> None:
    """The synthetic scripts of the CLI and ``--jobs`` tests: each rule wrong once, sure."""
    for name, (src, expected) in SCRIPTS.items():
        assert [(r, sev) for _line, r, sev in rules(src)] == [(r, "error") for r in expected], \
            name
    assert {r for _src, expected in SCRIPTS.values() for r in expected} == \
        {f"DDP10{i}" for i in range(1, 8)}


def test_ddp101_shuffle_false_and_eval_loaders_are_quiet() -> None:
    src = NO_SET_EPOCH
    assert rules(src.replace("shuffle=True", "shuffle=False")) == []
    assert rules(src.replace("sampler", "val_sampler")) == []


def test_ddp101_alias_and_helper_followed() -> None:
    assert rules("""
        from torch.utils.data import DataLoader, RandomSampler, DistributedSampler
        def train(loader):
            for epoch in range(10):
                for batch in loader:
                    step(batch)
        def main(args):
            sampler_cls = RandomSampler if args.local_rank == -1 else DistributedSampler
            loader = DataLoader(ds, sampler=sampler_cls(ds), batch_size=4)
            train(loader)
        """) == [(9, "DDP101", "error")]


def test_ddp101_epoch_loop_elsewhere_is_not_sure() -> None:
    found = rules("""
        from torch.utils.data import DataLoader, DistributedSampler
        from engine import train_one_epoch
        sampler = DistributedSampler(ds)
        loader = DataLoader(ds, sampler=sampler)
        for epoch in range(10):
            train_one_epoch(model, loader)
        """)
    assert found == [(4, "DDP101", "warning")]


def test_ddp102_local_rank_sampler() -> None:
    wrong = """
        import os, torch
        from torch.utils.data.distributed import DistributedSampler
        local_rank = int(os.environ["LOCAL_RANK"])
        node_rank = int(os.environ["NODE_RANK"])
        sampler = DistributedSampler(ds, num_replicas=torch.cuda.device_count(), rank=local_rank)
        """
    assert rules(wrong) == [(6, "DDP102", "error")]
    right = wrong.replace("num_replicas=torch.cuda.device_count(), rank=local_rank",
                          "num_replicas=int(os.environ['WORLD_SIZE']), "
                          "rank=int(os.environ['RANK'])")
    assert rules(right) == []
    # Nothing says how many nodes: not sure. A loopback MASTER_ADDR pins one node: quiet.
    unsure = wrong.replace('node_rank = int(os.environ["NODE_RANK"])', "")
    assert rules(unsure) == [(6, "DDP102", "warning")]
    single = textwrap.dedent(unsure).rstrip() + '\nos.environ["MASTER_ADDR"] = "localhost"\n'
    assert rules(single) == []


def test_ddp103_global_rank_device() -> None:
    assert rules("""
        import os, torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        rank = int(os.environ["RANK"])
        torch.cuda.set_device(rank)
        model = DDP(model, device_ids=[dist.get_rank()])
        device = torch.device(f"cuda:{rank}")
        """) == [(6, "DDP103", "error"), (7, "DDP103", "error"), (8, "DDP103", "error")]
    assert rules("""
        import os, torch
        import torch.distributed as dist
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        device = dist.get_rank() % torch.cuda.device_count()
        torch.cuda.set_device(device)
        """) == []


def test_ddp104_hard_coded_gpu0() -> None:
    assert rules("""
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("nccl")
        model = DDP(model.cuda(0), device_ids=[0])
        state = torch.load(path, map_location="cuda:0")
        if dist.get_rank() == 0:
            probe = torch.zeros(3, device="cuda:0")
        """) == [(6, "DDP104", "error"), (7, "DDP104", "error")]
    # A single-GPU script, or one that pins CUDA_VISIBLE_DEVICES per rank, is right.
    assert rules("import torch\nmodel = model.cuda(0)\n") == []


def test_ddp105_env_string_compared_with_int() -> None:
    assert rules("""
        import os
        rank = os.environ["RANK"]
        if rank == 0:
            save()
        if os.environ.get("LOCAL_RANK", 0) in [-1, 0]:
            log()
        if int(os.environ["RANK"]) == 0:
            save()
        if os.environ["RANK"] == "0":
            save()
        """) == [(4, "DDP105", "error"), (6, "DDP105", "error")]


def test_ddp106_fsdp_optimizer_before_wrap() -> None:
    wrong = """
        import torch
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        def main():
            model = Net()
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
            model = FSDP(model)
        """
    assert rules(wrong) == [(6, "DDP106", "error")]
    assert rules("""
        import torch
        from torch.distributed.fsdp import fully_shard
        model = Net()
        fully_shard(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        """) == []
    # DDP keeps the same Parameter objects: an optimizer built before DDP(model) is fine.
    assert rules(wrong.replace("from torch.distributed.fsdp import FullyShardedDataParallel "
                               "as FSDP", "from torch.nn.parallel import "
                               "DistributedDataParallel as FSDP")) == []


def test_ddp107_set_device_after_cuda_allocations() -> None:
    assert rules("""
        import os, torch
        local_rank = int(os.environ["LOCAL_RANK"])
        model = Net().cuda()
        torch.cuda.set_device(local_rank)
        """) == [(5, "DDP107", "error")]
    assert rules("""
        import os, torch
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        model = Net().cuda()
        """) == []


@pytest.mark.parametrize(("comment", "silenced"), [
    ("# noqa: DDP105", True), ("# noqa", True), ("# NOQA:DDP105,DDP101", True),
    ("# noqa: DDP1", True), ("# noqa: DDP101", False), ("# no qa", False)])
def test_noqa(comment: str, silenced: bool) -> None:
    src = f"import os\nrank = os.environ['RANK']\nif rank == 0:  {comment}\n    save()\n"
    assert (rules(src) == []) is silenced


def test_noqa_codes_parsing() -> None:
    assert noqa_codes("x = 1") is None
    assert noqa_codes("x = 1  # noqa") == frozenset()
    assert noqa_codes("x  # noqa: DDP101, DDP104") == {"DDP101", "DDP104"}


def test_sure_only_drops_not_sure_findings() -> None:
    src = textwrap.dedent("""
        from torch.utils.data.distributed import DistributedSampler
        sampler = DistributedSampler(ds, rank=args.local_rank)
        """)
    assert [f.severity for f in lint_source(src)] == [Severity.WARNING]
    assert lint_source(src, sure_only=True) == []


def test_ddp101_loader_kept_by_a_trainer_class_of_the_file() -> None:
    src = """
    import torch
    from torch.utils.data import DataLoader, DistributedSampler

    class Trainer:
        def __init__(self, model, train_loader):
            self.model = model
            self.train_loader = train_loader

        def _epoch(self):
            for batch in self.train_loader:
                self.model(batch)

        def fit(self, epochs):
            for epoch in range(epochs):
                self._epoch()

    def loaders(ds):
        train_loader = DataLoader(ds, sampler=DistributedSampler(ds))
        return train_loader

    def main(ds, model):
        loader = loaders(ds)
        Trainer(model, loader).fit(10)
    """
    assert rules(src) == [(19, "DDP101", "error")]
    fixed = src.replace("def _epoch(self):\n",
                        "def _epoch(self):\n            self.train_loader.sampler.set_epoch(0)\n")
    assert rules(fixed) == []


def test_ddp105_through_a_property() -> None:
    src = """
    import os

    class Coordinator:
        def __init__(self):
            self._local_rank = os.environ.get("LOCAL_RANK", -1)

        @property
        def local_rank(self):
            return self._local_rank

        def is_node_master(self):
            return self.local_rank == 0
    """
    assert rules(src) == [(13, "DDP105", "error")]
    assert rules(src.replace('os.environ.get("LOCAL_RANK", -1)',
                             'int(os.environ.get("LOCAL_RANK", -1))')) == []


def test_ddp102_quiet_when_the_script_fixes_its_gpus() -> None:
    src = """
    import os
    import torch.distributed as dist
    from torch.utils.data import DistributedSampler
    os.environ["CUDA_VISIBLE_DEVICES"] = {value}
    dist.init_process_group("nccl")
    sampler = DistributedSampler(ds, num_replicas=2, rank=args.local_rank)
    """
    assert rules(src.format(value='"0,1"')) == []
    assert rules(src.format(value="args.gpus")) == [(7, "DDP102", "warning")]
