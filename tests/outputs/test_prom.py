"""The metrics a scrape or a textfile shows, from a Report (no daemon, no HTTP)."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from preflight.core.result import Report, Result, Scope, Status
from preflight.outputs.prom import (
    DaemonStats,
    MetricsSnapshot,
    TextfileError,
    render,
    write_textfile,
)
from tests.serve.conftest import REPO, fixture_file, samples

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian: apt-get install prometheus)")


def scrape(report: Report | None, *, known: tuple[str, ...] = ("gpu_visible", "shm"),
           daemon: DaemonStats | None = None) -> dict[str, float]:
    return samples(render(MetricsSnapshot(report, known, daemon or DaemonStats())).decode())


def test_every_series_exists_before_the_first_run_and_says_so() -> None:
    m = scrape(None)
    for check in ("gpu_visible", "shm"):
        for status in ("pass", "skip", "warn", "error", "fail"):
            assert m[f'preflight_check_status{{check="{check}",status="{status}"}}'] == 0
        assert m[f'preflight_check_errors_total{{check="{check}"}}'] == 0
    assert m["preflight_last_run_timestamp_seconds"] == 0
    assert m["preflight_node_healthy"] == 0
    assert m["preflight_runs_total"] == 0
    assert m["preflight_config_reload_success"] == 1
    for unknown in ("preflight_allreduce_bus_bandwidth_bytes_per_second",
                    "preflight_allreduce_link_efficiency_ratio", "preflight_shm_size_bytes",
                    "preflight_shm_free_bytes", "preflight_gpu_visible", "preflight_gpu_expected"):
        assert math.isnan(m[unknown]), unknown
    assert m['preflight_build_info{version="0.1.0"}'] == 1
    assert not any(k.endswith("_created") or "_created{" in k for k in m)


def test_status_is_one_hot_and_health_follows_the_worst() -> None:
    report = Report(results=(
        Result("gpu_visible", Status.PASS, "GpusHealthy", "8 GPUs"),
        Result("shm", Status.FAIL, "ShmTooSmall", "/dev/shm is 64 MiB; need >= 1 GiB",
               details={"size_bytes": 64 << 20, "free_bytes": 60 << 20}, duration_s=0.25),
    ), timestamp_s=1_700_000_000.5)
    m = scrape(report)
    hot = {k: v for k, v in m.items() if k.startswith('preflight_check_status{check="shm"')}
    assert hot == {**{f'preflight_check_status{{check="shm",status="{s}"}}': 0.0
                      for s in ("pass", "skip", "warn", "error")},
                   'preflight_check_status{check="shm",status="fail"}': 1.0}
    assert m['preflight_check_result_info{check="shm",reason="ShmTooSmall",scope="node",'
             'status="fail"}'] == 1
    assert m["preflight_node_healthy"] == 0
    assert m["preflight_shm_size_bytes"] == 64 << 20
    assert m["preflight_shm_free_bytes"] == 60 << 20
    assert m['preflight_check_duration_seconds{check="shm"}'] == 0.25
    assert m["preflight_last_run_timestamp_seconds"] == 1_700_000_000.5

    assert m["preflight_node_undecided"] == 0

    warn_only = Report(results=(Result("shm", Status.WARN, "X", "y"),))
    assert scrape(warn_only)["preflight_node_healthy"] == 1


def test_an_error_is_undecided_not_unhealthy() -> None:
    """An ERROR (a crashed worker, a deadline, the daemon's own RunFailed) says nothing about the
    node: healthy stays 1, the undecided gauge says it; a node FAIL next to it still counts."""
    for reason in ("CheckTimeout", "RunFailed", "WorkerDied"):
        error = Report(results=(
            Result("gpu_visible", Status.PASS, "GpusHealthy", "8 GPUs"),
            Result("shm", Status.ERROR, reason, "could not decide", scope=Scope.UNDECIDED)))
        m = scrape(error)
        assert (m["preflight_node_healthy"], m["preflight_node_undecided"]) == (1, 1), reason
        assert m[f'preflight_check_result_info{{check="shm",reason="{reason}",'
                 'scope="undecided",status="error"}'] == 1
    both = Report(results=(*error.results, Result("xid", Status.FAIL, "XidNodeFault", "79")))
    m = scrape(both)
    assert (m["preflight_node_healthy"], m["preflight_node_undecided"]) == (0, 1)
    assert scrape(None)["preflight_node_undecided"] == 0


def test_bandwidth_gpu_and_version_figures() -> None:
    report = Report(results=(
        Result("gpu_visible", Status.FAIL, "GpuLost", "one lost",
               details={"count": 8, "expected": 8,
                        "gpus": [{"index": i, "error": "lost" if i == 3 else None}
                                 for i in range(8)]}),
        Result("allreduce", Status.PASS, "BusbwOk", "fast"),
    ), fingerprint={"sha256": "ab" * 32, "nccl": "2.28.3", "driver": None,
                    "packages": {"torch": "2.13.0", "numpy": None}},
        bandwidth={"busbw_gbps": 360.5, "link_efficiency": 0.8})
    m = scrape(report)
    assert m["preflight_gpu_visible"] == 7
    assert m["preflight_gpu_expected"] == 8
    assert m["preflight_allreduce_bus_bandwidth_bytes_per_second"] == pytest.approx(360.5e9)
    assert m["preflight_allreduce_link_efficiency_ratio"] == 0.8
    assert m['preflight_package_info{package="torch",source="preflight",version="2.13.0"}'] == 1
    assert m['preflight_package_info{package="nccl",source="preflight",version="2.28.3"}'] == 1
    assert not any('package="numpy"' in k or 'package="driver"' in k for k in m)
    assert m[f'preflight_fingerprint_info{{sha256="{"ab" * 32}",source="preflight"}}'] == 1

    # Only Report.bandwidth counts: a skipped test (no Report.bandwidth) shows nothing, whatever
    # its details say.
    skipped = Report(results=(Result("allreduce", Status.SKIP, "GpusBusy", "job running",
                                     details={"busbw_gbps": 1.0}),))
    assert math.isnan(scrape(skipped)["preflight_allreduce_bus_bandwidth_bytes_per_second"])


def test_package_source_says_whose_environment_the_versions_describe() -> None:
    """The driver is the node's; the rest is preflight's own environment (under the DaemonSet,
    its image) unless another interpreter (the python key: the training one) was fingerprinted.
    Version skew is judged per source, so the daemon image is never compared with a training
    environment."""
    def versions(prefix: str | None) -> dict[str, float]:
        meta = {"prefix": prefix} if prefix is not None else {}
        report = Report(results=(), fingerprint={
            "sha256": "cd" * 32, "driver": "580.1", "python": "3.12.3",
            "packages": {"torch": "2.13.0"}, "meta": meta})
        return {k: v for k, v in scrape(report).items() if k.startswith("preflight_package_info")}

    own = versions(sys.prefix)
    assert own == {'preflight_package_info{package="driver",source="node",version="580.1"}': 1,
                   'preflight_package_info{package="python",source="preflight",version="3.12.3"}'
                   : 1,
                   'preflight_package_info{package="torch",source="preflight",version="2.13.0"}'
                   : 1}
    assert versions(None) == own
    training = versions("/opt/train/venv")
    assert 'preflight_package_info{package="torch",source="training",version="2.13.0"}' in training
    assert 'preflight_package_info{package="driver",source="node",version="580.1"}' in training


def test_a_job_fault_leaves_the_node_healthy() -> None:
    """preflight_node_healthy reflects node faults only: a job's own mistake does not count."""
    job = Report(results=(Result("cuda_devices", Status.FAIL, "CvdDuplicate", "x",
                                 scope=Scope.JOB),))
    assert scrape(job)["preflight_node_healthy"] == 1
    node = Report(results=(*job.results, Result("shm", Status.FAIL, "ShmTooSmall", "y")))
    assert scrape(node)["preflight_node_healthy"] == 0


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=8), children, max_size=3), max_leaves=10)
keys = st.sampled_from(["size_bytes", "free_bytes", "busbw_gbps", "link_efficiency", "gpus",
                        "count", "expected", "fingerprint", "packages", "sha256", "x"])


@settings(max_examples=150, deadline=None)
@given(details=st.dictionaries(keys, json_values, max_size=5),
       fingerprint=st.none() | st.dictionaries(keys, json_values, max_size=4),
       check=st.sampled_from(["shm", "gpu_visible", "allreduce", "versions"]))
def test_any_details_render_without_raising(details: dict[str, object],
                                            fingerprint: dict[str, object] | None,
                                            check: str) -> None:
    """A check's details are free-form JSON: odd shapes give NaN, never a failed scrape."""
    report = Report(results=(Result(check, Status.PASS, "Ok", "m", details=details),),
                    fingerprint=fingerprint, bandwidth=details)
    text = render(MetricsSnapshot(report, (check,), DaemonStats())).decode()
    assert "preflight_node_healthy 1.0" in text


def test_textfile_is_written_atomically_and_world_readable(tmp_path: Path) -> None:
    target = tmp_path / "preflight.prom"
    target.write_text("old content\n")
    report = Report(results=(Result("shm", Status.PASS, "ShmOk", "ok"),))
    write_textfile(report, target)
    text = target.read_text()
    assert 'preflight_check_status{check="shm",status="pass"} 1.0' in text
    # Only the report's metrics: a one-shot run has no daemon counters.
    assert "preflight_runs_total" not in text
    assert os.stat(target).st_mode & 0o777 == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["preflight.prom"]


def test_textfile_in_a_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TextfileError, match=r"missing.*cannot create"):
        write_textfile(Report(results=()), tmp_path / "missing" / "x.prom")


def test_check_prom_file_end_to_end(tmp_path: Path) -> None:
    """``preflight check --prom-file`` writes what node_exporter reads; a bad path is said on
    stderr and leaves the verdict's exit code alone."""
    prom = tmp_path / "preflight.prom"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PREFLIGHT_")},
           "PYTHONPATH": str(REPO), "PREFLIGHT_NVML_FIXTURE": str(fixture_file(tmp_path))}
    run = subprocess.run([sys.executable, "-m", "preflight", "check", "--json", "--no-bandwidth",
                          "--only", "shm", "--prom-file", str(prom)],
                         capture_output=True, env=env, timeout=60, check=False)
    report = json.loads(run.stdout)
    m = samples(prom.read_text())
    assert m[f'preflight_check_status{{check="shm",status="{report["results"][0]["status"]}"}}'] \
        == 1
    assert m["preflight_last_run_timestamp_seconds"] == pytest.approx(report["timestamp_s"],
                                                                      abs=0.01)
    if PROMTOOL:
        lint = subprocess.run([PROMTOOL, "check", "metrics"], input=prom.read_bytes(),
                              capture_output=True, timeout=30, check=False)
        assert lint.returncode == 0, lint.stdout + lint.stderr

    bad = subprocess.run([sys.executable, "-m", "preflight", "check", "--only", "shm",
                          "--prom-file", str(tmp_path / "nope" / "x.prom")],
                         capture_output=True, env=env, timeout=60, check=False)
    assert bad.returncode == run.returncode
    assert b"nope" in bad.stderr
    assert b"Traceback" not in bad.stderr


@needs_promtool
def test_promtool_accepts_a_full_snapshot(tmp_path: Path) -> None:
    report = Report(results=(
        Result("shm", Status.PASS, "ShmOk", "ok", details={"size_bytes": 1, "free_bytes": 1}),
        Result("allreduce", Status.PASS, "BusbwOk", "ok", details={"busbw_gbps": 1.5}),
    ), fingerprint={"sha256": "ef" * 32, "packages": {"torch": "2.13.0"}})
    text = render(MetricsSnapshot(report, ("shm", "allreduce"),
                                  DaemonStats(runs_total=3, check_errors_total={"shm": 1})))
    lint = subprocess.run([str(PROMTOOL), "check", "metrics"], input=text,
                          capture_output=True, timeout=30, check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr


GOLDEN_REPORT = REPO / "tests" / "golden" / "check_8xh100.json"
GOLDEN_METRICS = REPO / "tests" / "golden" / "metrics_8xh100.prom"


def test_golden_metrics(update_golden: bool) -> None:
    """The /metrics contract as a file (as node_exporter's end-to-end test keeps one): the golden
    JSON report plus a bandwidth run, a fingerprint and the daemon's counters. A metric that
    changes shape shows in review; refresh with ``pytest --update-golden`` and read the diff."""
    from preflight.checks import CHECKS

    data = json.loads(GOLDEN_REPORT.read_text())
    report = Report.from_json({
        **data, "timestamp_s": 1_700_000_000.0,
        "bandwidth": {"busbw_gbps": 370.25, "link_efficiency": 0.82},
        "fingerprint": {"sha256": "ab" * 32, "python": "3.12.3", "cuda": "13.0",
                        "nccl": "2.28.9", "driver": "580.159.04",
                        "packages": {"torch": "2.13.0", "numpy": "2.1.0"}}})
    stats = DaemonStats(runs_total=3, check_errors_total={"allreduce": 1},
                        bandwidth_timestamp_s=1_700_000_100.0, interval_s=60.0)
    text = render(MetricsSnapshot(report, tuple(c.name for c in CHECKS), stats)).decode()
    text = text.replace(f'version="{report.version}"', 'version="VERSION"')
    import preflight

    text = text.replace(f'version="{preflight.__version__}"', 'version="VERSION"')
    if update_golden:
        GOLDEN_METRICS.write_text(text)
    assert text == GOLDEN_METRICS.read_text(), "run pytest --update-golden and review the diff"


def test_memlock_limit_gauge() -> None:
    def limit(result: Result) -> float:
        return scrape(Report(results=(result,)))["preflight_memlock_limit_bytes"]

    assert limit(Result("memlock", Status.PASS, "MemlockUnlimited", "ok",
                        details={"soft_bytes": None, "hard_bytes": None})) == math.inf
    assert limit(Result("memlock", Status.WARN, "MemlockLimited", "small",
                        details={"soft_bytes": 65536, "hard_bytes": 65536})) == 65536
    assert math.isnan(limit(Result("memlock", Status.SKIP, "NoRdma", "no RDMA")))
