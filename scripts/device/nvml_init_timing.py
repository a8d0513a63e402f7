"""Device-only: how long NVML takes to answer in a fresh process, for the GPU probe's deadline.

``python3 nvml_init_timing.py first``: one JSON line with the time of ``import pynvml``,
``nvmlInit``, ``nvmlDeviceGetCount``, the first handle and first queries of each GPU, the
shutdown, then a whole preflight snapshot (``NvmlGpuProbe``, its own init included) and what
``warm_evidence`` (the probe's "is the driver initialised" test) says. ``... hold``: init NVML
and keep it open (the GPUs stay initialised) until killed. ``... memory``: each GPU's memory
in use while idle (NVML v1 ``used``, and v2 ``used`` / ``reserved`` when this nvidia-ml-py has
them), for ``epilog_idle_memory_max_bytes``.
"""

from __future__ import annotations

import json
import sys
import time


def first() -> dict[str, object]:
    t = time.perf_counter()
    import pynvml as nv  # noqa: TID251 - the raw library's own timing is what is measured

    out: dict[str, object] = {"import_s": time.perf_counter() - t}
    t = time.perf_counter()
    nv.nvmlInit()
    out["init_s"] = time.perf_counter() - t
    t = time.perf_counter()
    count = nv.nvmlDeviceGetCount()
    out["count_s"] = time.perf_counter() - t
    out["gpus"] = count
    per = []
    for i in range(count):
        row: dict[str, float] = {}
        t = time.perf_counter()
        h = nv.nvmlDeviceGetHandleByIndex(i)
        row["handle_s"] = time.perf_counter() - t
        for name, fn, args in (("uuid_s", nv.nvmlDeviceGetUUID, (h,)),
                               ("memory_s", nv.nvmlDeviceGetMemoryInfo, (h,)),
                               ("temperature_s", nv.nvmlDeviceGetTemperature,
                                (h, nv.NVML_TEMPERATURE_GPU)),
                               ("persistence_s", nv.nvmlDeviceGetPersistenceMode, (h,))):
            t = time.perf_counter()
            try:
                value = fn(*args)
            except nv.NVMLError as exc:
                value = f"error {exc}"
            row[name] = time.perf_counter() - t
            if name == "persistence_s":
                row["persistence_mode"] = value  # type: ignore[assignment]
        per.append(row)
    out["per_gpu"] = per
    t = time.perf_counter()
    nv.nvmlShutdown()
    out["shutdown_s"] = time.perf_counter() - t

    from pathlib import Path

    from preflight.probes.driverstate import warm_evidence
    from preflight.probes.nvml import NvmlGpuProbe

    t = time.perf_counter()
    snap = NvmlGpuProbe(sys_root=Path("/sys")).snapshot()
    out["preflight_snapshot_s"] = time.perf_counter() - t
    out["snapshot_available"] = snap.available
    t = time.perf_counter()
    out["warm_evidence"] = warm_evidence()
    out["warm_evidence_s"] = time.perf_counter() - t
    return out


def memory() -> list[dict[str, object]]:
    import pynvml as nv  # noqa: TID251 - the raw library's own timing is what is measured

    nv.nvmlInit()
    rows = []
    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        m = nv.nvmlDeviceGetMemoryInfo(h)
        row: dict[str, object] = {"gpu": i, "v1_used": int(m.used), "v1_total": int(m.total),
                                  "procs": len(nv.nvmlDeviceGetComputeRunningProcesses(h))}
        v2 = getattr(nv, "nvmlMemory_v2", None)
        if v2 is not None:
            try:
                m2 = nv.nvmlDeviceGetMemoryInfo(h, version=v2)
                row.update(v2_used=int(m2.used), v2_reserved=int(m2.reserved),
                           v2_total=int(m2.total))
            except (nv.NVMLError, TypeError) as exc:
                row["v2"] = f"error {exc}"
        rows.append(row)
    nv.nvmlShutdown()
    return rows


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "first"
    if mode == "hold":
        import pynvml  # noqa: TID251 - a client that keeps the GPUs initialised

        pynvml.nvmlInit()
        print("holding", flush=True)
        time.sleep(3600)
    elif mode == "memory":
        print(json.dumps(memory()))
    else:
        print(json.dumps(first()))
