"""The nccl4py engine across nodes: its NCCL unique id goes through the cluster's store.

Real parts: torch's TCPStore on 127.0.0.1 (CPU), the cluster's Rendezvous client and GroupRelay,
the bench parent (processes, pipes, deadlines) and the worker's own argument parsing, engine
choice and stdin rendezvous. Fake: the GPU part of the worker (no NCCL on CPU): after the
rendezvous it writes the unique id it got to a file and reports a tiny measured sweep. No root.
"""

from __future__ import annotations

import datetime
import json
import os
import stat
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from preflight.bench.parent import UID_KEY, BenchOptions, RunRecord, WorldSpec, run_workers
from preflight.cluster.facts import choose_engine
from preflight.cluster.store import BASE as PREFIX
from preflight.cluster.store import GroupRelay, Rendezvous
from tests.cluster.conftest import REPO

torch_dist = pytest.importorskip("torch.distributed")

#: Stands in for the interpreter: ignores the worker script path, speaks the real wire (its
#: events, control pipe and death signal) and the real engine choice, then fakes the GPU part.
FAKE = '''
import json, os, sys, time
sys.path.insert(0, {worker!r})
import engines, wire
argv = sys.argv[2:]
plan = json.loads(argv[argv.index("--plan") + 1])
wire.die_with_parent(int(argv[argv.index("--parent-pid") + 1]))
p = wire.Progress(int(argv[argv.index("--progress-fd") + 1]))
p.send(wire.STARTED, t_main=time.time(), pid=os.getpid())
ar = plan["allreduce"]
have = {{"modules": {{"nccl": "here", "cuda.bindings": "here", "torch": "here"}}}}
engine = engines.choose("allreduce", ar["engine"], have, backend=ar["backend"])[0]
p.send(wire.ENGINE, step=wire.ALLREDUCE, engine=engine)
p.send(wire.PHASE, step=wire.ALLREDUCE, phase="init")
if ar["rank"] == 0:
    uid = os.urandom(16).hex()
    p.send(wire.PUBLISH, uid=uid)
else:
    uid = wire.Control(0).get(wire.UID, ar["timeout_s"])
with open(os.path.join(os.environ["FAKE_OUT"], "rank%d.json" % ar["rank"]), "w") as f:
    json.dump({{"uid": uid, "engine": engine, "local_rank": plan["device"],
               "world": ar["world_size"]}}, f)
size = ar["sizes"][0]
for ph in ("warmup", "measure"):
    p.send(wire.PHASE, step=wire.ALLREDUCE, phase=ph, size=size)
p.send(wire.MEASURED, size=size, time_s=0.001, iters=1)
p.send(wire.PHASE, step=wire.ALLREDUCE, phase="verify", size=size)
p.send(wire.VERIFIED, size=size, ok=True, mismatches=0, elements=size // 4)
p.send(wire.STEP_DONE, step=wire.ALLREDUCE, times={{"nccl_init": 0.01}})
p.send(wire.DONE)
'''


@pytest.fixture
def fake_python(tmp_path: Path) -> str:
    path = tmp_path / "fake-python"
    path.write_text(f"#!{sys.executable}\n"
                    + FAKE.format(worker=str(REPO / "preflight" / "bench" / "worker")))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.fixture
def store() -> Any:
    """node 0's TCPStore on 127.0.0.1, a port the OS picks."""
    server = torch_dist.TCPStore("127.0.0.1", 0, None, True,
                                 timeout=datetime.timedelta(seconds=10), wait_for_workers=False)
    yield server
    del server


def client(server: Any) -> Rendezvous:
    raw = torch_dist.TCPStore("127.0.0.1", server.port, None, False,
                              timeout=datetime.timedelta(seconds=10))
    return Rendezvous(torch_dist.PrefixStore(PREFIX, raw), hosting=False,
                      master=f"127.0.0.1:{server.port}", op_timeout_s=10.0)


def node_opts(rdv: Rendezvous, prefix: str, *, offset: int, nproc: int, world: int,
              python: str, out: Path, timeout_s: float = 20.0) -> BenchOptions:
    spec = WorldSpec(store_host="127.0.0.1", store_port=0, store_prefix=PREFIX + prefix,
                     rank_offset=offset, world_size=world, relay=GroupRelay(rdv, prefix))
    env = {**os.environ, "FAKE_OUT": str(out)}
    return BenchOptions(backend="nccl", nproc=nproc, sizes=(1 << 20,), timeout_s=timeout_s,
                        iters=1, warmup=1, env=env, python=python, engine="nccl4py", world=spec)


def gone(record: RunRecord) -> bool:
    return all(st.proc is not None and st.proc.poll() is not None for st in record.ranks)


def test_unique_id_goes_from_node_0_through_the_store_to_the_other_node(
        store: Any, fake_python: str, tmp_path: Path) -> None:
    # Node 0: global ranks 0, 1 (local 0, 1); node 1: global rank 2 (local 0). World of 3.
    prefix = f"s{os.getpid()}/g0/"
    records: dict[int, RunRecord] = {}

    def node1() -> None:
        records[1] = run_workers(node_opts(client(store), prefix, offset=2, nproc=1, world=3,
                                           python=fake_python, out=tmp_path))

    other = threading.Thread(target=node1)
    other.start()
    time.sleep(0.5)  # node 1's parent is already waiting in the store when node 0 publishes
    records[0] = run_workers(node_opts(client(store), prefix, offset=0, nproc=2, world=3,
                                       python=fake_python, out=tmp_path))
    other.join(timeout=30)
    assert not other.is_alive()
    for rec in records.values():
        assert rec.failure is None, rec.failure
        assert gone(rec)
    got = {r: json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)}
    uid = got[0]["uid"]
    assert len(uid) == 32 and all(g["uid"] == uid for g in got.values())
    assert [g["engine"] for g in got.values()] == ["nccl4py"] * 3
    # Global ranks with the local rank as the device index, as torchrun numbers them.
    assert [(r, g["local_rank"], g["world"]) for r, g in got.items()] == [
        (0, 0, 3), (1, 1, 3), (2, 0, 3)]
    # What node 0's parent published is in the cluster's store, under the group's prefix.
    assert client(store).get(prefix + UID_KEY, "uid") == uid
    assert {st.engine for rec in records.values() for st in rec.ranks} == {"nccl4py"}


def test_a_unique_id_that_never_comes_is_a_rendezvous_timeout_naming_rank_0(
        store: Any, fake_python: str, tmp_path: Path) -> None:
    # Node 0 never runs: node 1's workers must not wait past the init deadline (timeout 6 s:
    # spawn 3 s + init 3 s), and the message names what did not answer, and where.
    prefix = f"s{os.getpid()}/g1/"
    t0 = time.monotonic()
    rec = run_workers(node_opts(client(store), prefix, offset=1, nproc=1, world=2,
                                python=fake_python, out=tmp_path, timeout_s=6.0))
    took = time.monotonic() - t0
    assert rec.failure is not None and rec.failure.kind == "hung"
    assert "no NCCL unique id from global rank 0" in rec.failure.message
    assert f"{PREFIX}{prefix}" in rec.failure.message and f":{store.port}" in rec.failure.message
    assert took < 6.0 + 3.0, took
    assert gone(rec)
    assert not (tmp_path / "rank1.json").exists()


def test_nccl4py_across_nodes_without_a_relay_is_refused_before_any_worker_starts(
        fake_python: str, tmp_path: Path) -> None:
    spec = WorldSpec(store_host="127.0.0.1", store_port=1, store_prefix="x/", rank_offset=1,
                     world_size=2)
    opts = BenchOptions(backend="nccl", nproc=1, sizes=(1 << 20,), timeout_s=6.0,
                        python=fake_python, engine="nccl4py", world=spec)
    rec = run_workers(opts)
    assert rec.failure is not None and rec.failure.kind == "spawn"
    assert "--engine torch" in rec.failure.message
    assert all(st.proc is None for st in rec.ranks)


def test_group_relay_get_returns_none_at_its_deadline_then_the_value(store: Any) -> None:
    relay = GroupRelay(client(store), f"s{os.getpid()}/g2/")
    t0 = time.monotonic()
    assert relay.get("k", 0.3) is None
    assert 0.25 <= time.monotonic() - t0 < 5
    GroupRelay(client(store), f"s{os.getpid()}/g2/").set("k", "abc")
    assert relay.get("k", 0.3) == "abc"


def test_one_engine_for_every_node() -> None:
    assert choose_engine("auto", "nccl", {0: True, 1: True}) == "nccl4py"
    # One node that cannot import it (or could not be asked) puts every node on torch.
    assert choose_engine("auto", "nccl", {0: True, 1: False}) == "torch"
    assert choose_engine("auto", "nccl", {0: True, 1: None}) == "torch"
    assert choose_engine("torch", "nccl", {0: True, 1: True}) == "torch"
    assert choose_engine("nccl4py", "nccl", {0: False}) == "nccl4py"
    assert choose_engine("auto", "gloo", {0: True}) == "torch"


def test_workers_take_nccl4py_across_nodes_only_when_named() -> None:
    """auto across nodes is torch (every node must run one engine, which one node cannot
    tell); the cluster agent names the engine it chose for all."""
    spec = WorldSpec(store_host="h", store_port=1, store_prefix="x/", rank_offset=2,
                     world_size=4)
    for asked, told in (("auto", "torch"), ("nccl4py", "nccl4py"), ("torch", "torch")):
        opts = BenchOptions(backend="nccl", nproc=1, sizes=(4,), timeout_s=6.0, engine=asked,
                            world=spec)
        step = opts.step(0)
        assert (step["engine"], step["rank"], step["store"]) == (told, 2, "h:1")
