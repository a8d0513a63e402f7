"""`preflight bench` and the `allreduce` check as a user runs them: exit codes, JSON, SKIPs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from preflight.checks import CHECKS, allreduce
from preflight.core.runner import select
from preflight.probes.gpu import GpuSnapshot
from tests import topologies
from tests.helpers import run_cli, write_fixture


def _fixture(tmp_path: Path, snap: GpuSnapshot) -> dict[str, str]:
    return {"PREFLIGHT_NVML_FIXTURE": str(write_fixture(tmp_path / "nvml.json", snap))}


def test_gloo_sweep_json_follows_the_cli_contract(tmp_path: Path) -> None:
    env = _fixture(tmp_path, topologies.no_driver())
    proc = run_cli(["bench", "--nproc", "2", "--max-bytes", "2M", "--json"], env=env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["backend"] == "gloo" and out["world_size"] == 2  # no GPU -> gloo by default
    assert [r["size_bytes"] for r in out["rows"]] == [1 << 20, 2 << 20]
    for row in out["rows"]:
        assert set(row) >= {"size_bytes", "time_s", "algbw_gbps", "busbw_gbps", "correct"}
        assert row["correct"] is True and row["busbw_gbps"] > 0
    assert out["status"] == "pass" and out["reason"] == "AllreduceOk"
    assert out["busbw_gbps"] == pytest.approx(out["rows"][-1]["busbw_gbps"], rel=1e-3)


def test_gloo_table_and_slow_verdict_exit_1(tmp_path: Path) -> None:
    env = _fixture(tmp_path, topologies.no_driver())
    proc = run_cli(["bench", "--backend", "gloo", "--min-bytes", "64K", "--max-bytes", "128K",
                    "--min-busbw", "100000", "--debug"], env=env)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("# preflight bench: gloo, 2 ranks")
    assert any(line.split()[:2] == ["65536", "16384"] for line in lines)
    assert "FAIL BusbwLow" in proc.stdout and "floor 100000 GB/s (--min-busbw)" in proc.stdout
    assert "worker output (NCCL_DEBUG=INFO) kept in" in proc.stderr
    kept = Path(proc.stderr.split("kept in ")[1].split()[0])
    assert (kept / "rank0.log").is_file() and (kept / "rank1.log").is_file()
    for f in kept.iterdir():
        f.unlink()
    kept.rmdir()


def test_single_gpu_node_skips(tmp_path: Path) -> None:
    env = _fixture(tmp_path, topologies.single_h200_vm())
    proc = run_cli(["bench"], env=env)
    assert proc.returncode == 0
    assert "SKIP NotEnoughGpus: the all-reduce test needs at least 2 GPUs; 1 visible" \
        in proc.stdout


@pytest.mark.parametrize("args, text", [
    (["--nproc", "1", "--backend", "gloo"], "--nproc must be >= 2"),
    (["--backend", "gloo", "--min-bytes", "8M", "--max-bytes", "1M"], "larger than --max-bytes"),
    (["--max-bytes", "lots"], "not a size: 'lots'"),
    (["--backend", "nccl", "--nproc", "16"], "only 8 GPU(s) are visible"),
])
def test_bad_input_exits_2_without_traceback(tmp_path: Path, args: list[str], text: str) -> None:
    proc = run_cli(["bench", *args], env=_fixture(tmp_path, topologies.healthy_8x_h100()))
    assert proc.returncode == 2
    assert text in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("snap, reason, text", [
    (topologies.no_driver(), "NvmlUnavailable", "NVML is not available"),
    (topologies.single_h200_vm(), "NotEnoughGpus", "needs at least 2 GPUs; 1 visible"),
    (topologies.snapshot([topologies.h100(0, "0000:18:00.0", compute_pids=(4242,)),
                          topologies.h100(1, "0000:2a:00.0")]), "GpusBusy", "GPU 0 (pid 4242)"),
    (topologies.snapshot([topologies.h100(0, "0000:18:00.0"),
                          topologies.h100(1, "0000:2a:00.0", compute_mode="PROHIBITED")]),
     "ComputeProhibited", "GPU 1 in compute mode PROHIBITED"),
])
def test_allreduce_check_skips_with_reason(make_ctx, snap, reason, text) -> None:  # type: ignore[no-untyped-def]
    result = allreduce.run(make_ctx(snapshot=snap))
    assert result.status.word == "skip"
    assert result.reason == reason
    assert text in result.message


def test_allreduce_check_is_registered_with_its_own_deadline(make_ctx) -> None:  # type: ignore[no-untyped-def]
    check = next(c for c in CHECKS if c.name == "allreduce")
    ctx = make_ctx(bench_timeout_s=50.0)
    assert check.timeout_s is not None and check.timeout_s(ctx) == 65.0
    assert "allreduce" not in {c.name for c in select(CHECKS, skip=["allreduce"])}


def test_check_no_bandwidth_skips_it(tmp_path: Path) -> None:
    env = _fixture(tmp_path, topologies.healthy_8x_h100())
    proc = run_cli(["check", "--json", "--no-bandwidth", "--only", "allreduce"], env=env)
    assert json.loads(proc.stdout)["results"] == []
    proc = run_cli(["check", "--json", "--only", "allreduce"],
                   env=_fixture(tmp_path, topologies.single_h200_vm()))
    out = json.loads(proc.stdout)
    assert [(r["check"], r["status"], r["reason"]) for r in out["results"]] == \
        [("allreduce", "skip", "NotEnoughGpus")]


def test_workers_run_under_the_named_interpreter(tmp_path: Path) -> None:
    """--python runs the workers in another environment (the training venv); one without torch
    gives an ERROR that names it, what it lacks and the way out."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=60)
    python = venv / "bin" / "python"
    proc = run_cli(["bench", "--backend", "gloo", "--max-bytes", "1M", "--python", str(python),
                    "--json"], timeout=90)
    assert proc.returncode == 3, proc.stderr
    data = json.loads(proc.stdout)
    assert data["reason"] == "EngineMissing"
    assert data["message"] == f"the all-reduce test needs torch, which {python} cannot import."
    assert "--python" in data["remedy"] and data["environment"]["torch"] is None


def test_plan_reads_cuda_visible_devices_as_cuda_does(make_ctx) -> None:  # type: ignore[no-untyped-def]
    """The ranks are named by the GPUs CUDA really exposes (the cuda_devices parser), not by a
    count of comma-separated entries."""
    from preflight.bench import plan

    stops = plan(make_ctx(env={"CUDA_VISIBLE_DEVICES": "0,-1,1"}), backend="nccl")
    assert stops.skip is not None and stops.skip.reason == "NotEnoughGpus"
    assert "1 visible" in stops.skip.message
    swapped = plan(make_ctx(env={"CUDA_VISIBLE_DEVICES": "5,2"}), backend="nccl")
    assert swapped.options is not None
    assert swapped.options.labels == ("GPU 5, 0000:ab:00.0", "GPU 2, 0000:3a:00.0")
    dup = plan(make_ctx(env={"CUDA_VISIBLE_DEVICES": "0,0"}), backend="nccl")
    assert dup.skip is not None and "0 visible" in dup.skip.message


def test_hidden_gpus_do_not_turn_the_test_into_a_cpu_run(make_ctx) -> None:  # type: ignore[no-untyped-def]
    """CUDA_VISIBLE_DEVICES that leaves no GPU on a GPU node SKIPs the NCCL test (seen on the
    H200 with '0,0': it used to fall back to gloo on the CPU and PASS)."""
    from preflight.bench import plan

    for value in ("0,0", ""):
        p = plan(make_ctx(env={"CUDA_VISIBLE_DEVICES": value}))
        assert p.skip is not None and p.skip.backend == "nccl", value
        assert p.skip.reason == "NotEnoughGpus"
    no_driver = plan(make_ctx(snapshot=topologies.no_driver()))
    assert no_driver.options is not None and no_driver.options.backend == "gloo"
