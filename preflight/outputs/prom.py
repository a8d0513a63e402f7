"""Prometheus metrics from a Report: the daemon's ``/metrics`` and ``check --prom-file``.

A :class:`ReportCollector` yields metric families from a snapshot it is handed (the daemon's cached
Report); it never runs a check, so a scrape costs microseconds and cannot hang.
Names follow Prometheus conventions (base units, ``_seconds``, ``_bytes``, ``_total``, ``_info``)
and carry no node or cluster label: Prometheus adds the target's (``instance``, ``job``, and the
``node`` and ``pool`` labels the scrape config's relabeling sets: docs/daemon.md#metrics).

Every series that can be known in advance exists from the first scrape: one-hot status series of
every known check are all 0 and ``preflight_last_run_timestamp_seconds`` is 0 until a run finished;
measured values nobody has measured yet (bandwidth, /dev/shm size) are NaN, never a made-up 0.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from preflight import __version__
from preflight.checks.fabric import NAME as FABRIC
from preflight.checks.gpu_speed import NAME as GPU_SPEED
from preflight.checks.gpu_visible import NAME as GPU_VISIBLE
from preflight.checks.memlock import NAME as MEMLOCK
from preflight.checks.shm import NAME as SHM
from preflight.checks.xid import NAME as XID
from preflight.core.result import Report, Result, Scope, Status
from preflight.outputs.textfile import TextfileError, write_metrics_file

NAN = float("nan")


@dataclass(frozen=True)
class DaemonStats:
    """What only a long-running daemon knows (absent from one-shot textfiles).

    Attributes:
        runs_total: check runs finished (node and bandwidth runs, failed ones included).
        check_errors_total: runs per check whose verdict was ERROR (crash, deadline).
        config_reload_success: 1 when the last (re)load of the config file worked, else 0.
        bandwidth_timestamp_s: when the last bandwidth run finished; 0 = never.
        interval_s: seconds between node-check runs, so that alert rules can say "no run for 3
            intervals" without knowing each node's config.
    """

    runs_total: int = 0
    check_errors_total: Mapping[str, int] = field(default_factory=dict)
    config_reload_success: bool = True
    bandwidth_timestamp_s: float = 0.0
    interval_s: float = 60.0
    #: Xids per (gpu, code) the daemon's NVML event watcher counted (kernel log catch-up at
    #: start included); used while ``xid_watching``, per key the larger of it and the xid
    #: check's kernel-log count. None = no watcher.
    xid_counts: Mapping[tuple[str, int], int] | None = None
    #: The watcher receives NVML Xid events now (False: NVML missing, no GPU supports them).
    xid_watching: bool = False


@dataclass(frozen=True)
class MetricsSnapshot:
    """Everything one scrape shows: the last Report (None before the first run), the checks that
    are known in advance (their series exist from the start), and the daemon's own counters."""

    report: Report | None
    known_checks: Sequence[str] = ()
    daemon: DaemonStats | None = None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _detail(result: Result | None, key: str) -> float:
    """``result.details[key]`` as a number; NaN when the check did not run or did not say."""
    value = _number(result.details.get(key)) if result is not None else None
    return NAN if value is None else value


def bandwidth_figures(report: Report | None) -> tuple[float, float]:
    """(bus bandwidth in bytes/s, link efficiency ratio) of the last all-reduce, from
    ``Report.bandwidth`` (``busbw_gbps``: GB/s = 1e9 B/s as nccl-tests; ``link_efficiency``: 0..1);
    NaN when not measured."""
    bandwidth = report.bandwidth if report is not None else None
    if not bandwidth:
        return NAN, NAN
    gbps = _number(bandwidth.get("busbw_gbps"))
    efficiency = _number(bandwidth.get("link_efficiency"))
    return (gbps * 1e9 if gbps is not None else NAN,
            efficiency if efficiency is not None else NAN)


#: Top-level fingerprint fields that are versions too; their skew across nodes breaks NCCL jobs
#: as surely as a package's (one node's different NCCL or driver can hang the ring).
FINGERPRINT_VERSION_KEYS = ("python", "cuda", "cudnn", "nccl", "driver")
#: Versions that are the node's own (read from NVML), whatever interpreter was fingerprinted.
NODE_VERSION_KEYS = frozenset({"driver"})

#: ``source`` label values of ``preflight_package_info``: what the versions describe.
SOURCE_NODE = "node"
SOURCE_PREFLIGHT = "preflight"
SOURCE_TRAINING = "training"


def fingerprint_source(fingerprint: Mapping[str, Any] | None) -> str:
    """Whose Python environment a fingerprint describes: ``training`` when it is another
    interpreter's (the ``python`` key / ``--python``: the training environment), ``preflight``
    when it is the environment preflight itself runs in (under the DaemonSet, the daemon's own
    image). Told apart by ``meta.prefix`` (``sys.prefix`` of the fingerprinted interpreter):
    the daemon's check child and a ``--prom-file`` run share this process's interpreter."""
    meta = fingerprint.get("meta") if fingerprint else None
    prefix = meta.get("prefix") if isinstance(meta, Mapping) else None
    return SOURCE_TRAINING if isinstance(prefix, str) and prefix and prefix != sys.prefix \
        else SOURCE_PREFLIGHT


def package_versions(fingerprint: Mapping[str, Any] | None) -> dict[str, tuple[str, str]]:
    """``{package: (version, source)}`` from ``Report.fingerprint``: its ``packages`` mapping
    plus the top-level python/cuda/cudnn/nccl/driver versions; unknown versions (None) are left
    out. ``source`` is ``node`` for the driver, else :func:`fingerprint_source`."""
    if not fingerprint:
        return {}
    env_source = fingerprint_source(fingerprint)
    packages = fingerprint.get("packages")
    items: list[tuple[Any, Any]] = [(k, fingerprint.get(k)) for k in FINGERPRINT_VERSION_KEYS]
    if isinstance(packages, Mapping):
        items += list(packages.items())
    return {name: (str(version), SOURCE_NODE if name in NODE_VERSION_KEYS else env_source)
            for name, version in items
            if isinstance(name, str) and name and isinstance(version, (str, int, float))
            and not isinstance(version, bool)}


def gpu_counts(result: Result | None) -> tuple[float, float]:
    """(GPUs that answer, GPUs expected) from the ``gpu_visible`` result; NaN when unknown.

    Visible counts the entries of ``details["gpus"]`` without an ``error`` (a lost GPU is listed
    but does not answer), 0 when NVML is unavailable; expected is ``details["expected"]`` (None =
    not configured).
    """
    if result is None:
        return NAN, NAN
    gpus = result.details.get("gpus")
    if isinstance(gpus, list):
        visible = float(sum(1 for g in gpus if isinstance(g, Mapping) and not g.get("error")))
    else:
        visible = 0.0 if result.reason == "NvmlUnavailable" else NAN
    return visible, _detail(result, "expected")


def memlock_limit(result: Result | None) -> float:
    """The ``memlock`` check's soft limit in bytes: +Inf when unlimited, NaN when not checked."""
    if result is None or result.status is Status.SKIP or "soft_bytes" not in result.details:
        return NAN
    soft = _number(result.details["soft_bytes"])
    return math.inf if result.details["soft_bytes"] is None else soft if soft is not None else NAN


def gpu_speed_metrics(result: Result | None) -> Iterator[Metric]:
    """Per-GPU figures of the last gpu_speed run (``details["gpu_speed"]["gpus"]``); no series
    for a GPU or kind not measured (a SKIP leaves the families empty)."""
    ratio = GaugeMetricFamily(
        "preflight_gpu_speed_ratio", "Each GPU's figure of the last gpu_speed run divided by the "
        "node's median of it (1 = as fast as its peers; FAIL below gpu_speed_slow_fraction).",
        labels=["gpu", "kind"])
    limit = GaugeMetricFamily(
        "preflight_gpu_speed_limit_ratio", "Each GPU's figure divided by its hardware limit "
        "(NVML-derived or the model table; docs/gpu-speed.md).", labels=["gpu", "kind"])
    copy = GaugeMetricFamily(
        "preflight_gpu_copy_bandwidth_bytes_per_second", "Last measured copy bandwidth per GPU: "
        "d2d (read + write), h2d and d2h from pinned host memory.", labels=["gpu", "kind"])
    flops = GaugeMetricFamily(
        "preflight_gpu_matmul_flops_per_second", "Last measured dense bf16 matrix-multiply "
        "throughput per GPU.", labels=["gpu", "kind"])
    data = result.details.get("gpu_speed") if result is not None else None
    for gpu in data.get("gpus", ()) if isinstance(data, Mapping) else ():
        for kind, fig in dict(gpu.get("figures", {})).items():
            label = [str(gpu.get("index")), str(kind)]
            for family, key in ((ratio, "median_ratio"), (limit, "limit_fraction")):
                value = _number(fig.get(key))
                if value is not None:
                    family.add_metric(label, value)
            value = _number(fig.get("value"))
            if value is not None:
                if kind == "gemm":
                    flops.add_metric(label, value * 1e12)
                else:
                    copy.add_metric(label, value * 1e9)
    yield ratio
    yield limit
    yield copy
    yield flops


class ReportCollector(Collector):
    """A custom collector: ``collect()`` yields metric families from ``source()``'s snapshot."""

    def __init__(self, source: Callable[[], MetricsSnapshot]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        snap = self._source()
        report = snap.report
        results = {r.check: r for r in report.results} if report else {}
        checks = list(dict.fromkeys([*snap.known_checks, *results]))

        status = GaugeMetricFamily(
            "preflight_check_status",
            "Verdict of each check of the last run, one-hot over pass/skip/warn/error/fail "
            "(all 0 before the first run).", labels=["check", "status"])
        duration = GaugeMetricFamily(
            "preflight_check_duration_seconds", "Time each check of the last run took.",
            labels=["check"])
        result_info = InfoMetricFamily(
            "preflight_check_result", "Verdict, reason token and scope (node, job, undecided) "
            "of each check of the last run.", labels=["check"])
        for check in checks:
            result = results.get(check)
            for s in Status:
                hot = result is not None and result.status is s
                status.add_metric([check, s.word], 1.0 if hot else 0.0)
            duration.add_metric([check], result.duration_s if result else 0.0)
            if result is not None:
                result_info.add_metric([check], {"status": result.status.word,
                                                 "reason": result.reason,
                                                 "scope": result.scope.value})
        yield status
        yield duration
        yield result_info

        yield GaugeMetricFamily(
            "preflight_node_healthy",
            "1 when the last run found no node fault (no FAIL of scope node: what the prolog "
            "drains on; a job's own setting and an ERROR do not count); 0 otherwise and before "
            "the first run.", value=1.0 if node_healthy(report) else 0.0)
        yield GaugeMetricFamily(
            "preflight_node_undecided",
            "1 when a check of the last run ended in ERROR (preflight could not decide it: a "
            "crash, a deadline, its own bug); 0 otherwise and before the first run.",
            value=1.0 if node_undecided(report) else 0.0)
        yield GaugeMetricFamily(
            "preflight_last_run_timestamp_seconds",
            "Unix time the last node-check run finished; 0 = no run yet.",
            value=report.timestamp_s if report else 0.0)

        busbw, efficiency = bandwidth_figures(report)
        yield GaugeMetricFamily(
            "preflight_allreduce_bus_bandwidth_bytes_per_second",
            "All-reduce bus bandwidth at the largest size of the last bandwidth test "
            "(nccl-tests busbw); NaN until measured.", value=busbw)
        yield GaugeMetricFamily(
            "preflight_allreduce_link_efficiency_ratio",
            "Last all-reduce busbw divided by the theoretical link bandwidth read from NVML; "
            "NaN until measured.", value=efficiency)

        yield from gpu_speed_metrics(results.get(GPU_SPEED))

        shm = results.get(SHM)
        yield GaugeMetricFamily("preflight_shm_size_bytes", "Size of /dev/shm; NaN if unknown.",
                                value=_detail(shm, "size_bytes"))
        yield GaugeMetricFamily("preflight_shm_free_bytes",
                                "Free space in /dev/shm; NaN if unknown.",
                                value=_detail(shm, "free_bytes"))
        yield GaugeMetricFamily(
            "preflight_memlock_limit_bytes",
            "Locked-memory limit (ulimit -l) on a node with RDMA ports; +Inf = unlimited; NaN "
            "when not checked (no RDMA port).", value=memlock_limit(results.get(MEMLOCK)))
        visible, expected = gpu_counts(results.get(GPU_VISIBLE))
        yield GaugeMetricFamily("preflight_gpu_visible", "GPUs NVML sees and that answer; NaN if "
                                "unknown.", value=visible)
        yield GaugeMetricFamily("preflight_gpu_expected", "GPUs this node must show (expect_gpus); "
                                "NaN when not configured or unknown.", value=expected)

        yield from _xid_metrics(results.get(XID), snap.daemon)
        yield from _fabric_metrics(results.get(FABRIC))

        fingerprint = report.fingerprint if report is not None else None
        packages = InfoMetricFamily(
            "preflight_package",
            "Version of each watched package of the fingerprinted environment (one series "
            "each); source: node (the driver), preflight (the environment preflight runs in; "
            "under the DaemonSet its image), training (the interpreter of the python key).",
            labels=["package"])
        for name, (version, source) in sorted(package_versions(fingerprint).items()):
            packages.add_metric([name], {"version": version, "source": source})
        yield packages
        fp_info = InfoMetricFamily("preflight_fingerprint",
                                   "sha256 of the canonical environment fingerprint; source as "
                                   "in preflight_package_info.")
        sha = fingerprint.get("sha256") if fingerprint else None
        if isinstance(sha, str) and sha:
            fp_info.add_metric([], {"sha256": sha, "source": fingerprint_source(fingerprint)})
        yield fp_info
        yield InfoMetricFamily("preflight_build", "Version of cluster-preflight serving this.",
                               value={"version": __version__})

        if snap.daemon is not None:
            yield from _daemon_metrics(snap.daemon, checks)


def node_healthy(report: Report | None) -> bool:
    """No FAIL of scope node in ``report`` (None = no run yet: not healthy). A job's own setting
    (scope job) and an ERROR (undecided) leave the node healthy, as the prolog leaves it
    undrained: one crashed worker or a preflight bug must not mark a fleet unhealthy."""
    return report is not None and not any(
        r.status is Status.FAIL and r.scope is Scope.NODE for r in report.results)


def node_undecided(report: Report | None) -> bool:
    """A check of ``report`` ended in ERROR: preflight could not decide it."""
    return report is not None and any(r.status is Status.ERROR for r in report.results)


def xid_counts(result: Result | None) -> dict[tuple[str, int], int]:
    """``{(gpu, code): count}`` from the ``xid`` check's ``details["xids"]``."""
    found: dict[tuple[str, int], int] = {}
    entries = result.details.get("xids") if result is not None else None
    for entry in entries if isinstance(entries, list) else ():
        if not isinstance(entry, Mapping):
            continue
        gpu, code, n = entry.get("gpu"), _number(entry.get("xid")), _number(entry.get("count"))
        if isinstance(gpu, str) and code is not None and n is not None:
            found[(gpu, int(code))] = found.get((gpu, int(code)), 0) + int(n)
    return found


def _xid_metrics(result: Result | None, daemon: DaemonStats | None) -> Iterator[Metric]:
    counts = xid_counts(result)
    if daemon is not None and daemon.xid_watching and daemon.xid_counts is not None:
        # Per key the larger: events the watcher saw since the last check run, and log lines
        # it missed (logged before its catch-up read finished its registration).
        for key, n in daemon.xid_counts.items():
            counts[key] = max(n, counts.get(key, 0))
    family = CounterMetricFamily(
        "preflight_xid_errors",
        "NVIDIA Xid errors per GPU (NVML index, or PCI address when NVML does not see it) and "
        "Xid code: the kernel log since boot (preflight check), plus NVML Xid events since the "
        "daemon started (preflight serve). Codes and classes: docs/checks.md#xid.",
        labels=["gpu", "xid"])
    for (gpu, code), n in sorted(counts.items()):
        family.add_metric([gpu, str(code)], n)
    yield family
    if daemon is not None:
        yield GaugeMetricFamily(
            "preflight_xid_events_watching",
            "1 when the daemon receives NVML Xid events as they happen; 0 when it cannot (NVML "
            "missing, no GPU supports them): Xids then show only at each check run.",
            value=1.0 if daemon.xid_watching else 0.0)


def _fabric_metrics(result: Result | None) -> Iterator[Metric]:
    ports = result.details.get("ports") if result is not None else None
    active = GaugeMetricFamily(
        "preflight_ib_port_active",
        "1 when the InfiniBand / RoCE port is ACTIVE with physical state LinkUp, else 0.",
        labels=["device", "port", "link_layer"])
    rate = GaugeMetricFamily(
        "preflight_ib_port_rate_bytes_per_second",
        "Rate the port trained at (sysfs rate, Gb/s / 8); NaN when unreadable.",
        labels=["device", "port"])
    expected = GaugeMetricFamily(
        "preflight_ib_port_expected_rate_bytes_per_second",
        "Rate the port should train at: fabric_expected_rate_gbps, else the best active port of "
        "the node with the same link layer; NaN when unknown.", labels=["device", "port"])
    for entry in ports if isinstance(ports, list) else ():
        if not isinstance(entry, Mapping) or not isinstance(entry.get("port"), str):
            continue
        device, _, num = str(entry["port"]).rpartition(":")
        up = entry.get("state") == "ACTIVE" and entry.get("phys_state") == "LinkUp"
        active.add_metric([device, num, str(entry.get("link_layer", ""))], 1.0 if up else 0.0)
        for family, key in ((rate, "rate_gbps"), (expected, "expected_rate_gbps")):
            gbps = _number(entry.get(key))
            family.add_metric([device, num], gbps * 1e9 / 8 if gbps is not None else NAN)
    yield active
    yield rate
    yield expected


def _daemon_metrics(stats: DaemonStats, checks: Sequence[str]) -> Iterator[Metric]:
    yield CounterMetricFamily("preflight_runs", "Check runs finished by this daemon.",
                              value=stats.runs_total)
    errors = CounterMetricFamily("preflight_check_errors",
                                 "Runs in which a check ended in ERROR (crashed, deadline passed).",
                                 labels=["check"])
    for check in list(dict.fromkeys([*checks, *stats.check_errors_total])):
        errors.add_metric([check], stats.check_errors_total.get(check, 0))
    yield errors
    yield GaugeMetricFamily(
        "preflight_config_reload_success",
        "1 when the last (re)load of the config file worked; 0 when the daemon kept the old "
        "config because the new one was unreadable or invalid.",
        value=1.0 if stats.config_reload_success else 0.0)
    yield GaugeMetricFamily(
        "preflight_allreduce_last_run_timestamp_seconds",
        "Unix time the last bandwidth test finished; 0 = none yet.",
        value=stats.bandwidth_timestamp_s)
    yield GaugeMetricFamily(
        "preflight_check_interval_seconds",
        "Configured seconds between node-check runs (interval_s); results older than three "
        "intervals are stale.", value=stats.interval_s)


def make_registry(source: Callable[[], MetricsSnapshot]) -> CollectorRegistry:
    """A fresh registry holding only our collector (no process/platform/GC collectors, and no
    ``_created`` series: custom families only emit them when given a creation time)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ReportCollector(source))
    return registry


def render(snapshot: MetricsSnapshot) -> bytes:
    """The text exposition format (0.0.4) of ``snapshot``."""
    return generate_latest(make_registry(lambda: snapshot))


def write_textfile(report: Report, path: str | os.PathLike[str], *,
                   known_checks: Sequence[str] = ()) -> None:
    """Write ``report``'s metrics for node_exporter's textfile collector, by the rules of
    :mod:`preflight.outputs.textfile` (atomic rename over a regular file; a device, FIFO or
    directory is refused; a failed write leaves no stale verdict).

    Raises:
        TextfileError: not written; the caller says so on stderr and keeps its verdict.
    """
    write_metrics_file(path, render(MetricsSnapshot(report=report, known_checks=known_checks)))


__all__ = ["DaemonStats", "MetricsSnapshot", "ReportCollector", "TextfileError", "make_registry",
           "render", "write_textfile"]
