from __future__ import annotations

import threading
import time

import pytest

from preflight.core.check import Check
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


def test_serial_checks_run_one_after_the_other_each_with_its_own_deadline(
        make_ctx: MakeCtx) -> None:
    events: list[str] = []

    def step(name: str, seconds: float) -> Check:
        def run(ctx: Context) -> Result:
            events.append(f"start {name}")
            time.sleep(seconds)
            events.append(f"end {name}")
            return Result(name, Status.PASS, "Fine", "fine")
        # Each deadline is shorter than both together: they count from each one's own start.
        return Check(name, run, "", timeout_s=lambda ctx: 2.0, serial="gpu",
                     prepare=lambda ctx: events.append(f"prepare {name}"))

    report = run_checks(make_ctx(), [step("a", 1.2), Check("ok", _ok, ""), step("b", 1.2)])
    assert [r.status for r in report.results] == [Status.PASS] * 3
    assert events == ["prepare a", "prepare b", "start a", "end a", "start b", "end b"]


def test_a_serial_check_past_its_deadline_names_its_call_and_the_next_never_starts(
        make_ctx: MakeCtx) -> None:
    release = threading.Event()
    started: list[str] = []

    def hang(ctx: Context) -> Result:
        with activity("the GPU speed workers"):
            release.wait(30)
        return Result("first", Status.PASS, "Late", "late")

    def second(ctx: Context) -> Result:
        started.append("second")
        return Result("second", Status.PASS, "Fine", "fine")

    checks = [Check("first", hang, "", timeout_s=lambda ctx: 0.5,
                    timeout_key="gpu_speed_timeout_s", serial="gpu"),
              Check("second", second, "", timeout_s=lambda ctx: 0.5, serial="gpu")]
    report = run_checks(make_ctx(), checks)
    release.set()
    time.sleep(0.2)  # the first returns now: the second must still not start
    first, later = report.results
    assert (first.status, first.reason) == (Status.ERROR, "CheckTimeout")
    assert "still waiting on: the GPU speed workers" in first.message
    assert first.remedy.endswith("or raise gpu_speed_timeout_s.")  # the key that sets it
    assert (later.status, later.reason) == (Status.ERROR, "CheckTimeout")
    assert later.message.startswith("second did not run: first, before it in the 'gpu' checks")
    assert later.details["waited_for"] == "first" and started == []


def test_a_prepare_that_raises_is_its_checks_crash_and_the_others_still_run(
        make_ctx: MakeCtx) -> None:
    def broken(ctx: Context) -> None:
        raise OSError("no NVML")

    checks = [Check("a", _ok, "", serial="gpu"),
              Check("b", _ok, "", serial="gpu", prepare=broken)]
    a, b = run_checks(make_ctx(), checks).results
    assert a.status is Status.PASS
    assert (b.status, b.reason) == (Status.ERROR, "CheckCrashed") and "no NVML" in b.message


def test_the_gpu_tests_are_declared_one_after_the_other_speed_first() -> None:
    from preflight.checks import CHECKS, GPU_LOAD_CHECKS

    gpu = [c for c in CHECKS if c.serial is not None]
    assert [c.name for c in gpu] == ["gpu_speed", "allreduce"]
    assert {c.serial for c in gpu} == {"gpu"} and set(GPU_LOAD_CHECKS) == {c.name for c in gpu}
    assert gpu[1].prepare is not None  # the all-reduce says it follows, to share the workers
