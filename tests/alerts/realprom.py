"""A real Prometheus server scraping real ``preflight serve`` daemons, for tests/alerts.

* :func:`fast_rules`: the shipped rule file with every ``for:`` cut to seconds and every group
  evaluated each second, so that what takes minutes in production shows within a test. Nothing
  else changes: the expressions, windows, labels and annotations are the shipped ones.
* :func:`prometheus_config`: the shipped Kubernetes scrape job
  (deploy/prometheus/scrape-config.yaml) with its service discovery replaced by static targets
  that carry the same ``__meta_*`` labels the pod discovery sets, so the shipped relabeling
  (keep, node, pool) runs for real.
* :class:`Replay`: a recorded report (one with GPU measurements, from the H200) served through the
  real exporter (:func:`preflight.outputs.prom.render`), for the figures no CPU machine measures.
"""

from __future__ import annotations

import copy
import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from preflight.core.result import Report
from preflight.outputs.prom import MetricsSnapshot, render
from tests.helpers import REPO
from tests.serve.conftest import wait_for

RULES = REPO / "deploy" / "prometheus" / "preflight-rules.yaml"
SCRAPE = REPO / "deploy" / "prometheus" / "scrape-config.yaml"
#: The ``for:`` of every alert in the test-only rule file.
FAST_FOR = "2s"


def fast_rules(path: Path) -> Path:
    """Write the shipped rules with ``for: 2s`` and every group evaluated each second."""
    data = yaml.safe_load(RULES.read_text())
    for group in data["groups"]:
        group["interval"] = "1s"
        for rule in group["rules"]:
            if "alert" in rule:
                rule["for"] = FAST_FOR
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@dataclass(frozen=True)
class Target:
    """A scrape target with what Kubernetes' pod discovery would say about it."""

    address: str
    node: str
    pool: str


def prometheus_config(targets: list[Target], rules: Path) -> dict[str, Any]:
    (job,) = copy.deepcopy(yaml.safe_load(SCRAPE.read_text())["scrape_configs"])
    del job["kubernetes_sd_configs"]
    job["scrape_interval"] = "1s"
    job["scrape_timeout"] = "1s"
    job["static_configs"] = [{"targets": [t.address], "labels": {
        "__meta_kubernetes_pod_label_app_kubernetes_io_name": "cluster-preflight",
        "__meta_kubernetes_pod_container_port_name": "metrics",
        "__meta_kubernetes_pod_node_name": t.node,
        "__meta_kubernetes_node_label_nvidia_com_gpu_product": t.pool}} for t in targets]
    # A target the keep rule must drop: another pod's port on the same node.
    job["static_configs"].append({"targets": ["127.0.0.1:9"], "labels": {
        "__meta_kubernetes_pod_label_app_kubernetes_io_name": "dcgm-exporter",
        "__meta_kubernetes_pod_container_port_name": "metrics",
        "__meta_kubernetes_pod_node_name": targets[0].node}})
    return {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)], "scrape_configs": [job]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def terminate(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 10 s; reaped either way."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


class Prometheus:
    """``prometheus`` on a free loopback port with a config and a TSDB under ``workdir``."""

    def __init__(self, binary: str, config: dict[str, Any], workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = workdir / "prometheus.yml"
        cfg.write_text(yaml.safe_dump(config, sort_keys=False))
        self.log_path = workdir / "prometheus.log"
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [binary, f"--config.file={cfg}", f"--storage.tsdb.path={workdir / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        wait_for(self._ready, timeout_s=30, what=f"Prometheus ready:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited {self.proc.returncode}:\n{self.log()}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def api(self, path: str, params: Mapping[str, str] | None = None, *, post: bool = False
            ) -> Any:
        """GET (or POST, for long queries) ``/api/v1/<path>``; the ``data`` of a success."""
        url = f"{self.url}/api/v1/{path}"
        query = urllib.parse.urlencode(params or {})
        data = query.encode() if post else None
        if query and not post:
            url += f"?{query}"
        with urllib.request.urlopen(url, data=data, timeout=10) as resp:
            body = json.loads(resp.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", {"query": expr}, post=True)
        result: list[dict[str, Any]] = data["result"] if data["resultType"] == "vector" else [
            {"metric": {}, "value": data["result"]}]
        return result

    def stop(self) -> None:
        terminate(self.proc)


class Daemon:
    """``python -m preflight serve`` on a free loopback port, every 5 s, on a replayed NVML
    snapshot (``PREFLIGHT_NVML_FIXTURE``), optionally with a host tree under ``--root`` (a
    kernel log, RDMA ports)."""

    def __init__(self, name: str, workdir: Path, fixture: Path, *, root: Path | None = None
                 ) -> None:
        self.name = name
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log_path = workdir / f"serve-{name}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFLIGHT_")}
        env.update({"PYTHONPATH": str(REPO), "PREFLIGHT_NVML_FIXTURE": str(fixture),
                    "PREFLIGHT_EXPECT_GPUS": "8"})
        args = [sys.executable, "-m", "preflight", "--log-level", "info", "serve", "--listen",
                self.address, "--interval", "5", "--bandwidth-interval", "3600"]
        if root is not None:
            args += ["--root", str(root)]
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         cwd=workdir, stdin=subprocess.DEVNULL)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def ran(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"serve {self.name} exited {self.proc.returncode}:\n{self.log()}")
        try:
            with urllib.request.urlopen(f"http://{self.address}/metrics", timeout=2) as resp:
                text = resp.read().decode()
        except OSError:
            return False
        return bool(re.search(r"^preflight_runs_total [1-9]", text, re.M))

    def stop(self) -> None:
        terminate(self.proc)


class Replay:
    """A recorded Report served as ``/metrics`` by the real exporter, its timestamp kept fresh
    (it is a replay of a healthy run, not a stale one)."""

    def __init__(self, report_json: Path) -> None:
        self.report = Report.from_json(json.loads(report_json.read_text()))
        replay = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = render(MetricsSnapshot(replace(replay.report, timestamp_s=time.time())))
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def firing(prom: Prometheus) -> list[Mapping[str, str]]:
    return [a["labels"] for a in prom.api("alerts")["alerts"] if a["state"] == "firing"]
