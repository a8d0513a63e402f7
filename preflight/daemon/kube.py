"""Node status from the daemon: a condition, optionally a taint, on the daemon's own Node.

Off unless ``kube_node_status`` is true (docs/kubernetes.md, "Telling the scheduler"). What it
writes, all under names that are preflight's own:

* the NodeCondition ``PreflightFailed`` (:data:`CONDITION_TYPE`) in ``status.conditions``:
  ``"True"`` once ``kube_fail_runs`` node runs in a row found a node fault (a check FAILed with
  scope node), with the first fault's reason token as ``reason`` and the verdict as
  ``message``; ``"False"`` (reason ``PreflightPassed``) once the node is healthy, and again only
  after ``kube_pass_runs`` healthy runs in a row when it was ``"True"``. A run that could not
  decide (ERROR, a deadline), that skipped everything, or whose only FAIL is the job's own
  setting (scope job) never sets it, and breaks both streaks. Written by a strategic-merge patch
  of ``/api/v1/nodes/NAME/status`` whose list holds this one condition: the API merges
  ``conditions`` by their ``type``, so no other condition is touched.
* with ``kube_node_taint``, the taint ``cluster-preflight/node-fault=<reason>:NoSchedule``
  (:data:`MARK_KEY`), and, when the guard or the taint is on, the label of the same key that the
  guard counts by. Both by a JSON patch of ``/api/v1/nodes/NAME`` that first tests the Node's
  ``resourceVersion`` (``spec.taints`` is an atomic list: a strategic-merge patch would replace
  every taint); removed when the condition clears, each by a patch that tests the exact element
  it removes. A taint or label of any other key, the cordon (``spec.unschedulable``) and every
  other condition are never written.
* an Event (namespace ``default``, as for every event about a Node) for each transition.

The fleet guard: before marking, the daemon counts the nodes that match ``kube_guard_selector``
and those of them that already carry the mark label, as two label-selected lists in the API
server's Table form (names only, no objects) served from its watch cache (``resourceVersion=0``):
a few hundred bytes per node, read only when the node is about to be marked and at most once a
minute while the guard holds. More than ``kube_max_marked_fraction`` of them marked: no mark, a
log line, one Event, ``preflight_kube_guard_holding 1``.

Nothing here runs on the check loop: :meth:`NodeStatus.observe` only counts and wakes the writer
thread, which talks to the API server with a deadline per request and retries with a growing
pause (up to a minute). An API server that is slow, down or refusing costs that thread only;
``preflight_kube_write_success`` says whether the last write worked. Writes happen on a change
of status or reason, and as a heartbeat every ``kube_heartbeat_s`` (default 300 s, the kubelet's
own node-status report period): it refreshes ``lastHeartbeatTime`` (a consumer can tell a stale
condition from a live one) and the message, and repairs a condition that was lost.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import logging
import random
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from preflight.core.config import Config, ConfigError
from preflight.core.result import Report, Scope, Status
from preflight.core.textsafe import escape
from preflight.daemon.kubeapi import (
    JSON_PATCH,
    STRATEGIC_MERGE,
    TABLE,
    KubeApiError,
    KubeClient,
    KubeConfigError,
    find_credentials,
)

log = logging.getLogger(__name__)

#: The NodeCondition type preflight owns: True = the node has a fault preflight found.
CONDITION_TYPE = "PreflightFailed"
#: Reason of the condition while the node is healthy.
HEALTHY_REASON = "PreflightPassed"
#: Key of the taint and of the label that marks a node (a prefix no one else uses).
MARK_KEY = "cluster-preflight/node-fault"
TAINT_EFFECT = "NoSchedule"
#: Events about a cluster-scoped object live in "default" (the API rejects other namespaces).
EVENT_NAMESPACE = "default"
COMPONENT = "cluster-preflight"
#: Longest condition / event message written (the API server has no limit of its own).
MAX_MESSAGE_CHARS = 1024
#: Seconds between two guard reads while the guard holds.
GUARD_RECHECK_S = 60.0
#: Pauses after failed writes, seconds (then the last one again), each with +-20 % jitter so 500
#: daemons that lost the API server together do not come back together.
BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
#: A label value: at most 63 characters of [A-Za-z0-9_.-], alphanumeric at both ends.
_LABEL_VALUE = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?)?$")


class Verdict(enum.Enum):
    """What one node run says about the node, for the condition."""

    FAULT = "fault"
    HEALTHY = "healthy"
    UNDECIDED = "undecided"


@dataclass(frozen=True)
class Observation:
    verdict: Verdict
    reason: str = ""
    message: str = ""


def label_value(text: str) -> str:
    """``text`` as a valid label / taint value (reason tokens are CamelCase already)."""
    value = re.sub(r"[^A-Za-z0-9_.-]", "", text)[:63].strip("_.-")
    return value if _LABEL_VALUE.match(value) else ""


def observe(report: Report) -> Observation:
    """A FAULT when a check FAILed with scope node; HEALTHY when the node's own verdict is PASS
    or WARN (a job-scope FAIL counts as healthy, as in ``preflight_node_healthy``); else
    UNDECIDED (a check ERRORed without a node fault, or every check skipped)."""
    faults = [r for r in report.results if r.status is Status.FAIL and r.scope is Scope.NODE]
    if faults:
        text = "; ".join(f"{r.check} {r.reason}: {r.message}" for r in faults)
        return Observation(Verdict.FAULT, label_value(faults[0].reason) or "PreflightFault",
                           escape(text, MAX_MESSAGE_CHARS))
    if report.node_status in (Status.PASS, Status.WARN):
        return Observation(Verdict.HEALTHY, HEALTHY_REASON, "preflight: no node fault")
    return Observation(Verdict.UNDECIDED)


@dataclass(frozen=True)
class Mark:
    """The condition to write: marked (status "True") or not, with its reason and message."""

    marked: bool
    reason: str
    message: str


class Hysteresis:
    """Consecutive-run counting: marks after ``fail_runs`` faults in a row, clears after
    ``pass_runs`` healthy runs in a row; an UNDECIDED run breaks both streaks. Pure: no I/O.

    ``marked`` is None until the Node's current condition is known (:meth:`adopt`): nothing is
    written before that.
    """

    def __init__(self, fail_runs: int, pass_runs: int) -> None:
        self.fail_runs = fail_runs
        self.pass_runs = pass_runs
        self.fails = 0
        self.passes = 0
        self.marked: bool | None = None
        self.seen_healthy = False
        self.fault = Observation(Verdict.FAULT)
        self.last = Observation(Verdict.UNDECIDED)

    def adopt(self, marked: bool, reason: str = "", message: str = "") -> None:
        self.marked = marked
        if marked:
            self.fault = Observation(Verdict.FAULT, reason, message)
        self._step()

    def feed(self, obs: Observation) -> None:
        self.last = obs
        if obs.verdict is Verdict.FAULT:
            self.fails, self.passes = self.fails + 1, 0
            self.fault = obs
        elif obs.verdict is Verdict.HEALTHY:
            self.fails, self.passes = 0, self.passes + 1
            self.seen_healthy = True
        else:
            self.fails = self.passes = 0
        self._step()

    def _step(self) -> None:
        if self.marked is False and self.fails >= self.fail_runs:
            self.marked = True
        elif self.marked is True and self.passes >= self.pass_runs:
            self.marked = False

    def desired(self, *, on_node: bool) -> Mark | None:
        """What the condition should say now; None = write nothing (not adopted yet, or no
        condition on the node and no healthy run seen)."""
        if self.marked is None:
            return None
        if self.marked:
            return Mark(True, self.fault.reason or "PreflightFault", self.fault.message)
        if not on_node and not self.seen_healthy:
            return None
        return Mark(False, HEALTHY_REASON, "preflight: no node fault")


def _now_rfc3339(wall: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall))


def _pointer(key: str) -> str:
    """A map key as one JSON-pointer segment (RFC 6901: ~ as ~0, / as ~1)."""
    return key.replace("~", "~0").replace("/", "~1")


@dataclass
class _State:
    """What the writer knows; read by scrapes under the lock."""

    write_ok: bool | None = None
    failures: int = 0
    last_ok_wall: float = 0.0
    marked: bool | None = None
    guard_holding: bool = False
    last_error: str = ""


class NodeStatus:
    """The writer: counts runs on the caller's thread, writes on its own.

    Args:
        client: the API client (credentials, deadline per request).
        node: this node's name (``NODE_NAME``, from the Downward API in the chart).
        fail_runs / pass_runs: consecutive runs to set / clear the condition.
        taint: also put the NoSchedule taint while marked.
        max_marked_fraction: the fleet guard; 1 = no guard (no list of nodes, no label).
        guard_selector: label selector of the nodes the guard compares with ("" = all).
        heartbeat_s: seconds between two writes of an unchanged condition.
        guard_recheck_s: seconds between two guard reads while the guard holds.
        clock / wall: monotonic and Unix seconds (tests).
    """

    def __init__(self, client: KubeClient, node: str, *, fail_runs: int = 3,
                 pass_runs: int = 5, taint: bool = False, max_marked_fraction: float = 0.1,
                 guard_selector: str = "", heartbeat_s: float = 300.0,
                 guard_recheck_s: float = GUARD_RECHECK_S,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.client = client
        self.node = node
        self.taint = taint
        self.fraction = max_marked_fraction
        self.guard = max_marked_fraction < 1.0
        self.guard_selector = guard_selector
        self.heartbeat_s = heartbeat_s
        self.guard_recheck_s = guard_recheck_s
        self._clock = clock
        self._wall = wall
        self._h = Hysteresis(fail_runs, pass_runs)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._state = _State()
        # What the Node carries, as far as this writer knows (adopted, then what it wrote).
        self._uid = ""
        self._on_node: Mark | None = None
        self._transition_stamp = ""
        self._written_at: float | None = None
        self._retry_at = 0.0
        self._backoff = 0
        self._guard_at: float | None = None
        self._guard_reported = False

    # ---- the check loop's side: no I/O ------------------------------------------------------

    def observe(self, report: Report) -> None:
        """Count one node run (the merged report, as ``preflight_node_healthy`` sees it) and wake
        the writer; returns at once."""
        obs = observe(report)
        with self._lock:
            self._h.feed(obs)
        self._wake.set()

    # ---- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="kube-node-status", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 1.0) -> None:
        """Stop the writer (a request in flight ends at its own deadline; the thread is a daemon
        thread and does not hold up the exit). The mark stays as it is on the Node."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    # ---- the writer thread ------------------------------------------------------------------

    def _due_in(self) -> float:
        now = self._clock()
        waits = [self._retry_at - now] if self._retry_at > now else []
        if self._written_at is not None:
            waits.append(self._written_at + self.heartbeat_s - now)
        if self._state.guard_holding and self._guard_at is not None:
            waits.append(self._guard_at + self.guard_recheck_s - now)
        return max(0.05, min(waits)) if waits else 3600.0

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._due_in())
            self._wake.clear()
            if self._stop.is_set():
                return
            if self._clock() < self._retry_at:
                continue
            try:
                self._sync()
            except KubeApiError as exc:
                self._failed(str(exc))
            except Exception as exc:  # a bug here must not end the thread, nor the daemon
                log.exception("node status: unexpected error")
                self._failed(f"{type(exc).__name__}: {exc}")

    def _failed(self, message: str) -> None:
        pause = BACKOFF_S[min(self._backoff, len(BACKOFF_S) - 1)] * random.uniform(0.8, 1.2)
        self._backoff += 1
        self._retry_at = self._clock() + pause
        with self._lock:
            repeated = self._state.last_error == message
            self._state.write_ok = False
            self._state.failures += 1
            self._state.last_error = message
        (log.debug if repeated else log.warning)(
            "node status of %s not written (retry in %.0f s): %s", self.node, pause, message)
        self._wake.set()

    def _succeeded(self) -> None:
        self._backoff = 0
        self._retry_at = 0.0
        with self._lock:
            self._state.write_ok = True
            self._state.last_ok_wall = self._wall()
            self._state.last_error = ""

    def _get_node(self) -> dict[str, Any]:
        node = self.client.request("GET", f"/api/v1/nodes/{quote(self.node, safe='')}")
        if not isinstance(node, dict):
            raise KubeApiError(f"GET node {self.node}: not a Node object")
        return node

    def _adopt(self) -> None:
        """Learn what the Node carries now (a restarted daemon keeps its mark and clears it
        after the healthy runs, never at once)."""
        node = self._get_node()
        self._uid = str(node.get("metadata", {}).get("uid", ""))
        for cond in node.get("status", {}).get("conditions") or ():
            if isinstance(cond, dict) and cond.get("type") == CONDITION_TYPE:
                marked = cond.get("status") == "True"
                self._on_node = Mark(marked, str(cond.get("reason", "")),
                                     str(cond.get("message", "")))
                self._transition_stamp = str(cond.get("lastTransitionTime") or "")
                break
        with self._lock:
            if self._on_node is not None:
                self._h.adopt(self._on_node.marked, self._on_node.reason, self._on_node.message)
            else:
                self._h.adopt(False)
            self._state.marked = self._on_node.marked if self._on_node else None
        log.warning("node status: writing condition %s on node %s%s", CONDITION_TYPE, self.node,
                    f" (it is {self._on_node.marked} there now)" if self._on_node else "")

    def _sync(self) -> None:
        if self._h.marked is None:
            self._adopt()
        with self._lock:
            want = self._h.desired(on_node=self._on_node is not None)
        if want is None:
            self._succeeded()
            return
        have = self._on_node
        transition = have is None or have.marked != want.marked
        changed = transition or have is None or have.reason != want.reason
        due = self._written_at is None or self._clock() >= self._written_at + self.heartbeat_s
        if not (changed or due):
            self._succeeded()
            return
        if not (want.marked and transition) and self._state.guard_holding:
            with self._lock:
                self._state.guard_holding = False  # nothing to withhold any more
        if want.marked and transition:
            if self._state.guard_holding and self._guard_at is not None and \
                    self._clock() < self._guard_at + self.guard_recheck_s:
                return
            held = self._guard_holds()
            with self._lock:
                self._state.guard_holding = held is not None
            if held is not None:
                self._withheld(held, want)
                return
            self._guard_reported = False
        now = self._wall()
        if transition:
            self._transition_stamp = _now_rfc3339(now)
        if want.marked:
            self._write_condition(want, now)
            if changed:
                self._write_mark(want)
        else:
            if changed:
                self._write_mark(None)
            self._write_condition(want, now)
        if transition and (have is not None or want.marked):
            self._event(want)
            log.warning("node status: %s=%s on node %s (%s)", CONDITION_TYPE,
                        "True" if want.marked else "False", self.node, want.reason)
        self._on_node = want
        self._written_at = self._clock()
        with self._lock:
            self._state.marked = want.marked
        self._succeeded()

    def _write_condition(self, want: Mark, now: float) -> None:
        condition = {
            "type": CONDITION_TYPE,
            "status": "True" if want.marked else "False",
            "reason": want.reason,
            "message": want.message,
            "lastHeartbeatTime": _now_rfc3339(now),
            "lastTransitionTime": self._transition_stamp or _now_rfc3339(now),
        }
        self.client.request("PATCH", f"/api/v1/nodes/{quote(self.node, safe='')}/status",
                            body={"status": {"conditions": [condition]}},
                            content_type=STRATEGIC_MERGE)

    def _mark_ops(self, node: dict[str, Any], want: Mark | None) -> list[dict[str, Any]]:
        """JSON-patch operations that bring our taint and label to ``want`` (None = remove
        them); every removal tests the exact element first."""
        ops: list[dict[str, Any]] = []
        meta = node.get("metadata") or {}
        labels = meta.get("labels") or {}
        taints = list((node.get("spec") or {}).get("taints") or [])
        ours = [i for i, t in enumerate(taints)
                if isinstance(t, dict) and t.get("key") == MARK_KEY
                and t.get("effect") == TAINT_EFFECT]
        value = label_value(want.reason) if want else ""
        if want is None or not self.taint:
            # Removing: ours only (added by this daemon, or by an earlier one of this node).
            if want is None:
                for i in reversed(ours):
                    ops += [{"op": "test", "path": f"/spec/taints/{i}", "value": taints[i]},
                            {"op": "remove", "path": f"/spec/taints/{i}"}]
        else:
            taint = {"key": MARK_KEY, "value": value, "effect": TAINT_EFFECT}
            if not ours:
                ops.append({"op": "add", "path": "/spec/taints/-" if taints else "/spec/taints",
                            "value": taint if taints else [taint]})
            elif taints[ours[0]].get("value") != value:
                i = ours[0]
                ops += [{"op": "test", "path": f"/spec/taints/{i}", "value": taints[i]},
                        {"op": "replace", "path": f"/spec/taints/{i}/value", "value": value}]
        label_path = f"/metadata/labels/{_pointer(MARK_KEY)}"
        if want is None:
            if MARK_KEY in labels:
                ops += [{"op": "test", "path": label_path, "value": labels[MARK_KEY]},
                        {"op": "remove", "path": label_path}]
        elif (self.guard or self.taint) and labels.get(MARK_KEY) != value:
            if "labels" in meta and isinstance(labels, dict):
                ops.append({"op": "add", "path": label_path, "value": value})
            else:
                ops.append({"op": "add", "path": "/metadata/labels", "value": {MARK_KEY: value}})
        if ops and any(op["op"] != "test" for op in ops):
            rv = str(meta.get("resourceVersion", ""))
            return [{"op": "test", "path": "/metadata/resourceVersion", "value": rv}, *ops]
        return []

    def _write_mark(self, want: Mark | None) -> None:
        """The taint and label, by a JSON patch guarded by the Node's resourceVersion; one
        re-read and retry when another writer changed the Node in between (409 / 422)."""
        if want is not None and not (self.taint or self.guard):
            return
        for attempt in (1, 2):
            node = self._get_node()
            ops = self._mark_ops(node, want)
            if not ops:
                return
            try:
                self.client.request("PATCH", f"/api/v1/nodes/{quote(self.node, safe='')}",
                                    body=ops, content_type=JSON_PATCH)
                return
            except KubeApiError as exc:
                if exc.status not in (409, 422) or attempt == 2:
                    raise

    def _guard_holds(self) -> str | None:
        """Why marking must wait (too many nodes marked already), or None to go ahead."""
        if not self.guard:
            return None
        self._guard_at = self._clock()
        total = self._count(self.guard_selector)
        marked_selector = ",".join(s for s in (self.guard_selector, MARK_KEY) if s)
        marked = self._count(marked_selector, exclude=self.node)
        if total == 0:
            return (f"kube_guard_selector {self.guard_selector!r} matches no node, so the share "
                    "of marked nodes is unknown")
        if marked / total > self.fraction:
            return (f"{marked} of the {total} nodes compared with ({marked / total:.0%}) already "
                    f"carry the mark {MARK_KEY}, more than kube_max_marked_fraction "
                    f"{self.fraction:g}")
        return None

    def _count(self, selector: str, *, exclude: str = "") -> int:
        query = {"resourceVersion": "0", "includeObject": "None"}
        if selector:
            query["labelSelector"] = selector
        table = self.client.request("GET", "/api/v1/nodes", query=query, accept=TABLE)
        if not isinstance(table, dict) or table.get("kind") != "Table":
            raise KubeApiError("GET /api/v1/nodes as a Table: the answer is not a Table")
        columns = [c.get("name") for c in table.get("columnDefinitions") or ()
                   if isinstance(c, dict)]
        at = columns.index("Name") if "Name" in columns else 0
        names = [r.get("cells", [None])[at] for r in table.get("rows") or ()
                 if isinstance(r, dict)]
        return sum(1 for n in names if n != exclude)

    def _withheld(self, why: str, want: Mark) -> None:
        self._succeeded()
        if self._guard_reported:
            log.debug("node status: still not marking %s: %s", self.node, why)
            return
        self._guard_reported = True
        log.warning("node status: not marking node %s (%s) because the fleet guard holds: %s",
                    self.node, want.reason, why)
        with contextlib.suppress(KubeApiError):
            self._post_event("PreflightMarkWithheld", "Warning",
                             f"preflight found a node fault ({want.reason}) but did not mark "
                             f"the node: {why}")

    def _event(self, want: Mark) -> None:
        if want.marked:
            extra = f", taint {MARK_KEY}:{TAINT_EFFECT}" if self.taint else ""
            message = (f"{CONDITION_TYPE}=True after {self._h.fail_runs} failing runs{extra}: "
                       f"{want.message}")
            reason, kind = want.reason, "Warning"
        else:
            message = (f"{CONDITION_TYPE}=False after {self._h.pass_runs} healthy runs"
                       + (f"; taint {MARK_KEY}:{TAINT_EFFECT} removed" if self.taint else ""))
            reason, kind = HEALTHY_REASON, "Normal"
        try:
            self._post_event(reason, kind, message)
        except KubeApiError as exc:  # an event is a notice: the condition already says it
            log.warning("node status: the event for %s was not written: %s", self.node, exc)

    def _post_event(self, reason: str, kind: str, message: str) -> None:
        stamp = _now_rfc3339(self._wall())
        name = f"{self.node}.{time.time_ns():x}"
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": EVENT_NAMESPACE},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": self.node,
                               "uid": self._uid or self.node},
            "reason": reason, "message": escape(message, MAX_MESSAGE_CHARS), "type": kind,
            "source": {"component": COMPONENT, "host": self.node},
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
            "reportingComponent": COMPONENT, "reportingInstance": self.node,
        }
        self.client.request("POST", f"/api/v1/namespaces/{EVENT_NAMESPACE}/events", body=body)

    # ---- metrics ----------------------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            s = dataclasses.replace(self._state)
        nan = float("nan")
        yield GaugeMetricFamily(
            "preflight_kube_write_success",
            "1 when the last write of the node's status to the Kubernetes API succeeded, 0 when "
            "it failed (the API server slow, down or refusing); NaN before the first.",
            value=nan if s.write_ok is None else float(s.write_ok))
        yield CounterMetricFamily(
            "preflight_kube_write_failures", "Failed attempts to write the node's status.",
            value=s.failures)
        yield GaugeMetricFamily(
            "preflight_kube_last_write_success_timestamp_seconds",
            "Unix time of the last successful write of the node's status; 0 = none yet.",
            value=s.last_ok_wall)
        yield GaugeMetricFamily(
            "preflight_kube_node_marked",
            f"1 while the condition {CONDITION_TYPE} on this node is True (as written or found "
            "by this daemon), 0 while False; NaN before it is known.",
            value=nan if s.marked is None else float(s.marked))
        yield GaugeMetricFamily(
            "preflight_kube_guard_holding",
            "1 while the fleet guard withholds this node's mark (more than "
            "kube_max_marked_fraction of the nodes compared with carry it).",
            value=1.0 if s.guard_holding else 0.0)


def from_config(config: Config, env: Mapping[str, str]) -> NodeStatus:
    """The writer the config asks for; ConfigError when the node's name or the credentials are
    missing (the daemon then exits 2, naming what)."""
    node = env.get("NODE_NAME", "").strip()
    if not node:
        raise ConfigError("kube_node_status is on but NODE_NAME is not set: give the daemon its "
                          "node's name (the chart sets it from spec.nodeName)")
    if len(node) > 253 or not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", node):
        raise ConfigError(f"NODE_NAME {escape(node, 80)!r} is not a Kubernetes node name")
    try:
        client = KubeClient(find_credentials(env), timeout_s=config.kube_timeout_s)
    except KubeConfigError as exc:
        raise ConfigError(f"kube_node_status: {exc}") from None
    return NodeStatus(client, node, fail_runs=config.kube_fail_runs,
                      pass_runs=config.kube_pass_runs, taint=config.kube_node_taint,
                      max_marked_fraction=config.kube_max_marked_fraction,
                      guard_selector=config.kube_guard_selector,
                      heartbeat_s=config.kube_heartbeat_s)


__all__ = ["CONDITION_TYPE", "HEALTHY_REASON", "MARK_KEY", "Hysteresis", "Mark", "NodeStatus",
           "Observation", "Verdict", "from_config", "label_value", "observe"]
