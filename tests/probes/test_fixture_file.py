"""The NVML snapshot file (``PREFLIGHT_NVML_FIXTURE``): a regular file read bounded, a FIFO read
as a driver that answers late (what the prolog tests use for a hung nvmlInit), anything else
refused; behind the Context's deadline probe a FIFO nobody writes is the driver not answering."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from preflight.probes.gpu import DeadlineGpuProbe, FixtureFileGpuProbe
from tests import topologies


def test_a_fifo_is_read_like_a_late_driver(tmp_path: Path) -> None:
    fifo = tmp_path / "nvml.json"
    os.mkfifo(fifo)
    text = json.dumps(topologies.healthy_8x_h100().to_json())
    writer = threading.Thread(target=fifo.write_text, args=(text,), daemon=True)
    writer.start()
    snap = FixtureFileGpuProbe(fifo).snapshot()
    writer.join(10)
    assert snap.available and len(snap.gpus) == 8


def test_a_fifo_nobody_writes_is_a_driver_that_does_not_answer(tmp_path: Path) -> None:
    fifo = tmp_path / "nvml.json"
    os.mkfifo(fifo)
    snap = DeadlineGpuProbe(FixtureFileGpuProbe(fifo), timeout_s=0.5, longest_s=0.5,
                            driver_warm=lambda: None).snapshot()
    assert not snap.available and snap.unanswered is not None
    with open(fifo, "wb"):  # the reader still waits in open(): let it see the end and go
        pass


@pytest.mark.parametrize("path", ["/dev/zero", "."])
def test_a_device_or_a_directory_is_refused(path: str) -> None:
    with pytest.raises(RuntimeError, match=r"unusable: .*is a (device|directory)"):
        FixtureFileGpuProbe(path).snapshot()
