"""Load and footprint of ``preflight serve`` (issue 5, item 8); prints a table.

1. Idle footprint: a daemon with ``--interval 60`` after its first run; resident memory (VmRSS).
2. Load: 50 concurrent clients scrape ``/metrics`` for 10 s over keep-alive connections (as
   Prometheus does) while check runs are in progress: the daemon runs with ``--interval 0.05``,
   so a new ``preflight check`` child starts as soon as the last one ended (a run is in progress
   nearly all the time, competing for the same cores). Two client modes:
   * ``closed``: every client scrapes again as soon as it has an answer (saturation);
   * ``paced``: every client scrapes every 100 ms (500 scrapes/s in all, still far above a real
     fleet's one scrape per 15 s per Prometheus), either all in step (a burst of 50 requests at
     the same instant every 100 ms) or staggered (each client at its own random phase, as
     independent scrapers are).
   Errors are non-200 answers, bad bodies and socket errors; latency is measured by the client
   from sending the request to reading the whole body.

Usage: python benchmarks/serve_load.py [--clients 50] [--seconds 10] [--procs 10]
       [--run-interval 0.05]
The GPU fixture (PREFLIGHT_NVML_FIXTURE) shows 8 healthy H100 with a job on GPU 0, so the
daemon's checks run for real but the bandwidth test is deferred (no GPU here).
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

import psutil
from machine import describe, pythonpath  # benchmarks/machine.py (sys.path[0] is this folder)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests import topologies  # noqa: E402


def start_daemon(workdir: Path, interval_s: float) -> tuple[subprocess.Popen[bytes], int, Path]:
    snap = topologies.healthy_8x_h100()
    gpus = (replace(snap.gpus[0], compute_pids=(1,)), *snap.gpus[1:])
    fixture = workdir / "gpus.json"
    fixture.write_text(json.dumps(replace(snap, gpus=gpus).to_json()))
    log = workdir / f"serve-{interval_s}.log"
    env = {**os.environ, "PYTHONPATH": pythonpath(REPO), "PREFLIGHT_NVML_FIXTURE": str(fixture),
           "PREFLIGHT_EXPECT_GPUS": "8"}
    with log.open("wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "preflight", "--log-level", "warning",
                                 "serve", "--listen", "127.0.0.1:0", "--interval", str(interval_s)],
                                stdout=fh, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", log.read_text())
        if m:
            return proc, int(m.group(1)), log
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"daemon did not start:\n{log.read_text()}")


def scrape_once(port: int) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        return conn.getresponse().read()
    finally:
        conn.close()


def runs_total(port: int) -> float:
    m = re.search(rb"^preflight_runs_total (\S+)$", scrape_once(port), re.M)
    return float(m.group(1)) if m else 0.0


def client_proc(port: int, threads: int, seconds: float, pace_s: float, *, start_at: float,
                stagger: bool, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()

    def client(phase_s: float) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        mine: list[float] = []
        bad = 0
        while time.time() < start_at + phase_s:
            time.sleep(0.001)
        end = start_at + seconds
        next_at = time.perf_counter()
        while time.time() < end:
            t0 = time.perf_counter()
            try:
                conn.request("GET", "/metrics")
                resp = conn.getresponse()
                body = resp.read()
                if resp.status != 200 or b"preflight_node_healthy" not in body:
                    bad += 1
            except (OSError, http.client.HTTPException):
                bad += 1
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            mine.append(time.perf_counter() - t0)
            if pace_s:
                next_at += pace_s
                time.sleep(max(0.0, next_at - time.perf_counter()))
        conn.close()
        with lock:
            latencies.extend(mine)
            errors[0] += bad

    # In step: every client fires at the same instant (a burst of all clients every pace_s).
    # Staggered: each client's phase is random within the period, as independent scrapers are.
    rng = random.Random(os.getpid())
    ts = [threading.Thread(target=client, args=(rng.uniform(0, pace_s) if stagger else 0.0,))
          for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    out.put((latencies, errors[0]))


def load(port: int, *, clients: int, procs: int, seconds: float, pace_s: float,
         stagger: bool = False) -> dict[str, float]:
    queue: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    start_at = time.time() + 1.0
    per = [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]
    ps = [multiprocessing.Process(target=client_proc, args=(port, n, seconds, pace_s),
                                  kwargs={"start_at": start_at, "stagger": stagger, "out": queue})
          for n in per if n]
    for p in ps:
        p.start()
    latencies: list[float] = []
    errors = 0
    for _ in ps:
        lat, err = queue.get(timeout=seconds + 60)
        latencies += lat
        errors += err
    for p in ps:
        p.join(10)
    latencies.sort()
    q = statistics.quantiles(latencies, n=100, method="inclusive")
    return {"requests": len(latencies), "errors": errors, "rps": len(latencies) / seconds,
            "p50_ms": q[49] * 1e3, "p99_ms": q[98] * 1e3, "max_ms": latencies[-1] * 1e3}


def rss_mb(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--procs", type=int, default=10, help="client processes (GIL)")
    parser.add_argument("--run-interval", type=float, default=0.05,
                        help="the daemon's --interval during the load (0.05: runs back to back)")
    args = parser.parse_args()
    print(f"machine: {describe()}")

    with tempfile.TemporaryDirectory() as tmp:
        proc, port, _ = start_daemon(Path(tmp), 60.0)
        try:
            deadline = time.monotonic() + 30
            while runs_total(port) < 1 and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(2.0)
            idle_rss = rss_mb(proc.pid)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)

        proc, port, _ = start_daemon(Path(tmp), args.run_interval)
        rows = []
        try:
            while runs_total(port) < 1:
                time.sleep(0.1)
            for mode, pace, stagger in (("closed", 0.0, False), ("paced, in step", 0.1, False),
                                        ("paced, stagger", 0.1, True)):
                before = runs_total(port)
                r = load(port, clients=args.clients, procs=args.procs, seconds=args.seconds,
                         pace_s=pace, stagger=stagger)
                r["runs"] = runs_total(port) - before
                r["rss_mb"] = rss_mb(proc.pid)
                rows.append((mode, r))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)

    print(f"\nidle daemon RSS: {idle_rss:.1f} MB (target <= 60 MB)\n")
    print(f"{args.clients} clients x {args.seconds:g} s on /metrics, {args.procs} client "
          f"processes, daemon --interval {args.run_interval:g}:")
    head = (f"{'mode':<14}{'requests':>9}{'errors':>7}{'req/s':>8}{'p50 ms':>8}{'p99 ms':>8}"
            f"{'max ms':>8}{'runs':>6}{'RSS MB':>8}")
    print(head)
    print("-" * len(head))
    for mode, r in rows:
        print(f"{mode:<14}{r['requests']:>9.0f}{r['errors']:>7.0f}{r['rps']:>8.0f}"
              f"{r['p50_ms']:>8.2f}{r['p99_ms']:>8.2f}{r['max_ms']:>8.1f}{r['runs']:>6.0f}"
              f"{r['rss_mb']:>8.1f}")
    return 0 if all(r["errors"] == 0 for _, r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
