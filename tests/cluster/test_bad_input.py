"""``preflight cluster`` as a process on 127.0.0.1 (a port the kernel just handed out; no root):
bad options give a clear one-line message and exit 2; a master that is not there, not yet
resolvable or silent gives exit 3 by the deadline; signals end an agent at once; a restarted
follower is taken back."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.conftest import REPO, clean_env


@pytest.fixture
def port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(args: Sequence[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "preflight", "cluster", *args],
                            env=clean_env(env), cwd=REPO, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def finish(proc: subprocess.Popen[str], timeout_s: float = 60) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout_s)
    assert "Traceback" not in err, err
    return proc.returncode, out, err


def one(args: Sequence[str], env: dict[str, str] | None = None) -> tuple[int, str]:
    rc, _, err = finish(start(args, env))
    lines = [ln for ln in err.splitlines() if ln.startswith("preflight cluster:")]
    assert len(lines) == 1, err
    return rc, lines[0]


def wait_line(proc: subprocess.Popen[str], text: str, timeout_s: float = 60) -> None:
    """Read ``--verbose`` phases from stderr until one contains ``text``."""
    assert proc.stderr is not None
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        line = proc.stderr.readline()
        if text in line:
            return
        if not line:
            break
    raise AssertionError(f"never printed {text!r}")


def test_a_master_that_never_resolves_is_exit_3_at_the_deadline(port: int) -> None:
    t0 = time.monotonic()
    rc, line = one(["--nnodes", "2", "--node-rank", "1", "--master-addr", "no-such-host.invalid",
                    "--master-port", str(port), "--timeout", "3"])
    assert rc == 3  # undecided, retried: a gang's pod 0 may not be in DNS yet
    assert "'no-such-host.invalid' did not resolve by the deadline" in line
    assert "--master-addr" in line
    assert time.monotonic() - t0 > 3


@pytest.fixture
def held(port: int) -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("0.0.0.0", port))
        s.listen()
        yield port


def test_port_in_use(held: int) -> None:
    rc, line = one(["--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1",
                    "--master-port", str(held), "--timeout", "3", "--expect-gpus", "0"])
    assert rc == 2
    assert f"node 0 cannot listen on port {held}" in line
    assert "--master-port" in line


def test_a_silent_listener_is_exit_3_by_the_deadline_and_signals_end_the_wait(held: int) -> None:
    # The port accepts (the kernel completes the handshake) and nothing ever answers: a stopped
    # agent, a stale listener. TCPStore's own timeout does not cover this.
    args = ["--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port",
            str(held), "--expect-gpus", "0", "--verbose"]
    t0 = time.monotonic()
    rc, _, err = finish(start([*args, "--timeout", "3"]), 40)
    assert rc == 3, err
    assert "never answered the store's handshake" in err
    assert time.monotonic() - t0 < 3 + 20  # the deadline, plus start-up on a loaded machine
    for sig, code in ((signal.SIGTERM, -signal.SIGTERM), (signal.SIGINT, 130)):
        proc = start([*args, "--timeout", "60"])
        wait_line(proc, "reaching the master")
        time.sleep(1.0)
        t1 = time.monotonic()
        proc.send_signal(sig)
        rc, _, err = finish(proc, 30)
        assert rc == code, err
        assert time.monotonic() - t1 < 5


def test_sigterm_ends_node_0_while_it_waits_and_frees_the_port(port: int) -> None:
    proc = start(["--nnodes", "3", "--node-rank", "0", "--master-addr", "127.0.0.1",
                  "--master-port", str(port), "--timeout", "60", "--no-bandwidth",
                  "--expect-gpus", "0", "--verbose"])
    wait_line(proc, "waiting for the other nodes")
    t1 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    rc, _, _ = finish(proc, 30)
    assert rc == -signal.SIGTERM and time.monotonic() - t1 < 5
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", port))  # nothing left listening


def test_nodes_that_disagree_on_the_node_count(port: int) -> None:
    common = ["--master-addr", "127.0.0.1", "--master-port", str(port), "--timeout", "8",
              "--no-bandwidth", "--expect-gpus", "0", "--json"]
    a = start(["--nnodes", "2", "--node-rank", "0", *common])
    b = start(["--nnodes", "3", "--node-rank", "1", *common])
    rc, out, _ = finish(a)
    v = json.loads(out)
    assert rc == 2 and v["exit_code"] == 2
    assert v["findings"][0]["reason"] == "ClusterUsage"
    assert v["findings"][0]["message"].startswith("node 1 (")
    assert "has --nnodes 3" in v["findings"][0]["message"]
    rc, _, err = finish(b)
    assert rc == 2 and "node 0 has --nnodes 2" in err


def test_master_that_never_answers(port: int) -> None:
    t0 = time.monotonic()
    rc, line = one(["--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1",
                    "--master-port", str(port), "--timeout", "2", "--expect-gpus", "0"])
    assert rc == 3
    assert f"the master 127.0.0.1:{port} did not answer within 2 s" in line
    assert "nothing listens on that port: connection refused" in line  # not "accepted"
    assert time.monotonic() - t0 < 2 + 20  # the deadline, plus start-up on a loaded machine


@pytest.mark.parametrize(("args", "env", "want"), [
    ([], {}, "cannot tell --nnodes"),
    (["--nnodes", "2", "--node-rank", "2", "--master-addr", "h"], {},
     "node rank 2 is outside 0..1"),
    (["--master-addr", "h"], {"SLURM_NNODES": "two", "SLURM_NODEID": "0"},
     "SLURM_NNODES='two' is not an integer"),
    (["--nnodes", "1", "--node-rank", "0", "--master-addr", "h", "--timeout", "0"], {},
     "--timeout must be in (0, 3600]"),
])
def test_options_that_cannot_describe_a_cluster(args: list[str], env: dict[str, str],
                                                want: str) -> None:
    rc, line = one(args, env)
    assert rc == 2 and want in line


@pytest.mark.parametrize(("opt", "value", "want"), [
    ("--nproc-per-node", "100000", "expected 1..64"),
    ("--nproc-per-node", "0", "expected 1..64"),
    ("--size", "3", "expected 4 bytes .. 64G"),
    ("--size", "0", "expected 4 bytes .. 64G"),
    ("--size", "1T", "expected 4 bytes .. 64G"),
])
def test_counts_and_sizes_are_bounded_as_bench_bounds_them(opt: str, value: str,
                                                           want: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "preflight", "cluster", "--nnodes", "1",
                           "--node-rank", "0", "--master-addr", "127.0.0.1", opt, value],
                          env=clean_env(), cwd=REPO, text=True, capture_output=True, timeout=60,
                          check=False)
    assert proc.returncode == 2 and want in proc.stderr and "Traceback" not in proc.stderr


def test_without_torch(tmp_path: Path, port: int) -> None:
    # A torch that cannot be imported, first on the path: the same ImportError as no torch at all.
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'torch'\")\n")
    rc, line = one(["--nnodes", "1", "--node-rank", "0", "--master-addr", "127.0.0.1",
                    "--master-port", str(port)],
                   {"PYTHONPATH": f"{tmp_path}:{REPO}"})
    assert rc == 2
    assert "needs torch.distributed" in line and "pip install" in line


def test_a_follower_restarted_after_it_arrived_is_taken_back(port: int) -> None:
    # Node 2 comes late, so node 0 still waits for arrivals when node 1 restarts (an init
    # container restarted, torchrun --max-restarts): the new agent replaces the old one.
    common = ["--nnodes", "3", "--master-addr", "127.0.0.1", "--master-port", str(port),
              "--timeout", "30", "--no-bandwidth", "--expect-gpus", "0", "--json"]
    lead = start([*common, "--node-rank", "0"])
    first = start([*common, "--node-rank", "1", "--verbose"])
    wait_line(first, "arrived")
    first.kill()
    first.wait(10)
    again = start([*common, "--node-rank", "1"])
    time.sleep(1.0)
    last = start([*common, "--node-rank", "2"])
    results = [finish(p, 90) for p in (lead, again, last)]
    assert [rc for rc, _, _ in results] == [0, 0, 0], [err for _, _, err in results]
    v = json.loads(results[0][1])
    assert v["restarted_nodes"] == [1] and v["missing_nodes"] == []
    assert v["status"] in ("pass", "warn")


def test_a_second_live_agent_for_a_node_rank_takes_over_and_the_first_is_told(port: int) -> None:
    common = ["--nnodes", "3", "--master-addr", "127.0.0.1", "--master-port", str(port),
              "--timeout", "10", "--no-bandwidth", "--expect-gpus", "0"]
    lead = start([*common, "--node-rank", "0"])
    first = start([*common, "--node-rank", "1", "--verbose"])
    wait_line(first, "arrived")
    second = start([*common, "--node-rank", "1"])
    rc, _, err = finish(first)
    assert rc == 2 and "node rank 1 was taken over by a newer agent" in err
    assert finish(lead)[0] == 1 and finish(second)[0] == 1  # node 2 never came: missing


def test_nccl4py_engine_with_gloo(port: int) -> None:
    rc, line = one(["--nnodes", "1", "--node-rank", "0", "--master-addr", "127.0.0.1",
                    "--master-port", str(port), "--backend", "gloo", "--engine", "nccl4py"])
    assert rc == 2
    assert "--engine nccl4py runs NCCL on GPUs" in line and "--engine torch" in line





def test_sigterm_during_the_all_reduce_ends_the_agent_and_its_workers(port: int) -> None:
    psutil = pytest.importorskip("psutil")
    common = ["--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", str(port),
              "--timeout", "30", "--expect-gpus", "0", "--verbose"]
    lead = start([*common, "--node-rank", "0"])
    other = start([*common, "--node-rank", "1"])
    wait_line(other, "all-reduce world", 120)
    workers: list[Any] = []
    for _ in range(200):
        workers = psutil.Process(other.pid).children(recursive=True)
        if workers:
            break
        time.sleep(0.05)
    assert workers, "node 1 started no worker"
    lead_workers = psutil.Process(lead.pid).children(recursive=True)
    for proc, kids in ((other, workers), (lead, lead_workers)):  # a follower, then node 0
        t1 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc, _, _ = finish(proc, 30)
        assert rc in (-signal.SIGTERM, 128 + signal.SIGTERM) and time.monotonic() - t1 < 5
        for w in kids:
            with contextlib.suppress(psutil.NoSuchProcess):
                assert w.status() == psutil.STATUS_ZOMBIE or not w.is_running(), w
