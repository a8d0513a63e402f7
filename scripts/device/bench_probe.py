"""Device-only helper of scripts/device/h200_x2.sh (issue 14): runs the bench in-process so it can
act on the parent's progress, and prints one JSON line per experiment.

``stall PHASE``: SIGSTOP rank 1 when rank 0 reports PHASE (``spawn``: as soon as rank 1 exists;
``init``; ``measure of 1 GiB``...), then report the verdict and the seconds from the stop to it.
``first``: the first all-reduce after allocation, per allocator and NCCL setting (why did it take
3-4.5 s after nccl.mem_alloc?), with the phase times of each run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from preflight.bench import plan, run_bench
from preflight.bench.procs import WORKER_SCRIPT
from preflight.core.config import load
from preflight.probes.node import make_context


def _ctx(**overrides: object):  # type: ignore[no-untyped-def]
    return make_context(load(path=None, env=os.environ, overrides=dict(overrides)))


def _rank_pid(rank: int) -> int | None:
    me = os.getpid()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == me and str(WORKER_SCRIPT).encode() in cmd and b"--plan" in cmd:
            plan = json.loads(cmd[cmd.index(b"--plan") + 1])
            if (plan.get("allreduce") or {}).get("rank") == rank:
                return int(proc.name)
    return None


def stall(phase: str, engine: str) -> dict[str, object]:
    ctx = _ctx()
    p = plan(ctx, backend="nccl", engine=engine, min_bytes=1 << 30, max_bytes=4 << 30,
             timeout_s=120)
    hit = threading.Event()
    stopped: dict[str, float] = {}

    def progress(where: str) -> None:
        if where == phase:
            hit.set()

    def stopper() -> None:
        if phase != "spawn":
            hit.wait(60)
        for _ in range(2000):
            pid = _rank_pid(1)
            if pid:
                os.kill(pid, signal.SIGSTOP)
                stopped["t"] = time.monotonic()
                stopped["pid"] = pid
                return
            time.sleep(0.005)

    t = threading.Thread(target=stopper)
    t.start()
    res = run_bench(ctx, p, on_progress=progress)
    done = time.monotonic()
    t.join()
    return {"experiment": "stall", "engine": engine, "phase": phase,
            "stop_to_verdict_s": round(done - stopped["t"], 2) if "t" in stopped else None,
            "status": res.status.word, "reason": res.reason, "message": res.message,
            "stalled_ranks": list(res.stalled_ranks)}


def first(alloc: str, extra_env: dict[str, str]) -> dict[str, object]:
    ctx = _ctx()
    p = plan(ctx, backend="nccl", engine="nccl4py", min_bytes=1 << 30, max_bytes=1 << 30)
    assert p.options is not None
    env = {**os.environ, **extra_env}
    p = dataclasses.replace(p, options=dataclasses.replace(p.options, alloc=alloc, env=env))
    t0 = time.monotonic()
    res = run_bench(ctx, p)
    return {"experiment": "first", "alloc": alloc, "env": extra_env,
            "wall_s": round(time.monotonic() - t0, 3), "status": res.status.word,
            "first_allreduce_s": res.first_allreduce_s, "phase_times_s": res.phase_times_s,
            "busbw_gbps": res.busbw_gbps, "message": res.message[:300]}


def main(argv: list[str]) -> int:
    if argv[0] == "stall":
        out = stall(argv[1], argv[2] if len(argv) > 2 else "auto")
    else:
        env = dict(kv.split("=", 1) for kv in argv[2:])
        out = first(argv[1], env)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
