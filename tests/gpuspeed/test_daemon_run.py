"""The daemon runs gpu_speed with the all-reduce (idle GPUs only), and the NVML facts it judges
with survive a snapshot file."""

from __future__ import annotations

import dataclasses
import json
import types
from collections.abc import Sequence

from preflight.core.config import Config
from preflight.core.result import Report, Result, Status
from preflight.daemon import ChildRunner, Daemon, RunKind, running
from preflight.daemon.child import run_deadline_s
from preflight.probes.gpu import GpuSnapshot
from preflight.probes.nvml import NvmlGpuProbe
from tests import topologies
from tests.gpuspeed.nodes import IDLE, node
from tests.serve.conftest import get, samples, wait_for


def test_the_bandwidth_run_carries_both_gpu_load_tests_and_the_node_run_neither() -> None:
    runner = ChildRunner()
    bw = runner.default_argv(RunKind.BANDWIDTH, Config())
    assert bw[-2:] == ["--only", "allreduce,gpu_speed"]
    assert runner.default_argv(RunKind.NODE, Config())[-1] == "--no-bandwidth"
    cfg = Config(bench_timeout_s=100, gpu_speed_timeout_s=20)
    assert run_deadline_s(RunKind.BANDWIDTH, cfg, grace_s=5) == 125


class Runner:
    def __init__(self) -> None:
        self.expected: dict[RunKind, Sequence[str]] = {}

    def __call__(self, kind: RunKind, config: Config, expected: Sequence[str]) -> Report:
        self.expected[kind] = tuple(expected)
        if kind is RunKind.BANDWIDTH:
            speed = {"gpus": [{"index": 3, "figures": {"gemm": {"value": 400.0,
                                                               "median_ratio": 0.5}}}]}
            return Report(results=(
                Result("allreduce", Status.PASS, "AllreduceOk", "fast"),
                Result("gpu_speed", Status.FAIL, "GpuSlow", "GPU 3 is slow",
                       details={"gpu_speed": speed})))
        return Report(results=tuple(Result(c, Status.PASS, "Ok", "fine") for c in expected))

    def kill(self) -> None:
        pass


def test_the_daemon_shows_the_last_gpu_speed_run_between_node_runs() -> None:
    runner = Runner()
    d = Daemon(Config(listen="127.0.0.1:0", interval_s=0.1, bandwidth_interval_s=0.2),
               runner=runner, gpus=topologies.healthy_8x_h100,
               known_checks=("shm", "allreduce", "gpu_speed"))
    with running(d):
        wait_for(lambda: RunKind.BANDWIDTH in runner.expected and
                 len(runner.expected) == 2, timeout_s=30, what="a node and a bandwidth run")
        host, port = d.address
        m = samples(get(f"http://{host}:{port}/metrics").text)
    assert runner.expected[RunKind.BANDWIDTH] == ("allreduce", "gpu_speed")
    assert runner.expected[RunKind.NODE] == ("shm",)
    assert m['preflight_check_status{check="gpu_speed",status="fail"}'] == 1
    assert m['preflight_gpu_speed_ratio{gpu="3",kind="gemm"}'] == 0.5


def test_nvml_clocks_power_and_reasons_are_read_and_survive_json() -> None:
    nv = types.SimpleNamespace(
        NVML_CLOCK_SM=0, NVML_CLOCK_MEM=2,
        nvmlDeviceGetClockInfo=lambda h, c: 1545,
        nvmlDeviceGetMaxClockInfo=lambda h, c: {0: 1980, 2: 3201}[c],
        nvmlDeviceGetMemoryBusWidth=lambda h: 6016,
        nvmlDeviceGetPowerUsage=lambda h: 694_000,
        nvmlDeviceGetEnforcedPowerLimit=lambda h: 350_000,
        nvmlDeviceGetPowerManagementDefaultLimit=lambda h: 700_000)
    clocks = NvmlGpuProbe._clocks(nv, lambda fn, *a: fn(*a), None, 0x4 | 0x1 | 0x40, 58)
    assert clocks.clock_reasons == ("GpuIdle", "SwPowerCap", "HwThermalSlowdown")
    assert (clocks.sm_clock_mhz, clocks.max_sm_clock_mhz, clocks.max_mem_clock_mhz) == \
        (1545, 1980, 3201)
    assert (clocks.power_w, clocks.power_limit_w, clocks.default_power_limit_w) == \
        (694.0, 350.0, 700.0)
    snap = node()
    gpus = list(snap.gpus)
    gpus[1] = dataclasses.replace(gpus[1], clocks=clocks)
    snap = dataclasses.replace(snap, gpus=tuple(gpus))
    back = GpuSnapshot.from_json(json.loads(json.dumps(snap.to_json())))
    assert back == snap and back.gpus[0].clocks == IDLE
