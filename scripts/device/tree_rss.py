"""Peak memory of a process and all its descendants, polled from /proc until it exits.

Usage: python3 scripts/device/tree_rss.py PID OUT.json [--every S]

Per sample: the sum over the tree of Rss, Pss (smaps_rollup: shared pages split between their
users, the closest to what a memory cgroup charges) and RssAnon (private memory that cannot be
reclaimed), plus the bytes used in /dev/shm (tmpfs pages count against a pod's memory limit).
Per process: its role (daemon, check child, worker, other), the largest Rss seen and its last
VmHWM (the kernel's own peak Rss of that process). Writes OUT.json when PID is gone or on SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any


def _status(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem", "PPid"):
            out[key] = int(value.split()[0]) * (1 if key == "PPid" else 1024)
    return out


def _pss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return 0


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = _status(int(entry)).get("PPid", 0)
            except OSError:
                continue
            kids.setdefault(ppid, []).append(int(entry))
    return kids


def _tree(root: int) -> list[int]:
    kids, out, todo = _children(), [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += kids.get(pid, [])
    return out


def _role(cmdline: str) -> str:
    if " serve" in cmdline:
        return "daemon"
    if "worker" in cmdline:
        return "worker"
    if " check" in cmdline:
        return "check"
    return "other"


def main() -> int:
    root, out_path = int(sys.argv[1]), Path(sys.argv[2])
    every = float(sys.argv[sys.argv.index("--every") + 1]) if "--every" in sys.argv else 0.05
    procs: dict[int, dict[str, Any]] = {}
    peak = {"rss": 0, "pss": 0, "anon": 0, "shm_used": 0, "processes": 0}
    peak_at: dict[str, float] = {}
    samples = 0
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    shm = os.statvfs("/dev/shm")
    shm_base = (shm.f_blocks - shm.f_bfree) * shm.f_frsize
    started = time.time()
    while not stop and os.path.exists(f"/proc/{root}"):
        rss = pss = anon = 0
        pids = _tree(root)
        for pid in pids:
            try:
                st = _status(pid)
                p = _pss(pid)
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
                    errors="replace").strip()
            except OSError:
                continue
            rss += st.get("VmRSS", 0)
            anon += st.get("RssAnon", 0)
            pss += p
            info = procs.setdefault(pid, {"role": _role(cmd), "cmdline": cmd[:200],
                                          "max_rss": 0, "vm_hwm": 0, "first_s": 0.0})
            if not info["first_s"]:
                info["first_s"] = round(time.time() - started, 2)
            info["max_rss"] = max(info["max_rss"], st.get("VmRSS", 0))
            info["vm_hwm"] = max(info["vm_hwm"], st.get("VmHWM", 0))
            info["last_s"] = round(time.time() - started, 2)
        shm = os.statvfs("/dev/shm")
        used = (shm.f_blocks - shm.f_bfree) * shm.f_frsize - shm_base
        for key, value in (("rss", rss), ("pss", pss), ("anon", anon), ("shm_used", used),
                           ("processes", len(pids))):
            if value > peak[key]:
                peak[key] = value
                peak_at[key] = round(time.time() - started, 2)
        samples += 1
        time.sleep(every)
    mib = 1 << 20
    by_role: dict[str, dict[str, Any]] = {}
    for info in procs.values():
        r = by_role.setdefault(info["role"], {"count": 0, "max_vm_hwm_mib": 0.0})
        r["count"] += 1
        r["max_vm_hwm_mib"] = max(r["max_vm_hwm_mib"], round(info["vm_hwm"] / mib, 1))
    out_path.write_text(json.dumps({
        "root_pid": root, "samples": samples, "every_s": every,
        "seconds": round(time.time() - started, 1),
        "peak_tree_rss_mib": round(peak["rss"] / mib, 1),
        "peak_tree_pss_mib": round(peak["pss"] / mib, 1),
        "peak_tree_anon_mib": round(peak["anon"] / mib, 1),
        "peak_dev_shm_used_mib": round(peak["shm_used"] / mib, 1),
        "peak_processes": peak["processes"], "peak_at_s": peak_at, "by_role": by_role,
        "processes": sorted(({"pid": pid, **{k: (round(v / mib, 1) if k in ("max_rss", "vm_hwm")
                                                else v) for k, v in info.items()}}
                             for pid, info in procs.items()), key=lambda p: p["first_s"]),
    }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
