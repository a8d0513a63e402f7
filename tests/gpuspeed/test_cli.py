"""`preflight bench --gpu`, `preflight check` and the metrics as a user sees them."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from preflight.core.result import Report, Result, Status
from preflight.gpuspeed.probe import FIXTURE_ENV, GpuMeasure, SpeedFailure, SpeedRun
from preflight.outputs.prom import MetricsSnapshot, render
from tests.gpuspeed.nodes import H200, node, run_of, write_run
from tests.helpers import run_cli, write_fixture


def _env(tmp_path: Path, run: SpeedRun, **snap_changes: object) -> dict[str, str]:
    return {"PREFLIGHT_NVML_FIXTURE": str(write_fixture(tmp_path / "nvml.json", node())),
            FIXTURE_ENV: str(write_run(tmp_path / "speed.json", run))}


def test_bench_gpu_table_marks_the_slow_gpu_and_exits_1(tmp_path: Path) -> None:
    proc = run_cli(["bench", "--gpu"], env=_env(tmp_path, run_of([H200, {**H200, "d2d": 2158.2}])))
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:2] == ["GPU", "PCI"]
    assert "2,158.2 (0.45)*" in lines[2] and "4,224.0 (0.88) " in lines[1]
    assert any(line.startswith("# FAIL GpuSlow: GPU 1 (0000:00:07.0") for line in lines)
    assert any(line.startswith("# fix: Drain the node") for line in lines)


def test_bench_gpu_json_and_check_with_no_bandwidth(tmp_path: Path) -> None:
    env = _env(tmp_path, run_of([H200, H200]))
    proc = run_cli(["bench", "--gpu", "--json"], env=env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["status"] == "pass" and [g["index"] for g in out["gpus"]] == [0, 1]
    assert out["gpus"][0]["figures"]["h2d"]["limit_source"] == "PCIe Gen5 x16"
    proc = run_cli(["check", "--no-bandwidth", "--json", "--only", "gpu_visible,gpu_speed"],
                   env=env)
    names = [r["check"] for r in json.loads(proc.stdout)["results"]]
    assert names == ["gpu_visible"]


def test_a_bad_fraction_exits_2_with_one_line(tmp_path: Path) -> None:
    env = {**_env(tmp_path, run_of([H200])), "PREFLIGHT_GPU_SPEED_SLOW_FRACTION": "1.5"}
    proc = run_cli(["bench", "--gpu"], env=env)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "gpu_speed_slow_fraction must be a finite number in 0.001..1, got 1.5" in proc.stderr


def test_metrics_give_each_gpu_and_kind_its_ratio_to_the_median(tmp_path: Path) -> None:
    from preflight.checks import gpu_speed
    from tests.gpuspeed.test_check import ctx_for

    res = gpu_speed.run(ctx_for(tmp_path, run_of([H200, {**H200, "gemm": 393.5}])))
    report = Report(results=(res,), host="n1", timestamp_s=1.0, version="t", mode="check")
    text = render(MetricsSnapshot(report=report)).decode()
    assert 'preflight_gpu_speed_ratio{gpu="1",kind="gemm"} 0.6667' in text
    assert 'preflight_gpu_speed_ratio{gpu="0",kind="d2d"} 1.0' in text
    assert 'preflight_gpu_speed_limit_ratio{gpu="0",kind="h2d"} 0.8777' in text
    assert 'preflight_gpu_matmul_flops_per_second{gpu="0",kind="gemm"} 7.87e+14' in text
    assert 'preflight_gpu_copy_bandwidth_bytes_per_second{gpu="1",kind="d2d"} 4.224e+12' in text
    skipped = Report(results=(Result("gpu_speed", Status.SKIP, "GpusBusy", "busy"),), host="n1",
                     timestamp_s=1.0, version="t", mode="check")
    assert "preflight_gpu_speed_ratio{" not in render(MetricsSnapshot(report=skipped)).decode()


_kinds = st.sampled_from(["h2d", "d2h", "d2d", "gemm"])
_figs = st.dictionaries(_kinds, st.floats(0.001, 1e6, allow_nan=False), min_size=1)


@given(st.lists(st.tuples(st.from_regex(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]",
                                        fullmatch=True), _figs), max_size=8),
       st.one_of(st.none(), st.builds(SpeedFailure, st.sampled_from(["stalled", "died"]),
                                      st.text(max_size=40))))
def test_a_speed_run_survives_its_json(measures: list[tuple[str, dict[str, float]]],
                                       failure: SpeedFailure | None) -> None:
    run = SpeedRun(tuple(GpuMeasure(b, f) for b, f in measures), failure, 1.5)
    assert SpeedRun.from_json(json.loads(json.dumps(run.to_json()))) == run
