"""The real ``preflight prolog`` never drains a node for preflight's own trouble (issue #11).

scontrol is a recording stand-in (its argv to a file; the fixture is in tests/conftest.py); the
prolog is the real CLI in a subprocess."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from preflight.commands.prolog import drain
from tests import topologies
from tests.helpers import run_cli, write_fixture

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


def test_fail_closed_drains_on_a_config_error(tmp_path: Path,
                                              scontrol: tuple[Path, Path]) -> None:
    fake, calls = scontrol
    rc, err = _prolog(tmp_path, fake, "--fail-closed", "--root", str(tmp_path / "nope"))
    assert rc == 1 and "is not a directory" in err
    assert "reason=preflight: configuration error" in calls.read_text()


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
    marker = f"preflight-test-scontrol-{os.getpid()}-{time.monotonic_ns()}"
    hang = tmp_path / "scontrol"
    hang.write_text(f"#!/bin/sh\nsleep 300 {marker} &\nexec sleep 301\n")
    hang.chmod(0o755)
    started = time.monotonic()
    assert drain(str(hang), "gpu017", "preflight: x", timeout_s=1.0) is False
    assert time.monotonic() - started < 60  # scontrol sleeps 301 s; the deadline is 1 s
    time.sleep(0.2)
    left = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmd:
                left.append(pid)
    assert left == []


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
