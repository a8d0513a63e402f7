"""The daemon's hooks for the node-status writer: every node run is counted on the merged report,
the writer's series are in /metrics, a SIGHUP does not change its settings under it."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.core import GaugeMetricFamily, Metric

from preflight.core.config import Config
from preflight.core.result import Report, Result, Status
from preflight.daemon import Daemon, RunKind, running
from tests.serve.conftest import get, wait_for
from tests.topologies import healthy_8x_h100


class Runner:
    def __call__(self, kind: RunKind, config: Config, expected: Sequence[str]) -> Report:
        if kind is RunKind.BANDWIDTH:
            return Report(results=(Result("gpu_speed", Status.FAIL, "GpuSlow", "GPU 2"),))
        return Report(results=tuple(Result(c, Status.PASS, "Ok", "fine") for c in expected))

    def kill(self) -> None:
        pass


class RecordingWriter:
    """Stands in for preflight.daemon.kube.NodeStatus: records what the daemon hands it."""

    def __init__(self) -> None:
        self.seen: list[Report] = []
        self.started = self.stopped = False

    def observe(self, report: Report) -> None:
        self.seen.append(report)  # the real one only counts and wakes its thread

    def start(self) -> None:
        self.started = True

    def stop(self, timeout_s: float = 1.0) -> None:
        self.stopped = True

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("preflight_kube_write_success", "test", value=0.0)


def test_each_node_run_is_counted_on_the_merged_report_and_metrics_show_the_writer() -> None:
    writer = RecordingWriter()
    config = Config(listen="127.0.0.1:0", interval_s=0.05, bandwidth_interval_s=0.2,
                    kube_node_status=True, kube_fail_runs=4)
    changed = Config(listen="127.0.0.1:0", interval_s=0.05, kube_node_status=True,
                     kube_fail_runs=9, kube_node_taint=True)
    daemon = Daemon(config, runner=Runner(), known_checks=["gpu_visible", "gpu_speed"],
                    bandwidth=True, gpus=healthy_8x_h100,
                    node_status=writer,  # type: ignore[arg-type]
                    load_config=lambda: changed)
    with running(daemon):
        assert writer.started
        wait_for(lambda: len(writer.seen) >= 3, timeout_s=10, what="node runs counted")
        # after a bandwidth run, a node run's report carries its gpu_speed FAIL too
        wait_for(lambda: any(r.result("gpu_speed") for r in writer.seen), timeout_s=10,
                 what="the merged report")
        host, port = daemon.address
        text = get(f"http://{host}:{port}/metrics").text
        assert "preflight_kube_write_success 0.0" in text
        assert "preflight_runs_total" in text
        assert daemon.reload()
        assert daemon.config.kube_fail_runs == 4, "kube_* keys need a restart"
        assert daemon.config.kube_node_taint is False
        assert get(f"http://{host}:{port}/healthz").status == 200
    assert writer.stopped
