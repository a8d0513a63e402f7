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

#: Stands in for the interpreter: ignores the worker script path, runs the real worker's
#: parser, engine choice and rendezvous, then fakes the GPU part.
FAKE = '''
import json, os, sys, time
sys.path.insert(0, {bench!r})
import worker as w
args = w._parse(sys.argv[2:])
w._die_with_parent(args.parent_pid)
p = w.Progress(args.progress_fd, args.rank)
p.send("started", t_main=time.time())
engine = w._pick_engine(args)
index = args.rank if args.local_rank is None else args.local_rank
p.send("spawned", pid=os.getpid(), engine=engine, device="cuda:%d" % index)
p.send("phase", phase="init")
if args.rank == 0:
    uid = os.urandom(16).hex()
    p.send("uid", uid=uid)
else:
    uid = w._read_rendezvous("uid", args.timeout_s)
with open(os.path.join(os.environ["FAKE_OUT"], "rank%d.json" % args.rank), "w") as f:
    json.dump({{"uid": uid, "engine": engine, "local_rank": index,
               "world": args.world_size}}, f)
p.send("phase", phase="init", done=True)
size = int(args.sizes)
for ph in ("warmup", "measure"):
    p.send("phase", phase=ph, size=size)
p.send("measured", size=size, time_s=0.001, iters=1)
p.send("phase", phase="verify", size=size)
p.send("verified", size=size, ok=True, mismatches=0, elements=size // 4)
p.send("done", phase_times={{"imports": 0.01}})
'''


@pytest.fixture
def fake_python(tmp_path: Path) -> str:
    path = tmp_path / "fake-python"
    path.write_text(f"#!{sys.executable}\n"
                    + FAKE.format(bench=str(REPO / "preflight" / "bench")))
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


def test_worker_takes_nccl4py_across_nodes_only_when_named(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sys.path.insert(0, str(REPO / "preflight" / "bench"))
    try:
        import worker  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    base = ["--rank", "2", "--world-size", "4", "--backend", "nccl", "--sizes", "4",
            "--progress-fd", "1", "--local-rank", "0", "--store", "h:1"]
    assert worker._pick_engine(worker._parse(base)) == "torch"
    assert worker._pick_engine(worker._parse([*base, "--engine", "nccl4py"])) == "nccl4py"
