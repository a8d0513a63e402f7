"""Print the NVML snapshot of this node as JSON (a fixture for tests, or a record for docs/)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from preflight.probes.nvml import NvmlGpuProbe

t0 = time.perf_counter()
snap = NvmlGpuProbe(sys_root=Path("/sys")).snapshot()
print(json.dumps(snap.to_json(), indent=1))
print(f"snapshot took {time.perf_counter() - t0:.3f} s", file=sys.stderr)
