"""The gpu_speed check's verdicts with the measurement replaced by a fixture (as NVML is)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from preflight.checks import gpu_speed
from preflight.core.config import Config
from preflight.core.context import Context
from preflight.core.result import Status
from preflight.gpuspeed.probe import FIXTURE_ENV, SpeedFailure
from preflight.probes.gpu import FixtureGpuProbe, GpuSnapshot
from tests.gpuspeed.nodes import H200, IDLE, node, run_of, write_run

SLOW_GEMM = {**H200, "gemm": 335.6}


class TwoReads:
    """NVML before the run, then again after it (clocks under load)."""

    def __init__(self, before: GpuSnapshot, after: GpuSnapshot) -> None:
        self.reads = [before, after]

    def snapshot(self) -> GpuSnapshot:
        return self.reads.pop(0) if len(self.reads) > 1 else self.reads[0]


def ctx_for(tmp_path: Path, run: object, snap: GpuSnapshot | None = None,
            probe: object = None, **config: object) -> Context:
    env = {FIXTURE_ENV: str(write_run(tmp_path / "speed.json", run))}  # type: ignore[arg-type]
    return Context(config=Config().replace(**config), env=env,
                   gpu_probe=probe or FixtureGpuProbe(snap or node()))  # type: ignore[arg-type]


def test_two_healthy_h200s_pass_with_each_figure_as_a_fraction_of_its_limit(
        tmp_path: Path) -> None:
    res = gpu_speed.run(ctx_for(tmp_path, run_of([H200, H200])))
    assert res.status is Status.PASS and res.reason == "GpuSpeedOk"
    assert "GPU 0: d2d 4,224 (0.88), h2d 55 (0.88), d2h 55 (0.88), gemm 787 (0.74)" in res.message
    fig = res.details["gpu_speed"]["gpus"][1]["figures"]["gemm"]
    assert fig["limit"] == pytest.approx(1070.6, abs=0.1) and fig["median_ratio"] == 1.0
    assert fig["limit_fraction"] == pytest.approx(0.735, abs=0.001)


def test_a_slow_gpu_fails_naming_it_the_figure_the_median_and_nvmls_why(tmp_path: Path) -> None:
    loaded = dataclasses.replace(IDLE, sm_clock_mhz=1545, power_w=694.0, temperature_c=58,
                                 clock_reasons=("SwPowerCap",))
    after = node(per_gpu={1: {"clocks": loaded, "compute_pids": (2220,)}})
    res = gpu_speed.run(ctx_for(tmp_path, run_of([H200, SLOW_GEMM]),
                                probe=TwoReads(node(), after)))
    assert res.status is Status.FAIL and res.reason == "GpuSlow"
    msg = res.message
    assert msg.startswith("GPU 1 (0000:00:07.0, GPU-11a0c1f2-7d3e-4b5a-9c8d-0e1f2a3b4c01) is slow:")
    assert "matrix multiply 335.6 TFLOP/s, 0.31 of 1,071 TFLOP/s" in msg
    assert "= 0.60 x the node median 561.3" in msg and "FAIL below 0.8 x median" in msg
    assert "clock event reasons SwPowerCap; SM clock 1545/1980 MHz" in msg
    assert "power limit 700 W, drawing 694 W; 58 C; other processes on it: pid 2220" in msg
    assert "GPU 0 (" not in msg  # the fast one is not named
    assert "nvidia-smi -q -d PERFORMANCE,CLOCK,POWER,TEMPERATURE -i 1" in res.remedy
    assert res.details["gpu_speed"]["gpus"][1]["slow"] == ["gemm"]


def test_a_lowered_power_limit_is_shown_against_its_default(tmp_path: Path) -> None:
    capped = dataclasses.replace(IDLE, power_limit_w=350.0, clock_reasons=("SwPowerCap",))
    snap = node(per_gpu={0: {"clocks": capped}})
    res = gpu_speed.run(ctx_for(tmp_path, run_of([SLOW_GEMM, H200]), snap))
    assert res.reason == "GpuSlow" and "power limit 350 W (default 700 W)" in res.message


def test_the_slow_fraction_is_a_config_key(tmp_path: Path) -> None:
    res = gpu_speed.run(ctx_for(tmp_path, run_of([H200, SLOW_GEMM]),
                                gpu_speed_slow_fraction=0.5))
    # 0.60 of the median passes 0.5; 0.31 of its limit still warns.
    assert res.status is Status.WARN and res.reason == "GpuBelowLimit"


def test_a_whole_node_below_its_limits_warns_without_a_slow_gpu(tmp_path: Path) -> None:
    half = {k: v * 0.45 for k, v in H200.items()}
    res = gpu_speed.run(ctx_for(tmp_path, run_of([half, half])))
    assert res.status is Status.WARN and res.reason == "GpuBelowLimit"
    assert "device copy 1,900.8 GB/s, 0.39 of 4,814 GB/s" in res.message
    assert "(WARN below 0.5 of the limit)" in res.message


def test_one_gpu_is_judged_against_its_limits_only(tmp_path: Path) -> None:
    res = gpu_speed.run(ctx_for(tmp_path, run_of([SLOW_GEMM]), node(1)))
    assert res.status is Status.WARN and "matrix multiply 335.6" in res.message
    assert "1 GPU measured: no peer to compare with" in res.message


def test_a_gpu_in_use_is_not_measured(tmp_path: Path) -> None:
    snap = node(per_gpu={1: {"compute_pids": (4242,)}})
    res = gpu_speed.run(ctx_for(tmp_path, run_of([H200, H200]), snap))
    assert res.status is Status.SKIP and res.reason == "GpusBusy"
    assert "GPU 1 (pid 4242)" in res.message


def test_a_stalled_worker_fails_and_a_died_one_is_undecided(tmp_path: Path) -> None:
    stalled = SpeedFailure("stalled", "the worker for GPU 1, 0000:00:07.0 stalled in gemm",
                           ("0000:00:07.0",))
    res = gpu_speed.run(ctx_for(tmp_path, run_of([H200], stalled)))
    assert res.status is Status.FAIL and res.reason == "GpuStalled"
    assert "GPU 1, 0000:00:07.0 stalled in gemm" in res.message and "Xid" in res.remedy
    died = SpeedFailure("died", "the worker for GPU 0 killed by SIGKILL in init", ("x",),
                        "Traceback ...\nMemoryError")
    res = gpu_speed.run(ctx_for(tmp_path, run_of([], died)))
    assert res.status is Status.ERROR and res.reason == "WorkerDied"
    assert res.message.endswith(" | last output: MemoryError")
    assert "preflight bench --gpu --debug" in res.remedy


def test_no_engine_skips_with_the_install_line(tmp_path: Path) -> None:
    missing = SpeedFailure("engine", "the GPU speed test needs cuda-bindings and cuda-pathfinder "
                           "or torch, which /venv/bin/python cannot import")
    res = gpu_speed.run(ctx_for(tmp_path, run_of([], missing)))
    assert res.status is Status.SKIP and res.reason == "EngineMissing"
    assert res.message == f"no GPU speed test: {missing.message}"
    assert "pip install 'cluster-preflight[gpuspeed]'" in res.remedy and "--python" in res.remedy


def test_without_nvml_it_skips(tmp_path: Path) -> None:
    res = gpu_speed.run(ctx_for(tmp_path, run_of([H200]),
                                GpuSnapshot(available=False, error="no driver")))
    assert res.status is Status.SKIP and res.reason == "NvmlUnavailable"


def test_a_bad_fixture_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{\"measures\": [{\"bus_id\": 1}]}")
    ctx = Context(config=Config(), env={FIXTURE_ENV: str(bad)}, gpu_probe=FixtureGpuProbe(node()))
    with pytest.raises(RuntimeError, match=r"GPU speed fixture .*bad\.json unusable"):
        gpu_speed.run(ctx)
