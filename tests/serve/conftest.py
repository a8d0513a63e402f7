"""Helpers for the daemon's tests: real HTTP on loopback, a real ``preflight serve`` process."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests import topologies

REPO = Path(__file__).resolve().parents[2]
FAKE_CHILD = Path(__file__).with_name("fake_child.py")


@dataclass
class Response:
    status: int
    body: bytes
    headers: Mapping[str, str]

    @property
    def text(self) -> str:
        return self.body.decode()

    def json_body(self) -> Any:
        return json.loads(self.body)


def get(url: str, *, timeout_s: float = 5.0) -> Response:
    """GET ``url``; an HTTP error status is a Response too (503 is an answer, not a failure)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return Response(resp.status, resp.read(), dict(resp.headers))
    except urllib.error.HTTPError as exc:
        return Response(exc.code, exc.read(), dict(exc.headers))


def wait_for(predicate: Callable[[], bool], *, timeout_s: float, what: str,
             every_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def samples(text: str) -> dict[str, float]:
    """``{'name{labels}': value}`` of an exposition text (labels as printed)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


@dataclass
class ServeProcess:
    """A running ``python -m preflight serve``; ``url`` is where it listens."""

    proc: subprocess.Popen[bytes]
    log_path: Path
    url: str = ""
    extra: dict[str, object] = field(default_factory=dict)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> dict[str, float]:
        return samples(get(f"{self.url}/metrics").text)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait(5)


def fixture_file(tmp_path: Path) -> Path:
    """A fixture GPU snapshot for PREFLIGHT_NVML_FIXTURE: 8 healthy H100, a job (pid 1) on GPU 0,
    so a daemon under test defers its bandwidth test instead of running NCCL on this CPU box."""
    snap = topologies.healthy_8x_h100()
    gpus = (dataclasses.replace(snap.gpus[0], compute_pids=(1,)), *snap.gpus[1:])
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps(dataclasses.replace(snap, gpus=gpus).to_json()))
    return path


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., ServeProcess]]:
    """Start ``preflight serve`` on a free loopback port (``--listen 127.0.0.1:0``; the bound port
    is read from its log). Every process started is stopped at the end."""
    started: list[ServeProcess] = []

    def start(*args: str, env: Mapping[str, str] | None = None,
              wait_listening: bool = True) -> ServeProcess:
        log_path = tmp_path / f"serve-{len(started)}.log"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("PREFLIGHT_")}
        full_env.update({"PYTHONPATH": str(REPO),
                         "PREFLIGHT_NVML_FIXTURE": str(fixture_file(tmp_path)),
                         "PREFLIGHT_EXPECT_GPUS": "8"})
        full_env.update(env or {})
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "preflight", "--log-level", "info", "serve", *args],
                stdout=log, stderr=subprocess.STDOUT, env=full_env, cwd=tmp_path)
        sp = ServeProcess(proc, log_path)
        started.append(sp)
        if wait_listening:
            pattern = re.compile(r"listening on (http://\S+:\d+)")

            def listening() -> bool:
                if proc.poll() is not None:
                    raise AssertionError(f"serve exited {proc.returncode}:\n{sp.log()}")
                m = pattern.search(sp.log())
                if m:
                    sp.url = m.group(1)
                return bool(m)

            wait_for(listening, timeout_s=15, what="the daemon to listen")
        return sp

    yield start
    for sp in started:
        sp.stop()
