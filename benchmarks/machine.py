"""One line naming the machine a benchmark ran on (as each table in docs/benchmarks.md has)."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def describe() -> str:
    """``AMD EPYC, 2 CPUs, Python 3.11.7``."""
    return f"{cpu_model()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def pythonpath(repo: object) -> str:
    """PYTHONPATH for a child: the source tree first, then whatever was already there (a GPU
    machine carries packages such as netifaces-plus in a folder named there)."""
    return os.pathsep.join(p for p in (str(repo), os.environ.get("PYTHONPATH", "")) if p)
