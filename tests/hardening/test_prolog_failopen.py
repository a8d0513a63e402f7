"""The real ``preflight prolog`` never drains a node for preflight's own trouble (issue #11).

scontrol is a recording stand-in (its argv to a file; the fixture is in tests/conftest.py); the
prolog is the real CLI in a subprocess."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from preflight.core.slurm import SlurmClient
from tests import topologies
from tests.helpers import REPO, run_cli, write_fixture
from tests.slurmfakes import fake_slurm

SKIP = "network,master_port,versions"


def _prolog(tmp_path: Path, fake: Path, *args: str, env: dict[str, str] | None = None,
            ) -> tuple[int, str]:
    fixture = write_fixture(tmp_path / "nvml.json", topologies.healthy_8x_h100())
    proc = run_cli(["prolog", "--scontrol", str(fake), "--skip", SKIP, *args], fixture=fixture,
                   env={"SLURMD_NODENAME": "gpu017", **(env or {})})
    assert "Traceback" not in proc.stderr
    return proc.returncode, proc.stderr


def _bad_utf8(tmp_path: Path) -> list[str]:
    cfg = tmp_path / "p.yaml"
    cfg.write_bytes(b"expect_gpus: 8\n# \xff\xfe\n")
    return ["--config", str(cfg)]


CASES = {
    "non-utf8-config": (_bad_utf8, {}, "not UTF-8"),
    "log-level-garbage": (lambda d: [], {"PREFLIGHT_LOG_LEVEL": "garbage"}, None),
    "check-timeout-inf": (lambda d: [], {"PREFLIGHT_CHECK_TIMEOUT_S": "inf"}, "check_timeout_s"),
    "root-missing": (lambda d: ["--root", str(d / "no-such-root")], {}, "is not a directory"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_own_trouble_lets_the_job_run(tmp_path: Path, scontrol: tuple[Path, Path],
                                      case: str) -> None:
    fake, calls = scontrol
    make_args, env, words = CASES[case]
    rc, err = _prolog(tmp_path, fake, *make_args(tmp_path), env=env)
    assert rc == 0, err
    assert not calls.exists(), calls.read_text()
    if words is not None:
        assert "preflight prolog: configuration error" in err and words in err
    else:
        assert "PREFLIGHT_LOG_LEVEL=garbage is not one of" in err


def test_fail_closed_drains_on_a_config_error(tmp_path: Path) -> None:
    slurm = fake_slurm(tmp_path / "slurm", {"gpu017": ("IDLE", ""), "gpu018": ("IDLE", "")})
    rc, err = _prolog(tmp_path, slurm.scontrol, "--fail-closed", "--root", str(tmp_path / "nope"),
                      "--sinfo", str(slurm.sinfo))
    assert rc == 1 and "is not a directory" in err
    assert slurm.node("gpu017")["reason"] == "preflight: configuration error"


def test_root_symlink_is_resolved_inside_the_root(tmp_path: Path) -> None:
    """A host whose /dev/shm is a symlink to /run/shm, mounted at --root: the link's absolute
    target is read inside the root (where it is missing here), not in this machine's /run."""
    root = tmp_path / "host"
    (root / "dev").mkdir(parents=True)
    os.symlink("/run/shm", root / "dev" / "shm")
    proc = run_cli(["check", "--only", "shm", "--root", str(root), "--json"],
                   fixture=write_fixture(tmp_path / "n.json", topologies.healthy_8x_h100()))
    assert str(root / "run" / "shm") in proc.stdout
    assert '"/run/shm"' not in proc.stdout
    assert proc.returncode == 1  # missing on the host: a FAIL about the host, not a false PASS
    (root / "run" / "shm").mkdir(parents=True)
    proc = run_cli(["check", "--only", "shm", "--root", str(root), "--json"],
                   fixture=write_fixture(tmp_path / "n.json", topologies.healthy_8x_h100()))
    assert str(root / "run" / "shm") in proc.stdout


def test_control_characters_from_the_environment_cannot_forge_log_lines(
        tmp_path: Path, scontrol: tuple[Path, Path]) -> None:
    fake, _ = scontrol
    _, err = _prolog(tmp_path, fake, env={
        "CUDA_VISIBLE_DEVICES": "0,0\npreflight prolog: PASS all good\x1b[2J"})
    assert "cuda_devices" in err
    assert "\x1b" not in err
    for line in err.splitlines():
        assert line.startswith("preflight prolog: ")
        assert not line.startswith("preflight prolog: PASS")
    assert "\\npreflight prolog: PASS all good\\e[2J" in err


def test_table_escapes_control_characters(tmp_path: Path) -> None:
    proc = run_cli(["check", "--only", "cuda_devices"],
                   fixture=write_fixture(tmp_path / "n.json", topologies.healthy_8x_h100()),
                   env={"CUDA_VISIBLE_DEVICES": "0,0\x1b]0;pwned\x07\nFAKE"})
    assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout
    assert "\\e]0;pwned\\x07\\nFAKE" in proc.stdout


def test_a_hanging_scontrol_is_killed_with_its_process_group(tmp_path: Path) -> None:
    """A site's scontrol wrapper that hangs and has started a child: both are gone after the
    deadline, and the prolog says what did not answer."""
    marker = f"300.{os.getpid()}{time.monotonic_ns()}"  # a unique sleep time marks the child
    hang = tmp_path / "scontrol"
    hang.write_text(f"#!/bin/sh\nsleep {marker} &\nexec sleep 301\n")
    hang.chmod(0o755)
    started = time.monotonic()
    said: list[str] = []
    client = SlurmClient(scontrol=str(hang), sinfo="/nonexistent", say=said.append)
    assert client.drain("gpu017", "preflight: x", timeout_s=1.0) is False
    assert "could not drain gpu017" in said[0] and "did not answer within 1 s" in said[0]
    assert time.monotonic() - started < 60  # scontrol sleeps 301 s; the deadline is 1 s
    time.sleep(0.2)
    assert _running(marker) == []


def test_a_usage_error_in_the_prolog_line_does_not_drain(tmp_path: Path,
                                                         scontrol: tuple[Path, Path]) -> None:
    """slurm.conf's Prolog line with a typo (found by the fuzzer): argparse's exit 2 would make
    Slurm drain every node; it lets the job run like a config error, or fails with
    --fail-closed."""
    fake, calls = scontrol
    rc, err = _prolog(tmp_path, fake, "--expect-gpus", "inf")
    assert rc == 0 and not calls.exists()
    assert "invalid int value: 'inf'" in err and "letting the job run" in err
    rc, _ = _prolog(tmp_path, fake, "--expect-gpus", "inf", "--fail-closed")
    assert rc == 1


# -- an operator's mistakes and the node's slowness are not the node's faults ---------------

def _targets_cases(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    venv_dir = tmp_path / "venv"
    venv_dir.mkdir(exist_ok=True)
    bad_golden = tmp_path / "golden.json"
    bad_golden.write_text('{"schema": "not a fingerprint"')
    return {
        "python-missing": (["--python", str(tmp_path / "no-venv/bin/python")],
                           "no such file (a shared venv not mounted on this node looks like"),
        "python-false": (["--python", "/bin/false"], "is not a working Python interpreter"),
        "python-directory": (["--python", str(venv_dir)], "is a directory, not an interpreter"),
        "golden-missing": (["--golden", str(tmp_path / "nope.json")], "no such file"),
        "golden-garbage": (["--golden", str(bad_golden)], "golden " + str(bad_golden)),
    }


@pytest.mark.parametrize("case", ["python-missing", "python-false", "python-directory",
                                  "golden-missing", "golden-garbage"])
def test_a_bad_python_or_golden_is_a_config_error_never_a_drain(
        tmp_path: Path, scontrol: tuple[Path, Path], case: str) -> None:
    args, words = _targets_cases(tmp_path)[case]
    fixture = write_fixture(tmp_path / "nvml.json", topologies.healthy_8x_h100())
    check = run_cli(["check", "--only", "versions", *args], fixture=fixture)
    assert check.returncode == 2, check.stderr
    assert "preflight: configuration error:" in check.stderr and words in check.stderr
    assert "Traceback" not in check.stderr
    fake, calls = scontrol
    proc = run_cli(["prolog", "--scontrol", str(fake), "--skip", "network,master_port",
                    *args], fixture=fixture, env={"SLURMD_NODENAME": "gpu017"})
    assert proc.returncode == 0 and not calls.exists()
    assert "preflight prolog: configuration error:" in proc.stderr and words in proc.stderr


def test_an_scontrol_wrapper_that_backgrounds_a_child_drains_at_once(tmp_path: Path) -> None:
    """A site's scontrol shim that starts a logger in the background (holding stdout and
    stderr) and exits 0: the drain succeeded and is said so at once (not "could not drain ...
    10 s"), the prolog exits 1, and the logger is gone with the shim's process group."""
    marker = f"300.{os.getpid()}{time.monotonic_ns()}"  # a unique sleep time marks the child
    calls = tmp_path / "calls"
    shim = tmp_path / "scontrol"
    shim.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nsleep {marker} &\nexit 0\n')
    shim.chmod(0o755)
    fixture = write_fixture(tmp_path / "nvml.json", topologies.lost_gpu(3))
    proc = run_cli(["prolog", "--scontrol", str(shim), "--skip", SKIP], fixture=fixture,
                   env={"SLURMD_NODENAME": "gpu017", "PREFLIGHT_MAX_DRAIN_FRACTION": "1"})
    assert proc.returncode == 1, proc.stderr
    assert "could not drain" not in proc.stderr
    assert calls.read_text().split() == ["update", "nodename=gpu017", "state=drain",
                                         "reason=preflight:", "gpu_visible", "GpuLost"]
    time.sleep(0.2)
    assert _running(marker) == []


def _running(marker: str) -> list[str]:
    left = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmd:
                left.append(pid)
    return left


_DNS_SINK = """
import socket, time
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind(("127.0.0.1", 53))
tcp = socket.socket()
tcp.bind(("127.0.0.1", 53))
tcp.listen(16)
print("ready", flush=True)
time.sleep(120)   # receives every query, answers none: a DNS server that times out
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="a private network and mount namespace needs root and unshare")
def test_a_dns_timeout_in_the_prolog_is_named_as_one(tmp_path: Path) -> None:
    """MASTER_ADDR whose lookup never comes back (a real resolver, in a private network
    namespace, asking a DNS server that answers nothing): ERROR ProbeTimeout naming the
    lookup, not "CheckCrashed ... This is a bug"; the job runs."""
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.1\noptions timeout:5 attempts:3\n")
    sink = tmp_path / "sink.py"
    sink.write_text(_DNS_SINK)
    fixture = write_fixture(tmp_path / "nvml.json", topologies.healthy_8x_h100())
    script = (f"ip link set lo up && mount --bind {resolv} /etc/resolv.conf || exit 9\n"
              f"{sys.executable} {sink} > {tmp_path}/sink.out 2>&1 &\n"
              "sink=$!\nsleep 0.5\n"
              f"{sys.executable} -m preflight prolog --scontrol /bin/false "
              "--skip network,versions\nrc=$?\nkill $sink\nexit $rc\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "PREFLIGHT",
                                                                    "MASTER"))}
    env.update(PYTHONPATH=str(REPO), PREFLIGHT_NVML_FIXTURE=str(fixture),
               MASTER_ADDR="trainer-0.example.test", MASTER_PORT="29500",
               SLURMD_NODENAME="gpu017", PREFLIGHT_CHECK_TIMEOUT_S="3")
    proc = subprocess.run(["unshare", "--mount", "--net", "--fork", "sh", "-c", script],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert "ready" in (tmp_path / "sink.out").read_text(), proc.stderr
    assert proc.returncode == 0, proc.stderr
    assert "ERROR master_port ProbeTimeout (scope undecided): master_port could not decide: " \
           "resolving trainer-0.example.test did not answer within 1 s" in proc.stderr
    assert "CheckCrashed" not in proc.stderr and "This is a bug" not in proc.stderr


def test_a_connection_timeout_is_one_line_not_a_cpp_stack_trace(tmp_path: Path) -> None:
    """torch's TCPStore logs a C++ stack trace (30 lines of `frame #N`) when a connect times
    out; `preflight cluster` says it once, in one line."""
    pytest.importorskip("torch.distributed")
    proc = run_cli(["cluster", "--nnodes", "2", "--node-rank", "1", "--master-addr",
                    "127.0.0.1", "--master-port", "1", "--timeout", "3", "--backend", "gloo",
                    "--no-bandwidth", "--expect-gpus", "0"], timeout=90)
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and "NumPy" not in ln
             and "_conversion_method_template" not in ln]
    assert "frame #" not in proc.stderr and "Exception raised from" not in proc.stderr
    assert len(lines) == 1, proc.stderr
    assert "did not answer within 3 s" in lines[0] and "connection refused" in lines[0]
