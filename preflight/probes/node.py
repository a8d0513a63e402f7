"""This node's probes, and the Context that serves them to the checks.

The one place that picks the live sources: NVML (or the snapshot file ``PREFLIGHT_NVML_FIXTURE``
names, which replays a captured or made-up node for tests, demos and docs) and the kernel of this
process's network namespace. Tests build a Context with fixture probes instead.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from preflight.core.config import Config
from preflight.core.context import Context, resolve_under
from preflight.probes.driverstate import warm_evidence
from preflight.probes.gpu import DeadlineGpuProbe, FixtureFileGpuProbe, GpuProbe
from preflight.probes.net import LiveNetProbe
from preflight.probes.nvml import NvmlGpuProbe

#: Names a GPU snapshot file (``GpuSnapshot.to_json``) to read instead of NVML.
NVML_FIXTURE_ENV = "PREFLIGHT_NVML_FIXTURE"
#: The GPU snapshot gives up this long before a check's deadline, so the check can still say
#: that the driver did not answer (a verdict) instead of being cut off (undecided).
GPU_PROBE_MARGIN_S = 0.5


def gpu_probe(env: Mapping[str, str], *, root: str | Path = "/") -> GpuProbe:
    """The replayed snapshot when ``PREFLIGHT_NVML_FIXTURE`` names one, else NVML (reading PCI
    ids under ``<root>/sys``)."""
    fixture = env.get(NVML_FIXTURE_ENV)
    if fixture:
        return FixtureFileGpuProbe(fixture)
    return NvmlGpuProbe(sys_root=resolve_under(root, "/sys"))


def bounded_gpu_probe(inner: GpuProbe, config: Config, *,
                      root: str | Path = "/") -> DeadlineGpuProbe:
    """``inner`` behind the deadlines of ``config``: a driver that does not answer is a verdict,
    not a check cut off at its deadline (:class:`~preflight.probes.gpu.DeadlineGpuProbe`). The
    longest wait ends :data:`GPU_PROBE_MARGIN_S` before a check's deadline, so the check can
    still say so."""
    longest = max(0.1, config.check_timeout_s - GPU_PROBE_MARGIN_S)
    proc = resolve_under(root, "/proc")
    return DeadlineGpuProbe(inner, timeout_s=min(config.gpu_probe_timeout_s, longest),
                            longest_s=longest, driver_warm=lambda: warm_evidence(proc))


def make_context(config: Config, *, env: Mapping[str, str] | None = None,
                 root: str | Path = "/") -> Context:
    """The Context of a run on this node: ``env`` (default: a copy of ``os.environ``), the host
    root, this node's GPU probe (within its deadlines) and the live network."""
    env = dict(os.environ if env is None else env)
    return Context(config=config, env=env, root=Path(root),
                   gpu_probe=bounded_gpu_probe(gpu_probe(env, root=root), config, root=root),
                   net_probe=LiveNetProbe())
