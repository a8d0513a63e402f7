from __future__ import annotations

import pytest

from preflight.core.result import ExitCode, Report, Result, Status, exit_code, worst


def test_statuses_order_worst_wins() -> None:
    assert worst([Status.PASS, Status.SKIP]) is Status.SKIP
    assert worst([Status.WARN, Status.ERROR, Status.PASS]) is Status.ERROR
    assert worst([Status.ERROR, Status.FAIL]) is Status.FAIL
    assert worst([]) is Status.PASS


@pytest.mark.parametrize(("status", "strict", "code"), [
    (Status.PASS, False, ExitCode.OK),
    (Status.SKIP, False, ExitCode.OK),
    (Status.WARN, False, ExitCode.OK),
    (Status.WARN, True, ExitCode.FAILED),
    (Status.ERROR, False, ExitCode.UNDECIDED),
    (Status.ERROR, True, ExitCode.UNDECIDED),
    (Status.FAIL, False, ExitCode.FAILED),
])
def test_exit_code_contract(status: Status, strict: bool, code: ExitCode) -> None:
    assert exit_code(status, strict=strict) is code


def test_report_json_round_trip_uses_lower_case_statuses() -> None:
    report = Report(results=(
        Result("shm", Status.FAIL, "ShmTooSmall", "/dev/shm is 64 MiB", "--shm-size=16g",
               {"size_bytes": 64 << 20}),
        Result("nccl_env", Status.PASS, "NcclEnvOk", "fine"),
    ), host="node1", timestamp_s=1.0, version="0.1.0")
    data = report.to_json()
    assert data["schema_version"] == 1
    assert data["status"] == "fail"
    assert [r["status"] for r in data["results"]] == ["fail", "pass"]
    back = Report.from_json(data)
    assert back.results == report.results
    assert back.status is Status.FAIL


def test_report_from_json_rejects_other_schema() -> None:
    with pytest.raises(ValueError, match="schema_version"):
        Report.from_json({"schema_version": 99, "results": []})


def test_a_node_whose_applicable_checks_passed_is_pass() -> None:
    """#14 point 2: SKIP only when nothing applied; a SKIP beside a PASS does not hide it."""
    def report(*statuses: Status) -> Report:
        return Report(results=tuple(Result(f"c{i}", s, "R", "m") for i, s in enumerate(statuses)))

    assert report(Status.PASS, Status.SKIP, Status.SKIP).status is Status.PASS
    assert report(Status.SKIP, Status.SKIP).status is Status.SKIP
    assert report(Status.SKIP, Status.WARN).status is Status.WARN
    assert report(Status.PASS, Status.SKIP, Status.FAIL).status is Status.FAIL
    assert exit_code(report(Status.PASS, Status.SKIP).status) is ExitCode.OK


def test_fold_lists_every_reason_worst_first_with_remedies_once() -> None:
    from preflight.core.result import Finding, Scope, fold

    r = fold("x", [Finding(Status.WARN, "Slow", "slow.", "fix a"),
                   Finding(Status.FAIL, "Broken", "broken", "fix b", Scope.JOB),
                   Finding(Status.FAIL, "Gone", "gone", "fix a")],
             ok_reason="Ok", summary="all fine", details={"k": 1})
    assert (r.status, r.reason, r.scope) == (Status.FAIL, "Broken", Scope.NODE)
    assert r.message == "broken; gone; slow"
    assert r.remedy == "fix b; fix a"
    assert r.details == {"k": 1, "reasons": ["Broken", "Gone", "Slow"]}
    only_job = fold("x", [Finding(Status.FAIL, "Broken", "b", "", Scope.JOB)], ok_reason="Ok",
                    summary="")
    assert only_job.scope is Scope.JOB
    ok = fold("x", [], ok_reason="Ok", summary="all fine")
    assert (ok.status, ok.reason, ok.message) == (Status.PASS, "Ok", "all fine")
