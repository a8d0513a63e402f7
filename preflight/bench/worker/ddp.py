"""The DDP ladder's steps (stdlib at import time; torch is imported by the worker's start-up).

Each step is the field guide's minimal DDP script (its section 6.1): a ``Linear(10, 1)`` on a
small random data set through a ``DistributedSampler`` with ``set_epoch``, ``torch.cuda.set_device``
before any tensor, the model moved to its device before ``DDP(...)``, the optimizer created
after it, ``find_unused_parameters=False``, a barrier at the end. What it does differently, so
that the run proves what it claims instead of only not crashing:

- the targets are a fixed linear function of the inputs plus noise, so the loss over the whole
  data set must go down;
- every rank starts from different parameters (its own seed), so equal digests after ``DDP(...)``
  show its broadcast, and equal digests after training show the gradient all-reduce;
- the data set yields each sample's index, so each rank reports the samples it trained on, per
  epoch (the parent tests that the shards are disjoint and cover the data set, and that the
  order changed between epochs); a second sampler never given ``set_epoch`` shows the order it
  would have repeated;
- the rank's device and the gradients of every parameter after each backward are reported.

The rank's place comes from its environment as torchrun sets it (``LOCAL_RANK``, ``RANK``,
``WORLD_SIZE``), the device is ``cuda:LOCAL_RANK`` under the job's ``CUDA_VISIBLE_DEVICES``.
Plan (``ddp`` of the worker's plan, written by :class:`preflight.bench.options.DdpOptions`):
``{"steps": [{"name", "backend" (None: no process group), "gpu"}], "store", "store_prefix",
"timeout_s", "init_s", "phase_s"}``. Each step starts when the parent says so
(:func:`.wire.go_key`); end of file on the control pipe instead stops the ladder here.

Every rank has a watchdog of its own (:class:`Watchdog`): a phase longer than its deadline plus
:data:`BACKSTOP_S` ends the process, even when the parent, whose deadlines decide first, is
stopped. Test-only faults: :data:`.wire.DDP_TEST_ENV` (docs/ddp.md).
"""

from __future__ import annotations

import datetime
import hashlib
import os
import sys
import threading
import time
from importlib import import_module
from typing import Any

from . import wire

#: The data set: this many samples per rank (so every rank runs the same number of iterations
#: whatever the world size), batches of BATCH, EPOCHS epochs.
SAMPLES_PER_RANK = 32
BATCH = 8
EPOCHS = 3
FEATURES = 10
LEARNING_RATE = 0.05
#: Seeds: the data set (the same on every rank), the sampler's shuffle (DistributedSampler's
#: default), each rank's initial parameters (MODEL_SEED + rank: different on every rank).
DATA_SEED, SAMPLER_SEED, MODEL_SEED = 1234, 0, 100
#: The test-only hang: before this iteration's forward (the third: in the second one DDP
#: rebuilds its buckets, a collective of its own, where the other ranks would wait too).
HANG_ITERATION = 2
#: Seconds the worker's own deadlines (the go, the watchdog, torch's timeout) allow beyond the
#: parent's, which always decide first.
BACKSTOP_S = 30.0


class Hooks:
    """The test-only faults of :data:`.wire.DDP_TEST_ENV` (docs/ddp.md); none on a node."""

    def __init__(self, text: str | None) -> None:
        self.no_set_epoch = False
        self.skip_step: int | None = None
        self.hang: tuple[int, str] | None = None
        for item in (text or "").split(","):
            key, _, value = item.strip().partition("=")
            if key == "no_set_epoch":
                self.no_set_epoch = True
            elif key == "skip_step" and value.strip().isdigit():
                self.skip_step = int(value)
            elif key == "hang" and "@" in value:
                rank, _, step = value.partition("@")
                if rank.strip().isdigit():
                    self.hang = (int(rank), step.strip())

    def active(self) -> list[str]:
        out = ["no_set_epoch"] if self.no_set_epoch else []
        if self.skip_step is not None:
            out.append(f"skip_step={self.skip_step}")
        if self.hang is not None:
            out.append(f"hang={self.hang[0]}@{self.hang[1]}")
        return out


class Watchdog:
    """Ends this process when one phase lasts longer than its deadline plus :data:`BACKSTOP_S`
    (the parent kills a late rank first; this covers a parent that cannot: stopped, or
    unable to read). It writes one line to the worker's log, never to the progress pipe, which
    a stopped parent no longer drains."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._until: float | None = None
        self._what = ""
        threading.Thread(target=self._watch, name="ddp-watchdog", daemon=True).start()

    def arm(self, seconds: float | None, what: str) -> None:
        with self._lock:
            self._until = None if seconds is None else time.monotonic() + seconds + BACKSTOP_S
            self._what = what

    def _watch(self) -> None:
        while True:
            time.sleep(0.5)
            with self._lock:
                late = self._until is not None and time.monotonic() > self._until
                what = self._what
            if late:
                sys.stderr.write(f"preflight ddp worker: watchdog: no progress in {what} "
                                 f"within its deadline plus {BACKSTOP_S:g} s; exiting\n")
                sys.stderr.flush()
                os._exit(4)


def imports() -> Any:
    """torch and the modules the steps use (the start-up's ``imports`` phase). ``DDP(...)``
    imports torch._dynamo on first use (2-3 s on a 2-core CPU): here it counts as import time,
    not against the deadline of the first wrap."""
    import torch
    import torch._dynamo
    import torch.distributed
    import torch.nn.parallel
    import torch.utils.data

    return torch


def _env_int(name: str) -> int:
    value = os.environ.get(name)
    if value is None or not value.strip().isdigit():
        raise RuntimeError(f"{name}={value!r}: the DDP worker needs it as torchrun sets it")
    return int(value)


def _digest(torch: Any, params: list[Any]) -> str:
    """sha256 of the parameters' bytes, in order: equal digests are bitwise-equal parameters."""
    flat = torch.cat([p.detach().reshape(-1).to("cpu") for p in params])
    return hashlib.sha256(bytes(flat.contiguous().view(torch.uint8).tolist())).hexdigest()


def _device_facts(torch: Any, device: Any) -> dict[str, Any]:
    if device.type != "cuda":
        return {"type": "cpu", "index": None, "bus_id": None, "name": None}
    p = torch.cuda.get_device_properties(device)
    return {"type": "cuda", "index": int(torch.cuda.current_device()),
            "bus_id": f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0",
            "name": str(p.name)}


class Ladder:
    """The steps of one worker's plan, in order, each on the parent's go."""

    def __init__(self, worker: Any, plan: dict[str, Any]) -> None:
        self.w, self.plan = worker, plan
        self.torch = worker.torch
        self.hooks = Hooks(os.environ.get(wire.DDP_TEST_ENV))
        self.watchdog = Watchdog()
        self.local_rank = _env_int("LOCAL_RANK")
        self.rank = _env_int("RANK")
        self.world = _env_int("WORLD_SIZE")
        self.store: Any = None
        self.phase_s = float(plan["phase_s"])
        self.init_s = float(plan["init_s"])
        #: the last step skipped destroy_process_group: exit only once every rank is done
        self.wait_release = False

    def enter(self, step: str, phase: str, iteration: int | None = None) -> None:
        self.w.enter(step, phase, iteration)
        deadline = None if phase == "ready" else self.init_s if phase in ("init", "wrap") \
            else self.phase_s
        self.watchdog.arm(deadline, f"{phase} ({step})")

    def run(self, cuda_error: BaseException | None) -> None:
        steps = list(self.plan["steps"])
        for i, step in enumerate(steps):
            name = str(step["name"])
            self.enter(name, "ready")
            try:
                self.w.control.get(wire.go_key(name), float(self.plan["timeout_s"]) + BACKSTOP_S
                                   + 60.0)
            except EOFError:
                return  # the ladder stopped before this step: nothing more to prove
            clock = wire.Clock()
            facts = self.one(name, step.get("backend"), bool(step.get("gpu")), clock,
                             cuda_error, last=i == len(steps) - 1)
            self.w.progress.send(wire.DDP_FACTS, step=name, **facts)
            self.w.progress.send(wire.STEP_DONE, step=name, times=clock.times)
        self.watchdog.arm(None, "")

    # --------------------------------------------------------------------------- one step
    def one(self, name: str, backend: str | None, gpu: bool, clock: wire.Clock,
            cuda_error: BaseException | None, *, last: bool) -> dict[str, Any]:
        torch = self.torch
        from torch.nn.parallel import DistributedDataParallel
        from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

        self.enter(name, "setup")
        if gpu and cuda_error is not None:
            raise cuda_error
        rank, world = (self.rank, self.world) if backend else (0, 1)
        if gpu:
            # Before any tensor (field guide 5.3): else implicit allocations land on cuda:0.
            torch.cuda.set_device(self.local_rank)
            device = torch.device("cuda", self.local_rank)
        else:
            device = torch.device("cpu")
        n = SAMPLES_PER_RANK * world
        g = torch.Generator().manual_seed(DATA_SEED)
        x = torch.randn(n, FEATURES, generator=g)
        w_true = torch.randn(FEATURES, 1, generator=g)
        y = x @ w_true + 0.1 * torch.randn(n, 1, generator=g)
        dataset = TensorDataset(torch.arange(n), x, y)
        sampler: Any = DistributedSampler(dataset, num_replicas=world, rank=rank,
                                          shuffle=True, drop_last=True, seed=SAMPLER_SEED)
        loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler)
        torch.manual_seed(MODEL_SEED + self.rank)
        model = torch.nn.Linear(FEATURES, 1).to(device)
        digest_init = _digest(torch, list(model.parameters()))
        # ``rank``: the job's RANK, also in the single step (where it trains alone, as rank 0
        # of a world of one).
        facts: dict[str, Any] = {"rank": self.rank, "local_rank": self.local_rank,
                                 "world_size": world,
                                 "backend": backend, "device": _device_facts(torch, device),
                                 "samples": n, "digest_init": digest_init,
                                 "test_hooks": self.hooks.active()}
        clock.lap("setup")
        dist: Any = None
        if backend:
            dist = import_module("torch.distributed")
            self.enter(name, "init")
            if self.store is None:
                from .allreduce import open_store

                self.store = open_store(dist, self.plan, rank=self.rank, world=self.world,
                                        timeout_s=self.init_s + BACKSTOP_S,
                                        progress=self.w.progress, control=self.w.control)
            timeout = datetime.timedelta(seconds=self.init_s + self.phase_s + BACKSTOP_S)
            kwargs: dict[str, Any] = {"device_id": device} if backend == "nccl" and gpu else {}
            dist.init_process_group(backend, store=dist.PrefixStore(f"ddp/{name}/", self.store),
                                    rank=rank, world_size=world, timeout=timeout, **kwargs)
            clock.lap("init")
            self.enter(name, "wrap")
            model = DistributedDataParallel(model, device_ids=[self.local_rank] if gpu else None,
                                            output_device=self.local_rank if gpu else None,
                                            find_unused_parameters=False)
            facts["digest_wrapped"] = _digest(torch, list(model.parameters()))
            facts["find_unused_parameters"] = bool(model.find_unused_parameters)
            clock.lap("wrap")
        module = model.module if dist is not None else model
        params = list(model.parameters())
        facts["parameters"] = len(params)
        facts["parameter_devices"] = sorted({str(p.device) for p in params})
        opt = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
        loss_fn = torch.nn.MSELoss()
        xa, ya = x.to(device), y.to(device)
        with torch.no_grad():
            facts["loss_before"] = float(loss_fn(module(xa), ya).item())
        skip_step = backend is not None and self.hooks.skip_step == self.rank
        hang = self.hooks.hang == (self.rank, name)
        orders: list[list[int]] = []
        used_min, iteration = len(params), 0
        for epoch in range(EPOCHS):
            if not self.hooks.no_set_epoch:
                sampler.set_epoch(epoch)
            seen: list[int] = []
            for idx, xs, ys in loader:
                self.enter(name, "forward", iteration)
                if hang and iteration == HANG_ITERATION:
                    time.sleep(3600)  # test-only: the parent's deadline names this rank
                xb, yb = xs.to(device), ys.to(device)
                opt.zero_grad()
                loss = loss_fn(model(xb), yb)
                self.enter(name, "backward", iteration)
                loss.backward()
                used_min = min(used_min, sum(1 for p in params if p.grad is not None))
                self.enter(name, "optimizer", iteration)
                if not skip_step:
                    opt.step()
                seen.extend(int(i) for i in idx.tolist())
                iteration += 1
            orders.append(seen)
        clock.lap("train")
        self.enter(name, "check")
        with torch.no_grad():
            facts["loss_after"] = float(loss_fn(module(xa), ya).item())
        facts["digest_final"] = _digest(torch, params)
        control: Any = DistributedSampler(dataset, num_replicas=world, rank=rank,
                                          shuffle=True, drop_last=True, seed=SAMPLER_SEED)
        facts.update(indices=orders, iterations=iteration, params_with_grad_min=used_min,
                     set_epoch=not self.hooks.no_set_epoch,
                     repeats_without_set_epoch=list(control) == list(control))
        clock.lap("check")
        if dist is not None:
            self.enter(name, "teardown")
            if backend == "nccl" and gpu:
                dist.barrier(device_ids=[self.local_rank])
                torch.cuda.synchronize(device)
            else:
                dist.barrier()
            if last:
                # The exit releases the communicator at once (a destroy costs 0.5 s with NCCL);
                # a peer may still finish the barrier with our data: exit on the release.
                self.wait_release = True
            else:
                dist.destroy_process_group()
            clock.lap("teardown")
        elif gpu:
            torch.cuda.synchronize(device)
        return facts
