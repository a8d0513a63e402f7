"""The command boundary: an internal error is "undecided" in one line, a closed or full stdout is
one line, helper processes die with their whole group (issue #11 points 2, 6, 7)."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from preflight import cli
from preflight.probes.pyenv import PyEnvError, gather_foreign
from tests.helpers import REPO


def _marked(marker: str) -> list[str]:
    left = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    left.append(pid)
            except OSError:
                continue
    return left


def test_internal_error_in_check_is_undecided_in_one_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def broken(*_a: object, **_k: object) -> None:
        raise RuntimeError("a bug\nwith a second line")

    monkeypatch.setattr("preflight.commands.check.run_checks", broken)
    assert cli.main(["check", "--only", "shm", "--expect-gpus", "0"]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("preflight: internal error, so the node is undecided: RuntimeError: "
                          "a bug\\nwith a second line")
    assert "Traceback" not in err


def test_internal_error_in_prolog_lets_the_job_run_unless_fail_closed(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    fake = tmp_path / "scontrol"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)

    def broken(*_a: object, **_k: object) -> None:
        raise KeyError("surprise")

    monkeypatch.setattr("preflight.commands.prolog.run_checks", broken)
    monkeypatch.setenv("SLURMD_NODENAME", "gpu017")
    monkeypatch.setenv("PREFLIGHT_MAX_DRAIN_FRACTION", "1")  # no sinfo here: no fleet guard
    assert cli.main(["prolog", "--scontrol", str(fake), "--expect-gpus", "0"]) == 0
    assert not calls.exists()
    err = capsys.readouterr().err
    assert "preflight prolog: internal error, so the node is undecided: KeyError" in err
    assert "Traceback" not in err
    assert cli.main(["prolog", "--scontrol", str(fake), "--expect-gpus", "0",
                     "--fail-closed"]) == 1
    assert "reason=preflight: internal error" in calls.read_text()


@pytest.mark.parametrize("how", ["closed", "full"])
def test_closed_or_full_stdout_is_one_line(how: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "preflight", "check", "--only", "shm", "--expect-gpus", "0"]
    if how == "full":
        with open("/dev/full", "w") as full:
            proc = subprocess.run(argv, stdout=full, stderr=subprocess.PIPE, text=True, env=env,
                                  timeout=60, check=False)
    else:
        # `>&-` closes fd 1 before exec; argv travels as "$@", no string is built from it.
        proc = subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", *argv],
                              stderr=subprocess.PIPE, text=True, env=env, timeout=60, check=False)
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("preflight: cannot write the result to standard output: ")


def test_a_hanging_python_wrapper_dies_with_its_group(tmp_path: Path) -> None:
    """--python names a wrapper script whose child holds the pipe: before, the deadline killed
    only the script and then waited for ever on the pipe the child kept open."""
    marker = f"preflight-test-pywrap-{os.getpid()}-{time.monotonic_ns()}"
    wrapper = tmp_path / "python"
    # The child lives until killed and carries the marker in its argv (python -c takes it as
    # sys.argv[1]); the wrapper itself then waits as well.
    wrapper.write_text(f"#!/bin/sh\n{shlex.quote(sys.executable)} -c "
                       f"'import time; time.sleep(300)' {marker} &\nexec sleep 301\n")
    wrapper.chmod(0o755)
    seen: list[list[str]] = []
    stop = threading.Event()

    def watch() -> None:  # the child must really be there while the wrapper hangs
        while not stop.is_set() and not seen:
            if found := _marked(marker):
                seen.append(found)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    started = time.monotonic()
    try:
        with pytest.raises(PyEnvError, match="did not describe its environment within 3 s") \
                as info:
            gather_foreign(str(wrapper), ["torch"], timeout_s=3.0)
    finally:
        stop.set()
        watcher.join(5)
    assert info.value.kind == "timeout"
    assert time.monotonic() - started < 60  # the wrapper sleeps 301 s; the deadline is 3 s
    assert seen, "the wrapper's child never ran: the check below could not fail"
    deadline = time.monotonic() + 10  # SIGKILLed with its group; give the kernel a moment
    while _marked(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = _marked(marker)
    for pid in left:  # never leave it behind, even when the test fails
        with contextlib.suppress(OSError):
            os.kill(int(pid), signal.SIGKILL)
    assert left == []
