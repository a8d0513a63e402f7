"""The real CLI as an operator runs it: exit codes, JSON contract, table, golden report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests import topologies
from tests.helpers import REPO, cli_json, run_cli, write_fixture

GOLDEN = REPO / "tests" / "golden" / "check_8xh100.json"


@pytest.fixture
def h100(tmp_path: Path) -> Path:
    return write_fixture(tmp_path / "nvml.json", topologies.healthy_8x_h100())


def test_pass_exits_0(h100: Path) -> None:
    rc, data = cli_json(["check", "--only", "gpu_visible,nccl_env"], fixture=h100)
    assert rc == 0
    assert data["status"] == "pass" and data["schema_version"] == 1
    assert {r["check"] for r in data["results"]} == {"gpu_visible", "nccl_env"}


def test_a_healthy_node_with_skipped_checks_is_pass(h100: Path) -> None:
    """#14 point 2: outside a job launcher_env and master_port SKIP; the node is still PASS, in the
    JSON, in the table footer and in the exit code. SKIP only when nothing applied."""
    only = ["check", "--only", "gpu_visible,launcher_env,master_port"]
    rc, data = cli_json(only, fixture=h100)
    assert [r["status"] for r in data["results"]] == ["pass", "skip", "skip"]
    assert (rc, data["status"]) == (0, "pass")
    table = run_cli(only, fixture=h100)
    assert table.stdout.rstrip().splitlines()[-1].endswith(": PASS (1 pass, 2 skip)")
    rc, data = cli_json(["check", "--only", "launcher_env,master_port"], fixture=h100)
    assert (rc, data["status"]) == (0, "skip")


def test_a_job_fault_exits_1_and_says_whose_fault(h100: Path) -> None:
    rc, data = cli_json(["check", "--only", "cuda_devices"], fixture=h100,
                        env={"CUDA_VISIBLE_DEVICES": "0,1,0"})
    assert (rc, data["status"]) == (1, "fail")
    assert (data["results"][0]["reason"], data["results"][0]["scope"]) == ("CvdDuplicate", "job")


def test_warn_exits_0_and_strict_turns_it_into_1(h100: Path) -> None:
    env = {"NCCL_P2P_DISABLE": "1"}
    rc, data = cli_json(["check", "--only", "nccl_env"], fixture=h100, env=env)
    assert (rc, data["status"]) == (0, "warn")
    rc, _ = cli_json(["check", "--only", "nccl_env", "--strict"], fixture=h100, env=env)
    assert rc == 1


def test_fail_exits_1(tmp_path: Path) -> None:
    fixture = write_fixture(tmp_path / "lost.json", topologies.lost_gpu(3))
    rc, data = cli_json(["check", "--only", "gpu_visible"], fixture=fixture)
    assert (rc, data["status"]) == (1, "fail")
    assert data["results"][0]["reason"] == "GpuLost"


def test_error_exits_3_and_names_the_check(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    rc, data = cli_json(["check", "--only", "gpu_visible"], fixture=broken)
    assert (rc, data["status"]) == (3, "error")
    r = data["results"][0]
    assert r["check"] == "gpu_visible" and r["reason"] == "CheckCrashed"
    assert "broken.json" in r["message"]


def test_expect_gpus_zero_skips_gpu_checks_without_a_driver(tmp_path: Path) -> None:
    fixture = write_fixture(tmp_path / "none.json", topologies.no_driver())
    rc, data = cli_json(["check", "--only", "gpu_visible", "--expect-gpus", "0"], fixture=fixture)
    assert (rc, data["results"][0]["status"]) == (0, "skip")
    rc, data = cli_json(["check", "--only", "gpu_visible"], fixture=fixture)
    assert rc == 1 and "libnvidia-ml.so.1 not found" in data["results"][0]["message"]


@pytest.mark.parametrize("args", [["check", "--only", "nope"], ["check", "--skip", "nope"],
                                  ["check", "--expect-gpus", "eight"], ["check", "--bogus"],
                                  ["nonsense"]])
def test_usage_errors_exit_2_without_traceback(args: list[str], h100: Path) -> None:
    proc = run_cli(args, fixture=h100)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stderr.strip()


def test_bad_config_file_exits_2_naming_key_and_file(tmp_path: Path, h100: Path) -> None:
    cfg = tmp_path / "preflight.yaml"
    cfg.write_text("expect_gpu: 8\n")
    proc = run_cli(["check", "--config", str(cfg)], fixture=h100)
    assert proc.returncode == 2
    assert "expect_gpu" in proc.stderr and str(cfg) in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = run_cli(["check"], fixture=h100, env={"PREFLIGHT_CHECK_TIMEOUT_S": "soon"})
    assert proc.returncode == 2 and "check_timeout_s" in proc.stderr


def test_config_file_and_env_override(tmp_path: Path, h100: Path) -> None:
    cfg = tmp_path / "preflight.toml"
    cfg.write_text("expect_gpus = 4\n")
    rc, data = cli_json(["check", "--only", "gpu_visible", "--config", str(cfg)], fixture=h100)
    assert rc == 1 and "expected 4" in data["results"][0]["message"]
    rc, data = cli_json(["check", "--only", "gpu_visible", "--config", str(cfg)], fixture=h100,
                        env={"PREFLIGHT_EXPECT_GPUS": "8"})
    assert rc == 0


def test_table_on_stdout_logs_on_stderr(h100: Path) -> None:
    proc = run_cli(["check", "--only", "gpu_visible,nccl_env", "--log-level", "debug"],
                   fixture=h100, env={"NCCL_ALGO": "Tree"})
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["STATUS", "CHECK", "MESSAGE"]
    assert any(line.startswith("WARN") and "nccl_env" in line for line in lines)
    assert any("fix: unset NCCL_ALGO" in line for line in lines)
    assert "\033[" not in proc.stdout  # no colour when not a terminal


def test_help_explains_every_option_and_check() -> None:
    proc = run_cli(["check", "--help"])
    assert proc.returncode == 0
    for text in ("--expect-gpus", "--no-bandwidth", "--strict", "--root", "--config",
                 "--prom-file", "gpu_visible", "shm", "nccl_env", "exit codes"):
        assert text in proc.stdout
    assert "(default: /)" in proc.stdout


def _normalise(data: dict[str, Any]) -> dict[str, Any]:
    data = {**data, "host": "HOST", "timestamp_s": 0, "version": "VERSION"}
    data["results"] = [{**r, "duration_s": 0} for r in data["results"]]
    return data


def test_golden_json_report(tmp_path: Path, update_golden: bool) -> None:
    """The JSON contract as a file; refresh with ``pytest --update-golden`` and review the diff."""
    fixture = write_fixture(tmp_path / "nvml.json", topologies.healthy_8x_h100())
    env = {"NCCL_ALGO": "Ring", "LOCAL_WORLD_SIZE": "8", "LOCAL_RANK": "0", "RANK": "0",
           "WORLD_SIZE": "8", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
           "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
    checks = "gpu_visible,cuda_devices,launcher_env,nccl_env"
    rc, data = cli_json(["check", "--only", checks], fixture=fixture, env=env)
    got = _normalise(data)
    if update_golden:
        GOLDEN.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
    assert got == json.loads(GOLDEN.read_text()), "run pytest --update-golden and review"
    assert rc == 0
