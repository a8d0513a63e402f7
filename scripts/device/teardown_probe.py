"""Device-only helper (issue 14, one GPU): where the nccl4py worker's seconds go outside NCCL's
own collective, and what its exit costs, measured without a second GPU.

``imports``: the packages the worker imports, each timed on its own in a fresh interpreter.
``orchestrated [1G|sweep] [corrupt]``: the real parent and worker (``run_workers``) with one
rank: phase times, the parent's teardown, the GPU-side exact check (``corrupt``: the test-only
corruption must be caught as one mismatch at the middle element).
``exit VARIANT``: a one-rank communicator and 1 GiB, one all-reduce, then VARIANT (``destroy``:
ncclCommDestroy + free + exit, as the worker; ``abort``: ncclCommAbort + free + exit; ``exit``:
exit with everything still allocated); the child reports when it starts each step and the parent
takes the time its exit is reaped. One JSON line per experiment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def imports() -> dict[str, object]:
    mods = ["numpy", "cuda.bindings.driver", "cuda.pathfinder", "cuda.core", "nccl.bindings.nccl",
            "nccl.core"]
    code = ("import time, json, importlib\nout = {}\n"
            f"for m in {mods!r}:\n"
            "    t = time.perf_counter(); importlib.import_module(m)\n"
            "    out[m] = round(time.perf_counter() - t, 4)\n"
            "print(json.dumps(out))")
    runs = []
    for _ in range(3):
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=60, check=False)
        runs.append({"wall_s": round(time.perf_counter() - t0, 3),
                     "each_s": json.loads(proc.stdout) if proc.returncode == 0 else proc.stderr})
    return {"experiment": "imports", "runs": runs}


def importtime(target: str, extra_env: dict[str, str]) -> dict[str, object]:
    """``python -X importtime -c 'import TARGET'``: the 12 slowest modules (cumulative, s), and
    whether numpy / cuda.core came along."""
    code = f"import {target}, sys; print('numpy' in sys.modules, 'cuda.core' in sys.modules)"
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True,
                          text=True, timeout=60, check=False, env={**os.environ, **extra_env})
    wall = time.perf_counter() - t0
    rows = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cum_us, name = line.split("|", 2)
        rows.append((int(cum_us), name.rstrip()))
    rows.sort(reverse=True)
    return {"experiment": "importtime", "target": target, "env": extra_env,
            "wall_s": round(wall, 3), "stdout": proc.stdout.strip(),
            "slowest_s": [(name, round(us / 1e6, 4)) for us, name in rows[:12]]}


def venv(python: str, libnccl: str | None = None) -> dict[str, object]:
    """The --python path on one GPU: which interpreter and libnccl the plan picks for a training
    venv without nccl4py, then the real workers with them (or with ``libnccl`` forced)."""
    from preflight.bench import _interpreter
    from preflight.bench.parent import BenchOptions, run_workers
    from preflight.core.config import load
    from preflight.probes.node import make_context

    ctx = make_context(load(path=None, env=os.environ, overrides={"python": python}))
    chosen = _interpreter(ctx, "nccl", "auto")
    workers, lib, engine, _ = chosen
    if libnccl is not None:
        workers, lib, engine = sys.executable, libnccl, "nccl4py"
    opts = BenchOptions(backend="nccl", nproc=1, sizes=(1 << 30,), timeout_s=60, iters=20,
                        warmup=5, labels=("GPU 0",), env=dict(os.environ), engine=engine,
                        python=workers, libnccl=lib)
    record = run_workers(opts)
    st = record.ranks[0]
    return {"experiment": "venv", "python": python, "chosen": list(chosen), "forced": libnccl,
            "failure": str(record.failure), "error": st.error, "libnccl": st.libnccl,
            "nccl": st.nccl_version, "engine": st.engine,
            "ok": [v.get("ok") for v in st.verified.values()]}


def orchestrated(what: str, corrupt: bool, alloc: str = "device") -> dict[str, object]:
    from preflight.bench import method
    from preflight.bench.parent import BenchOptions, run_workers
    from preflight.bench.verdict import rows_of

    sizes = (1 << 30,) if what == "1G" else tuple(method.sweep(1 << 20, 1 << 30))
    env = dict(os.environ)
    if corrupt:
        env["PREFLIGHT_BENCH_TEST_CORRUPT_RANK"] = "0"
    opts = BenchOptions(backend="nccl", nproc=1, sizes=sizes, timeout_s=120, iters=20,
                        warmup=5, labels=("GPU 0",), env=env, engine="nccl4py", alloc=alloc)
    t0 = time.monotonic()
    record = run_workers(opts)
    st = record.ranks[0]
    return {"experiment": "orchestrated", "sizes": what, "corrupt": corrupt, "alloc": alloc,
            "wall_s": round(time.monotonic() - t0, 3), "failure": str(record.failure),
            "teardown_s": record.teardown_s, "phase_times_s": st.phase_times,
            "libnccl": st.libnccl, "shm_removed": list(record.shm_removed),
            "rows": [{"size": r.size_bytes, "us": round(r.time_s * 1e6, 1), "ok": r.correct,
                      "wrong": r.wrong} for r in rows_of(record)],
            "verified": {str(k): v for k, v in st.verified.items()}}


CHILD = r"""
import ctypes, json, os, sys, time
def say(ev):
    print(json.dumps({"ev": ev, "t": time.time()}), flush=True)
variant = sys.argv[1]
import cuda.bindings.driver as cu
from cuda.core import Device
import nccl.core as nccl
import nccl.bindings.nccl as raw
dev = Device(0); dev.set_current(); s = dev.create_stream()
comm = nccl.Communicator.init(1, 0, nccl.get_unique_id())
buf = dev.allocate(1 << 30, stream=s)
raw.all_reduce(int(buf.handle), int(buf.handle), (1 << 30) // 4, int(nccl.FLOAT32),
               int(nccl.SUM), comm._comm if hasattr(comm, "_comm") else comm.ptr, int(s.handle))
s.sync()
say("done")
if variant == "destroy":
    comm.destroy(); say("destroyed"); buf.close(); s.sync(); say("freed")
elif variant == "abort":
    comm.abort(); say("destroyed"); buf.close(); s.sync(); say("freed")
say("exit")
sys.stdout.flush()
os._exit(0)
"""


def exit_variant(variant: str) -> dict[str, object]:
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, "-c", CHILD, variant], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    events = {}
    nccl_lines = []
    for line in proc.stdout:
        if not line.startswith("{"):
            if "timings" in line or "Init COMPLETE" in line:
                nccl_lines.append(line.strip()[-300:])
            continue
        ev = json.loads(line)
        events[ev["ev"]] = ev["t"]
    proc.wait(timeout=60)
    reaped = time.time()
    done = events.get("done", reaped)
    return {"experiment": "exit", "variant": variant, "rc": proc.returncode,
            "start_to_done_s": round(done - t0, 3),
            "after_done_s": {k: round(v - done, 4) for k, v in events.items() if k != "done"}
            | {"reaped": round(reaped - done, 4)}, "nccl": nccl_lines}


def main(argv: list[str]) -> int:
    if argv[0] == "imports":
        out = imports()
    elif argv[0] == "importtime":
        out = importtime(argv[1], dict(kv.split("=", 1) for kv in argv[2:]))
    elif argv[0] == "orchestrated":
        out = orchestrated(argv[1], "corrupt" in argv[2:], "nccl" if "nccl" in argv[2:] else
                           "device")
    elif argv[0] == "venv":
        out = venv(argv[1], argv[2] if len(argv) > 2 else None)
    else:
        out = exit_variant(argv[1])
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
