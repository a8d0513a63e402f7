"""What the CLI prints from input (package versions, NCCL settings, the hostname, fingerprint
files, a check child's stderr, log messages) reaches the terminal printable: control characters
escaped in tables and text, kept as data (escaped as JSON escapes) in JSON."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from preflight.cli import PrintableFormatter
from preflight.core.config import Config
from preflight.daemon import ChildRunner, RunKind
from tests import topologies
from tests.helpers import REPO, run_cli, write_fixture
from tests.venvs import MakeVenv

#: What must never reach a terminal raw: C0 but newline, DEL, C1.
RAW_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")
#: Clears the screen, sets the window title, rings the bell, backspaces over text.
EVIL = "\x1b[2J\x1b]0;pwned\x07\x08\x08"
EVIL_SHOWN = "\\e[2J\\e]0;pwned\\x07\\x08\\x08"


def _printable(text: str) -> None:
    found = RAW_CONTROL.search(text)
    assert found is None, f"raw {found.group()!r} at {found.start()}: {text[:found.start()]!r}"


def test_package_versions_are_escaped_in_text_and_kept_in_json(tmp_path: Path,
                                                               make_venv: MakeVenv) -> None:
    python = make_venv(packages={"numpy": f"1.26.4{EVIL}"}, torch=("2.4.0", None))
    fixture = write_fixture(tmp_path / "gpus.json", topologies.healthy_8x_h100())
    text = run_cli(["fingerprint", "--python", str(python)], fixture=fixture)
    assert text.returncode == 0, text.stderr
    _printable(text.stdout)
    assert f"1.26.4{EVIL_SHOWN}" in text.stdout
    as_json = run_cli(["fingerprint", "--json", "--python", str(python)], fixture=fixture)
    assert "\\u001b[2J" in as_json.stdout  # JSON's own escape
    assert json.loads(as_json.stdout)["packages"]["numpy"] == f"1.26.4{EVIL}"

    # The versions check against a golden file: the table names the hostile version, escaped.
    golden = json.loads(as_json.stdout)
    golden["packages"]["numpy"] = "1.26.4"
    (tmp_path / "golden.json").write_text(json.dumps(golden))
    table = run_cli(["check", "--only", "versions", "--python", str(python), "--golden",
                     str(tmp_path / "golden.json")], fixture=fixture)
    assert table.returncode == 1, table.stdout + table.stderr
    _printable(table.stdout)
    assert f"1.26.4{EVIL_SHOWN}" in table.stdout


def test_nccl_settings_are_escaped_in_the_table(tmp_path: Path) -> None:
    fixture = write_fixture(tmp_path / "gpus.json", topologies.healthy_8x_h100())
    env = {"NCCL_SOCKET_IFNAME": f"eth0{EVIL}", "NCCL_IB_HCA": f"mlx5_0{EVIL}",
           "NCCL_ALGO": f"Ring{EVIL}", "CUDA_VISIBLE_DEVICES": f"0,1{EVIL}"}
    table = run_cli(["check", "--no-bandwidth", "--only", "network,nccl_env,cuda_devices",
                     "--expect-gpus", "8"], env=env, fixture=fixture)
    assert "Traceback" not in table.stderr
    _printable(table.stdout)
    _printable(table.stderr)
    # Shown escaped (the table's \\e, or a message's own repr \\x1b), never raw.
    assert "NCCL_SOCKET_IFNAME='eth0\\x1b[2J" in table.stdout
    assert f"CUDA_VISIBLE_DEVICES=0,1{EVIL_SHOWN}" in table.stdout
    as_json = run_cli(["check", "--json", "--no-bandwidth", "--only", "cuda_devices",
                       "--expect-gpus", "8"], env=env, fixture=fixture)
    assert "\\u001b[2J" in as_json.stdout  # JSON's own escape; the data itself is kept
    assert f"0,1{EVIL}" in json.loads(as_json.stdout)["results"][0]["message"]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                    reason="needs root and unshare for a private hostname")
def test_a_hostile_hostname_is_escaped_in_the_table(tmp_path: Path) -> None:
    fixture = write_fixture(tmp_path / "gpus.json", topologies.healthy_8x_h100())
    name = "node\x1b]0;pwned\x07"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PREFLIGHT_")},
           "PYTHONPATH": str(REPO), "PREFLIGHT_NVML_FIXTURE": str(fixture), "EVIL_HOST": name}
    args = ["check", "--only", "gpu_visible", "--expect-gpus", "8"]
    # sethostname(2) takes any bytes (the hostname tool would refuse these).
    script = ('"$0" -c "import os, socket; socket.sethostname(os.environ[\'EVIL_HOST\'])" && '
              '"$0" -m preflight "$@"')
    proc = subprocess.run(["unshare", "-u", "sh", "-c", script, sys.executable, *args],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    _printable(proc.stdout)
    assert "node\\e]0;pwned\\x07: PASS" in proc.stdout
    js = subprocess.run(["unshare", "-u", "sh", "-c", script, sys.executable, *args, "--json"],
                        env=env, capture_output=True, text=True, timeout=60, check=False)
    assert json.loads(js.stdout)["host"] == name


def test_diff_of_hostile_fingerprint_files_is_printable(tmp_path: Path) -> None:
    made = run_cli(["fingerprint", "--json"])
    assert made.returncode == 0, made.stderr
    base = json.loads(made.stdout)
    a = {**base, "packages": {f"evil{EVIL}": "1.0", "numpy": "1.0"},
         "hashes": {f"/data{EVIL}": "a" * 64}}
    b = {**base, "packages": {f"evil{EVIL}": "1.1", "numpy": f"2.0{EVIL}"},
         "hashes": {f"/data{EVIL}": "b" * 64}}
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    proc = run_cli(["diff", str(tmp_path / "a.json"), str(tmp_path / "b.json")])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    _printable(proc.stdout)
    assert f"evil{EVIL_SHOWN}: 1.0 on A, 1.1 on B" in proc.stdout
    assert f"2.0{EVIL_SHOWN}" in proc.stdout and f"sha256 of /data{EVIL_SHOWN}" in proc.stdout


def test_a_check_childs_stderr_is_quoted_printable(tmp_path: Path) -> None:
    child = tmp_path / "child.py"
    child.write_text("import sys\nsys.stdin.read()\n"
                     f"sys.stderr.write({EVIL + chr(10) + 'preflight: PASS forged'!r})\n"
                     "sys.exit(1)\n")
    runner = ChildRunner(argv_for=lambda kind, config: [sys.executable, str(child)],
                         env=dict(os.environ))
    result = runner(RunKind.NODE, Config(check_timeout_s=2), ["alpha"]).results[0]
    assert result.reason == "RunFailed"
    _printable(result.message)
    assert f"{EVIL_SHOWN}\\npreflight: PASS forged" in result.message


def test_log_lines_are_printable_and_stay_one_line() -> None:
    record = logging.LogRecord("preflight.daemon", logging.WARNING, __file__, 1,
                               "config reload failed: %s", (f"bad{EVIL}\nforged line",), None)
    line = PrintableFormatter("preflight: %(levelname)s %(name)s: %(message)s").format(record)
    assert line == f"preflight: WARNING preflight.daemon: config reload failed: bad{EVIL_SHOWN}" \
                   "\\nforged line"
