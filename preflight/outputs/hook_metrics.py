"""The Slurm hooks' own metrics for ``--prom-file``: what the prolog or epilog did about the
node, as node_exporter textfile series labelled ``hook`` (prolog, epilog).

The prolog's file also carries the check metrics of :mod:`preflight.outputs.prom`; the epilog's
carries only these, so the two files can sit in one textfile directory without a series twice.
A value that this run did not learn (the fleet was not counted) is NaN, not 0.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CollectorRegistry, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from preflight.core.slurm import HookOutcome

NAN = float("nan")
#: Kept in the short file a failed ``--prom-file`` write leaves (with the node verdict's): what
#: the hook did to the node, and when.
ESSENTIAL_HOOK_FAMILIES = ("preflight_slurm_hook_last_run_timestamp_seconds",
                           "preflight_slurm_config_ok", "preflight_slurm_drained",
                           "preflight_slurm_would_drain", "preflight_slurm_drain_held_back")


def _opt(value: float | None) -> float:
    return NAN if value is None else float(value)


class HookCollector(Collector):
    """Yields the ``preflight_slurm_*`` families of one :class:`HookOutcome`."""

    def __init__(self, outcome: HookOutcome) -> None:
        self._o = outcome

    def collect(self) -> Iterator[Metric]:
        o = self._o
        hook = [o.hook]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=["hook"])
            family.add_metric(hook, value)
            return family

        yield gauge("preflight_slurm_hook_last_run_timestamp_seconds",
                    "Unix time the Slurm hook (prolog, epilog) last finished.", o.timestamp_s)
        yield gauge("preflight_slurm_hook_duration_seconds",
                    "Seconds the hook's last run took, from its process start.", o.duration_s)
        yield gauge("preflight_slurm_hook_budget_seconds",
                    "The hook's time budget (prolog_budget_s).", o.budget_s)
        yield gauge("preflight_slurm_config_ok",
                    "0 when a configuration error stopped the hook's checks (the job ran "
                    "unchecked); 1 otherwise.", 1.0 if o.config_ok else 0.0)
        yield gauge("preflight_slurm_report_only",
                    "1 when the hook runs with --report-only (drains and resumes nothing).",
                    1.0 if o.report_only else 0.0)
        yield gauge("preflight_slurm_drained",
                    "1 when the hook's last run drained this node.", 1.0 if o.drained else 0.0)
        yield gauge("preflight_slurm_would_drain",
                    "1 when a --report-only run would have drained this node.",
                    1.0 if o.would_drain else 0.0)
        yield gauge("preflight_slurm_drain_held_back",
                    "1 when the fleet guard held back a drain: more than max_drain_fraction of "
                    "the cluster is already drained by preflight (or the count failed).",
                    1.0 if o.held_back else 0.0)
        yield gauge("preflight_slurm_resumed",
                    "1 when --resume resumed this node in the hook's last run.",
                    1.0 if o.resumed else 0.0)
        yield gauge("preflight_slurm_fleet_nodes",
                    "Nodes sinfo listed at the fleet guard's count; NaN when not counted.",
                    _opt(o.fleet_nodes))
        yield gauge("preflight_slurm_fleet_drained_by_preflight_nodes",
                    "Nodes drained with a 'preflight:' reason at the fleet guard's count; NaN "
                    "when not counted.", _opt(o.fleet_drained))
        yield gauge("preflight_slurm_consecutive_passes",
                    "Consecutive passing runs recorded in state_dir; NaN when unknown.",
                    _opt(o.passes))
        for name, (doc, value) in sorted(_counts(o).items()):
            yield gauge(f"preflight_slurm_{name}", doc, value)
        info = InfoMetricFamily("preflight_slurm_hook_result",
                                "Verdict and reason of each check of the hook's last run.",
                                labels=["hook", "check"])
        for r in o.report.results if o.report is not None else ():
            info.add_metric([o.hook, r.check], {"status": r.status.word, "reason": r.reason,
                                                "scope": r.scope.value})
        yield info


_COUNT_DOCS = {
    "shm_files_removed": "Files of the job's user the epilog removed from /dev/shm (no process "
                         "held them).",
    "gpu_leftover_processes": "Compute processes still on the job's GPUs after the job (the "
                              "epilog drains the node for them).",
}


def _counts(o: HookOutcome) -> dict[str, tuple[str, float]]:
    return {k: (_COUNT_DOCS.get(k, k.replace("_", " ")), v) for k, v in o.counts.items()}


def render_hook(outcome: HookOutcome) -> bytes:
    """The text exposition of ``outcome``'s families alone (their names never clash with the
    check metrics', so the prolog appends them to those)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(HookCollector(outcome))
    return generate_latest(registry)


__all__ = ["ESSENTIAL_HOOK_FAMILIES", "HookCollector", "render_hook"]
