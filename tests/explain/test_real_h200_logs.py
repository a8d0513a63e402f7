"""Logs that real torchrun + NCCL 2.28.9 (torch 2.11) printed on the lent H200 machine on
2026-11-29 (scripts/device/h200_single.sh): a healthy start-up and three induced failures."""

from __future__ import annotations

import pytest

from tests.explain.test_samples import explain, reasons


@pytest.mark.parametrize(("name", "expected"), [
    ("real-h200-ok.log", []),
    ("real-h200-iface.log", ["NoSocketInterface", "NcclSystemError"]),
    ("real-h200-dup.log", ["DuplicateGpu", "NcclSystemError"]),
    ("real-h200-ord.log", ["InvalidDeviceOrdinal"]),
])
def test_real_nccl_logs_are_classified_cause_first(name: str, expected: list[str]) -> None:
    assert reasons(explain(name)) == expected


def test_real_duplicate_gpu_names_both_ranks() -> None:
    dup = explain("real-h200-dup.log").findings[0]
    assert sorted(dup.ranks) == [0, 1]
