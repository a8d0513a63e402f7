"""``preflight explain`` as a person runs it: exit codes, stdin, JSON schema, clear usage errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from preflight.cli import main

LOGS = Path(__file__).parent / "logs"


def test_findings_exit_1_and_json_has_the_documented_schema(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "--json", str(LOGS / "shm_then_watchdog.log")]) == 1
    data = json.loads(capsys.readouterr().out)
    first = data["findings"][0]
    assert {"reason", "layer", "message", "remedy", "evidence", "ranks"} <= set(first)
    assert first["reason"] == "ShmExhausted" and first["layer"] == "communication"
    assert first["evidence"][0]["line"] == 24
    assert "--shm-size" in first["remedy"]
    assert data["ranks"]["root_cause"] == 2


def test_nothing_recognised_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", str(LOGS / "healthy_training.log"),
                 str(LOGS / "healthy_nccl_info.log")]) == 0
    assert "nothing recognised" in capsys.readouterr().out


def test_text_output_shows_fix_and_evidence(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", str(LOGS / "port_in_use.log")]) == 1
    out = capsys.readouterr().out
    assert "PortInUse [environment]" in out
    assert "port_in_use.log:9:" in out
    assert "MASTER_PORT" in out


def test_a_missing_file_is_a_usage_error(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "missing.log"
    assert main(["explain", str(LOGS / "port_in_use.log"), str(path)]) == 2
    err = capsys.readouterr()
    assert str(path) in err.err and "Traceback" not in err.err and err.out == ""


def test_process_substitution_and_named_pipe_are_read() -> None:
    """``preflight explain <(kubectl logs POD)``: bash hands over /dev/fd/N, a pipe."""
    log = str(LOGS / "oom_broken_pipe.log")
    proc = subprocess.run(
        ["bash", "-c", 'exec "$0" -m preflight explain --json <(cat "$1")', sys.executable, log],
        capture_output=True, timeout=60, check=False, text=True)
    assert proc.returncode == 1, proc.stderr
    assert json.loads(proc.stdout)["findings"][0]["reason"] == "CudaOutOfMemory"


def test_named_fifo_is_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "job.log"
    os.mkfifo(fifo)
    writer = threading.Thread(
        target=lambda: fifo.write_bytes((LOGS / "port_in_use.log").read_bytes()), daemon=True)
    writer.start()
    assert main(["explain", str(fifo)]) == 1
    writer.join(10)
    assert "MASTER_PORT" in capsys.readouterr().out


def test_a_device_is_refused_not_read_forever() -> None:
    proc = subprocess.run([sys.executable, "-m", "preflight", "explain", "/dev/zero"],
                          capture_output=True, timeout=60, check=False, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("preflight explain: /dev/zero: is a character device; give a "
                                   "log file, a pipe, a directory, or - for standard input")


def test_stdin_dash_reads_standard_input() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "preflight", "explain", "--json", "-"],
        input=(LOGS / "oom_broken_pipe.log").read_bytes(), capture_output=True, timeout=60,
        check=False)
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)
    assert [f["reason"] for f in data["findings"]] == ["CudaOutOfMemory", "PeerConnectionLost"]
    assert data["findings"][0]["evidence"][0]["source"] == "-"


def test_binary_file_is_not_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "core"
    path.write_bytes(bytes(range(256)) * 64 + b"\xff\xfe RuntimeError: CUDA out of memory\x00")
    assert main(["explain", str(path)]) == 1
    assert "CudaOutOfMemory" in capsys.readouterr().out
