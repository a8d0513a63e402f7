"""``master_port`` against real sockets and a real process holding the port; bad input through
the CLI gives a clear message and the right exit code."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from preflight.checks import master_port
from preflight.core.result import Status
from tests.conftest import MakeCtx
from tests.net.conftest import REPO

HOLDER = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.bind(("0.0.0.0", 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
time.sleep(60)
"""


@pytest.fixture
def holder() -> Iterator[tuple[int, int]]:
    """A separate process listening on a port: (pid, port). Killed at teardown."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield proc.pid, port
    finally:
        proc.kill()
        proc.wait(timeout=10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_port_held_by_another_process_names_it(make_ctx: MakeCtx,
                                               holder: tuple[int, int]) -> None:
    pid, port = holder
    ctx = make_ctx(env={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0"})
    r = master_port.run(ctx)
    assert (r.status, r.reason) == (Status.FAIL, "MasterPortInUse")
    assert f"pid {pid}" in r.message
    assert "Address already in use" in r.message
    suggested = r.details["suggested_port"]
    assert isinstance(suggested, int) and suggested != port
    assert f"export MASTER_PORT={suggested}" in r.remedy
    with socket.socket(socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET) as s:
        s.bind(("", suggested))  # the suggestion really is free


def test_free_port_passes_and_is_released(make_ctx: MakeCtx) -> None:
    port = free_port()
    ctx = make_ctx(env={"MASTER_ADDR": "localhost", "MASTER_PORT": str(port)})
    r = master_port.run(ctx)
    assert (r.status, r.reason) == (Status.PASS, "MasterPortFree"), r.message
    with socket.socket() as s:  # not left bound: a plain listener gets it right after
        s.bind(("0.0.0.0", port))
        s.listen(1)


def test_other_node_skips_with_reason(make_ctx: MakeCtx) -> None:
    r = master_port.run(make_ctx(env={"MASTER_ADDR": "192.0.2.200", "MASTER_PORT": "29500",
                                      "RANK": "3"}))
    assert (r.status, r.reason) == (Status.SKIP, "NotMasterNode")
    assert "RANK=3" in r.message and "--probe-master" in r.message


def test_no_master_variables_skips(make_ctx: MakeCtx) -> None:
    assert master_port.run(make_ctx(env={})).status is Status.SKIP


def cli(env: dict[str, str], *args: str) -> tuple[int, dict[str, Any], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "preflight", "check", "--json", *args],
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO), **env},
        cwd=REPO, capture_output=True, text=True, timeout=30, check=False)
    assert "Traceback" not in proc.stderr, proc.stderr
    report = json.loads(proc.stdout) if proc.stdout.strip() else {"results": []}
    return proc.returncode, {r["check"]: r for r in report["results"]}, proc.stderr


@pytest.mark.parametrize(("env", "reason", "words"), [
    ({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "abc"}, "MasterPortInvalid", "not a number"),
    ({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "70000"}, "MasterPortInvalid", "1..65535"),
    ({"MASTER_ADDR": "no-such-node.invalid", "MASTER_PORT": "29500"}, "MasterAddrUnresolved",
     "no-such-node.invalid"),
    ({"MASTER_ADDR": "[fd00::1]", "MASTER_PORT": "29500"}, "MasterAddrInvalid", "brackets"),
    ({"MASTER_ADDR": "10.0.0.1:29500"}, "MasterAddrInvalid", "MASTER_PORT=29500"),
])
def test_bad_master_values_fail_with_exit_1(env: dict[str, str], reason: str,
                                            words: str) -> None:
    rc, res, _ = cli(env, "--only", "master_port")
    r = res["master_port"]
    assert (rc, r["status"], r["reason"]) == (1, "fail", reason)
    assert words in r["message"] and r["remedy"]


def test_a_bad_master_addr_is_reported_once_by_master_port() -> None:
    """One fault, one owner: master_port fails (scope job); network only says it could not judge
    the route."""
    rc, res, _ = cli({"MASTER_ADDR": "no-such-node.invalid"}, "--only", "network,master_port",
                     "--multi-node")
    assert rc == 1
    assert (res["master_port"]["reason"], res["master_port"]["scope"]) == \
        ("MasterAddrUnresolved", "job")
    assert res["network"]["reason"] != "MasterAddrUnresolved"
    assert "not judged" in res["network"]["message"]


def test_unknown_check_name_is_usage_error() -> None:
    rc, _, err = cli({}, "--only", "netwrk")
    assert rc == 2 and "netwrk" in err
