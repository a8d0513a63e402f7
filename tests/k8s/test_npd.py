"""The node-problem-detector custom plugin of deploy/node-problem-detector/: its rule's command
run by the real CLI on replayed nodes, judged as NPD judges a plugin (exit 0 OK, 1 NonOK, any
other Unknown; the first ``max_output_length`` characters of standard output as the message)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from preflight.commands.check import summary_line
from preflight.core.result import Report, Result, Status
from tests.helpers import REPO, run_cli, write_fixture
from tests.topologies import healthy_8x_h100, lost_gpu

PLUGIN = REPO / "deploy" / "node-problem-detector" / "preflight-plugin.json"


def plugin() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(PLUGIN.read_text())
    return data


def seconds(text: str) -> float:
    m = re.fullmatch(r"(\d+)(s|m)", text)
    assert m, text
    return int(m.group(1)) * (60 if m.group(2) == "m" else 1)


def npd(rc: int, stdout: str, limit: int) -> tuple[str, str]:
    """What NPD makes of one plugin run: (status, message)."""
    status = {0: "OK", 1: "NonOK"}.get(rc, "Unknown")
    return status, stdout.strip()[:limit]


def run_rule(tmp_path: Path, fixture: Path, **env: str) -> tuple[str, str, str]:
    config = plugin()
    (rule,) = config["rules"]
    assert rule["path"] == "/opt/preflight/bin/preflight", "the image's entry point"
    args = list(rule["args"])
    args[args.index("--root") + 1] = str(tmp_path)  # the host as the NPD pod mounts it
    proc = run_cli(args, fixture=fixture, env=env)
    status, message = npd(proc.returncode, proc.stdout, config["pluginConfig"][
        "max_output_length"])
    return status, message, proc.stdout


@pytest.fixture
def host(tmp_path: Path) -> Path:
    (tmp_path / "dev" / "shm").mkdir(parents=True)
    return tmp_path


def test_the_plugin_config_is_what_npd_reads() -> None:
    config = plugin()
    assert config["plugin"] == "custom"
    pc = config["pluginConfig"]
    assert pc["max_output_length"] == 80
    assert seconds(pc["timeout"]) < seconds(pc["invoke_interval"])
    (cond,) = config["conditions"]
    (rule,) = config["rules"]
    assert rule["type"] == "permanent" and rule["condition"] == cond["type"]
    # a type of its own: the daemon never overwrites a condition it did not set, and the two
    # writers can run side by side
    from preflight.daemon.kube import CONDITION_TYPE, HEALTHY_REASON

    assert cond["type"] == "PreflightCheckFailed" != CONDITION_TYPE
    assert cond["reason"] == HEALTHY_REASON
    # the run's own deadlines end well inside the plugin's timeout (10 s per check + start-up)
    assert seconds(rule["timeout"]) >= 30


def test_a_healthy_node_is_ok(host: Path) -> None:
    status, message, out = run_rule(host, write_fixture(host / "good.json", healthy_8x_h100()),
                                    PREFLIGHT_EXPECT_GPUS="8")
    assert status == "OK", out
    assert message.startswith("preflight PASS") or message.startswith("preflight WARN"), message


def test_a_lost_gpu_is_nonok_with_the_reason_in_the_80_characters(host: Path) -> None:
    status, message, out = run_rule(host, write_fixture(host / "bad.json", lost_gpu(3)))
    assert status == "NonOK"
    assert "gpu_visible GpuLost" in message
    assert out.count("\n") == 1 and len(out.rstrip("\n")) <= 80, "one line that fits whole"


def test_an_undecided_run_is_unknown_never_nonok(host: Path) -> None:
    status, message, _ = run_rule(host, write_fixture(host / "good.json", healthy_8x_h100()),
                                  PREFLIGHT_CHECK_TIMEOUT_S="0.001")
    assert status == "Unknown"
    assert message.startswith("preflight ERROR:")


def test_the_summary_line_is_cut_to_fit() -> None:
    many = Report(results=tuple(Result(f"check_{i}", Status.FAIL, "SomethingQuiteLongBroke", "m")
                                for i in range(10)))
    line = summary_line(many)
    assert len(line) == 80 and line.endswith("...")
    assert line.startswith("preflight FAIL: check_0 SomethingQuiteLongBroke, check_1")
    hostile = Report(results=(Result("x", Status.FAIL, "Bad\nsecond line\x1b[2J", "m"),))
    assert "\n" not in summary_line(hostile) and "\x1b" not in summary_line(hostile)


def test_summary_and_json_exclude_each_other() -> None:
    proc = run_cli(["check", "--summary", "--json"])
    assert proc.returncode == 2
    assert "not allowed with argument" in proc.stderr
