"""Bad input to ``preflight cluster``: a clear one-line message and exit 2 (or 3), no traceback.

Run on 127.0.0.1 with a port the kernel just handed out; no root needed.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

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


def test_master_that_does_not_resolve(port: int) -> None:
    rc, line = one(["--nnodes", "2", "--node-rank", "1", "--master-addr", "no-such-host.invalid",
                    "--master-port", str(port), "--timeout", "3"])
    assert rc == 2
    assert "'no-such-host.invalid' does not resolve" in line and "--master-addr" in line


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


def test_nodes_that_disagree_on_the_node_count(port: int) -> None:
    common = ["--master-addr", "127.0.0.1", "--master-port", str(port), "--timeout", "15",
              "--no-bandwidth", "--expect-gpus", "0", "--json"]
    a = start(["--nnodes", "2", "--node-rank", "0", *common])
    b = start(["--nnodes", "3", "--node-rank", "1", *common])
    for proc in (a, b):
        rc, out, _ = finish(proc)
        v = json.loads(out)
        assert rc == 2 and v["exit_code"] == 2
        assert v["findings"][0]["message"].startswith(
            "the nodes disagree on the node count: node 0 has --nnodes 2, node 1 has 3")


def test_master_that_never_answers(port: int) -> None:
    rc, line = one(["--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1",
                    "--master-port", str(port), "--timeout", "2", "--expect-gpus", "0"])
    assert rc == 3
    assert f"the master 127.0.0.1:{port} did not accept a connection within 2 s" in line


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


def test_node_rank_claimed_twice(port: int) -> None:
    # Three nodes, of which node 2 never comes: node 0 keeps the store up for the deadline.
    common = ["--nnodes", "3", "--master-addr", "127.0.0.1", "--master-port", str(port),
              "--timeout", "10", "--no-bandwidth", "--expect-gpus", "0"]
    lead = start([*common, "--node-rank", "0"])
    first = start([*common, "--node-rank", "1", "--verbose"])
    assert first.stderr is not None
    assert "arrived" in first.stderr.readline()  # registered before the second one starts
    rc, line = one([*common, "--node-rank", "1"])
    assert rc == 2
    assert "node rank 1 is taken twice" in line and "--node-rank" in line
    assert finish(lead)[0] == 1 and finish(first)[0] == 1  # node 2 is missing


def test_nccl4py_engine_with_gloo(port: int) -> None:
    rc, line = one(["--nnodes", "1", "--node-rank", "0", "--master-addr", "127.0.0.1",
                    "--master-port", str(port), "--backend", "gloo", "--engine", "nccl4py"])
    assert rc == 2
    assert "--engine nccl4py runs NCCL on GPUs" in line and "--engine torch" in line
