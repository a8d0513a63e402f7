from __future__ import annotations

import threading
import time

import pytest

from preflight.checks.base import Check
from preflight.core.context import Context, activity
from preflight.core.result import Result, Status
from preflight.core.runner import SelectionError, run_checks, select
from tests.conftest import MakeCtx


def _ok(ctx: Context) -> Result:
    return Result("ok", Status.PASS, "Fine", "fine")


def _boom(ctx: Context) -> Result:
    raise OSError("cannot read /sys/bus/pci")


def test_a_crashing_check_is_an_error_not_a_failure(make_ctx: MakeCtx) -> None:
    report = run_checks(make_ctx(), [Check("ok", _ok, ""), Check("boom", _boom, "")])
    assert [r.check for r in report.results] == ["ok", "boom"]
    boom = report.result("boom")
    assert boom is not None
    assert boom.status is Status.ERROR
    assert boom.reason == "CheckCrashed"
    assert "cannot read /sys/bus/pci" in boom.message
    assert report.status is Status.ERROR


def test_a_hanging_check_times_out_naming_what_it_waited_on(make_ctx: MakeCtx) -> None:
    release = threading.Event()

    def hang(ctx: Context) -> Result:
        with activity("NVML query of GPU 3"):
            release.wait(30)
        return Result("hang", Status.PASS, "Late", "late")

    t0 = time.monotonic()
    report = run_checks(make_ctx(check_timeout_s=0.3), [Check("hang", hang, ""),
                                                         Check("ok", _ok, "")])
    elapsed = time.monotonic() - t0
    release.set()
    hung = report.result("hang")
    assert hung is not None and hung.status is Status.ERROR
    assert hung.reason == "CheckTimeout"
    assert "0.3 s" in hung.message and "NVML query of GPU 3" in hung.message
    ok = report.result("ok")
    assert ok is not None and ok.status is Status.PASS
    assert elapsed < 15  # the check hangs for 30 s; its deadline is 0.3 s


def test_checks_run_concurrently_so_deadlines_do_not_add_up(make_ctx: MakeCtx) -> None:
    """Four checks that each wait for all four to have started: they pass only if they run at
    the same time (one after the other, the first would wait alone until the barrier breaks)."""
    together = threading.Barrier(4)

    def meet(ctx: Context) -> Result:
        together.wait(timeout=20)
        return Result("x", Status.PASS, "Fine", "fine")

    report = run_checks(make_ctx(check_timeout_s=30), [Check(f"s{i}", meet, "") for i in range(4)])
    assert [r.status for r in report.results] == [Status.PASS] * 4


def test_select_only_and_skip() -> None:
    checks = [Check(n, _ok, "") for n in ("a", "b", "c")]
    assert [c.name for c in select(checks, only=["a", "c"])] == ["a", "c"]
    assert [c.name for c in select(checks, skip=["b"])] == ["a", "c"]
    with pytest.raises(SelectionError, match="unknown check"):
        select(checks, only=["nope"])


def test_fingerprint_and_bandwidth_details_are_lifted_into_the_report(make_ctx: MakeCtx) -> None:
    def versions(ctx: Context) -> Result:
        return Result("versions", Status.PASS, "VersionsRecorded", "ok",
                      details={"sha256": "ab", "fingerprint": {"torch": "2.13.0"}})

    def allreduce(ctx: Context) -> Result:
        return Result("allreduce", Status.PASS, "AllreduceOk", "ok",
                      details={"busbw_gbps": 330.0, "bandwidth": {"rows": []}})

    report = run_checks(make_ctx(), [Check("versions", versions, ""),
                                     Check("allreduce", allreduce, "")])
    assert report.fingerprint == {"torch": "2.13.0"}
    assert report.bandwidth == {"rows": []}
    assert [dict(r.details) for r in report.results] == [{"sha256": "ab"}, {"busbw_gbps": 330.0}]
