"""What ships next to the daemon: the systemd unit (systemd-analyze). The alert rules, runbooks
and the dashboard are tested in tests/alerts."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.serve.conftest import REPO

UNIT = REPO / "systemd" / "preflight.service"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze missing")
def test_systemd_unit_verifies_without_any_warning(tmp_path: Path) -> None:
    """systemd-analyze verify exits 0 on unknown keys (it only warns), so any stderr fails.
    verify wants ExecStart's file to exist: an executable stand-in takes its place."""
    preflight = tmp_path / "preflight"
    preflight.write_text("#!/bin/sh\nexit 0\n")
    preflight.chmod(0o755)
    text = UNIT.read_text()
    assert "Type=notify" in text and "WatchdogSec=" in text and "Restart=on-failure" in text
    assert "DeviceAllow=char-nvidia-frontend rw" in text
    assert not re.search(r"^PrivateDevices=", text, re.M)  # it would hide the GPUs
    unit = tmp_path / "preflight.service"
    unit.write_text(text.replace("/usr/local/bin/preflight", str(preflight)))
    verify = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                            text=True, timeout=60, check=False)
    assert verify.returncode == 0 and verify.stderr == "", verify.stderr
    # --threshold is on the 0..100 scale of the printed 0..10 exposure: 40 = "4.0 OK" at most.
    security = subprocess.run(["systemd-analyze", "security", "--offline=yes",
                               "--threshold=40", str(unit)], capture_output=True, text=True,
                              timeout=60, check=False)
    assert security.returncode == 0, security.stdout[-2000:] + security.stderr
