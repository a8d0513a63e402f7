"""Running the real CLI as a subprocess, with a fixture GPU node."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from preflight.probes.gpu import GpuSnapshot

REPO = Path(__file__).resolve().parent.parent


def write_fixture(path: Path, snapshot: GpuSnapshot) -> Path:
    path.write_text(json.dumps(snapshot.to_json()))
    return path


def run_cli(args: Sequence[str], *, env: Mapping[str, str] | None = None,
            fixture: Path | None = None, timeout: float = 60,
            input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m preflight ARGS`` with a clean environment (no job variables leak in)."""
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("NCCL_", "TORCH_", "SLURM_", "PREFLIGHT_", "CUDA_", "GLOO_"))
            and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                          "MASTER_PORT", "GROUP_RANK")}
    base["PYTHONPATH"] = str(REPO)
    if fixture is not None:
        base["PREFLIGHT_NVML_FIXTURE"] = str(fixture)
    base.update(env or {})
    return subprocess.run([sys.executable, "-m", "preflight", *args], env=base, text=True,
                          capture_output=True, timeout=timeout, input=input_text, check=False)


def cli_json(args: Sequence[str], **kwargs: Any) -> tuple[int, dict[str, Any]]:
    proc = run_cli([*args, "--json"], **kwargs)
    try:
        return proc.returncode, json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise AssertionError(f"not JSON (rc={proc.returncode}): {proc.stdout!r} "
                             f"stderr={proc.stderr!r}") from exc


#: ``python -c PEAK_RSS_LAUNCHER OUT_FILE ARGV...`` runs ARGV as its own child (SIGTERM / SIGINT
#: passed on) and writes that child's peak RSS in bytes to OUT_FILE; its exit code is the child's.
#: The peak is measured one process away from pytest on purpose: Linux carries a process's
#: high-water mark across fork (or vfork) and exec, so wait4 on a direct child of a pytest that
#: has loaded torch reads ~500 MiB for any command.
PEAK_RSS_LAUNCHER = """
import os, signal, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda signum, frame: os.kill(pid, signum))
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(str(usage.ru_maxrss * 1024))
code = os.waitstatus_to_exitcode(status)
sys.exit(code if code >= 0 else 128 - code)
"""


def own_peak_rss_bytes() -> int:
    """This process's own peak RSS (VmHWM: per address space, so not the parent's)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/self/status")


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (ProcessLookupError, FileNotFoundError):
        return False
    return state != "Z"
