"""What ``preflight prolog`` and ``preflight epilog`` share: one run of a Slurm node hook.

A :class:`HookRun` owns the run's budget and watchdog, the Slurm client, the log lines on stderr
(the slurmd log), and the acts: drain through the fleet guard (or only say so with
``--report-only``), count the verdict in ``state_dir`` and, with ``--resume``, resume a node that
preflight drained once it has passed ``resume_after`` runs in a row. Preflight's own trouble (a
configuration error, an internal error, a deadline) never drains unless ``--fail-closed``.

Also here, because both hooks and the resume decision need it: :func:`gpu_leftovers`, the compute
processes and GPU memory a finished job left on its GPUs.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from preflight.cli import check_root
from preflight.core.config import Config, ConfigError, from_env, load
from preflight.core.context import Context
from preflight.core.result import Report, Scope, Status
from preflight.core.runner import SelectionError
from preflight.core.slurm import (
    REASON_PREFIX,
    Budget,
    HookOutcome,
    SlurmClient,
    SlurmError,
    Watchdog,
    cut_reason,
    default_client,
    guard,
    process_age_s,
    reason_checks,
    record_verdict,
)
from preflight.core.state import StateError
from preflight.core.textsafe import escape
from preflight.probes.gpu import GpuSnapshot
from preflight.probes.node import make_context
from preflight.probes.procs import ProcInfo, proc_info

log = logging.getLogger(__name__)

#: The watchdog ends the process this long before the budget: interpreter teardown, and a
#: margin under Slurm's MessageTimeout.
WATCHDOG_MARGIN_S = 0.3
#: Kept free for sinfo and scontrol after the checks (each usually answers in milliseconds).
ACTIONS_RESERVE_S = 2.0
#: The checks never get less than this, even when the budget is nearly spent.
MIN_CHECKS_S = 0.5
#: Result names of the epilog's own findings (they are not in the check list).
LEFTOVER_CHECKS = ("gpu_processes", "gpu_memory")


def drain_reason(report: Report, *, undecided: bool = False) -> str:
    """``preflight: gpu_visible GpuLost, shm ShmTooSmall`` from the node's faults (or, with
    ``undecided``, from the checks that could not decide)."""
    want = Status.ERROR if undecided else Status.FAIL
    parts = [f"{r.check} {r.reason}" for r in report.results
             if r.status is want and r.scope is not Scope.JOB]
    return cut_reason(f"{REASON_PREFIX} " + (", ".join(parts) or "undecided"))


@dataclass(frozen=True)
class Leftovers:
    """What a job left on its GPUs: compute processes (index, process) still there, and GPUs
    whose memory stays in use with no compute process (index, bytes)."""

    processes: tuple[tuple[int, ProcInfo], ...] = ()
    others: tuple[tuple[int, ProcInfo], ...] = ()
    memory: tuple[tuple[int, int], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.processes or self.memory)


def gpu_leftovers(snap: GpuSnapshot, *, gpus: Collection[int] | None, job_id: str | None,
                  memory_max_bytes: int, proc: Path) -> Leftovers:
    """The leftovers on ``gpus`` (NVML indices; None = every GPU) after job ``job_id``.

    A compute process counts when its environment names this job, or when it runs on one of the
    job's own GPUs (``gpus`` given) and names no other job; a process of another job is listed
    in ``others`` (not this job's doing). With ``gpus`` None, a process that names no job counts
    only when ``job_id`` is None too (a run by hand on an idle node). GPU memory counts on a GPU
    with no compute process at all, above ``memory_max_bytes`` (MIG GPUs are left out: their
    memory is per instance).
    """
    found: list[tuple[int, ProcInfo]] = []
    others: list[tuple[int, ProcInfo]] = []
    memory: list[tuple[int, int]] = []
    for g in snap.gpus:
        if gpus is not None and g.index not in gpus:
            continue
        for pid in g.compute_pids:
            info = proc_info(pid, proc)
            if job_id is not None and info.slurm_job_id not in (None, job_id):
                others.append((g.index, info))  # another job's process
            elif info.slurm_job_id == job_id or gpus is not None or job_id is None:
                found.append((g.index, info))
            else:  # GPUs unknown and the process names no job: not known to be this job's
                others.append((g.index, info))
        if not g.compute_pids and not g.mig_enabled and g.memory_used_bytes is not None \
                and g.memory_used_bytes > memory_max_bytes:
            memory.append((g.index, g.memory_used_bytes))
    return Leftovers(tuple(found), tuple(others), tuple(memory))


class HookRun:
    """One run of a Slurm node hook (see the module docstring).

    Args:
        hook: ``prolog`` or ``epilog`` (log prefix, metric label, state).
        args: the parsed command line (:func:`~preflight.commands.hookopts.add_hook_options`
            and ``add_config_options``).
        env: the environment (``SLURMD_NODENAME``, the job's variables).
    """

    def __init__(self, hook: str, args: argparse.Namespace,
                 env: Mapping[str, str] | None = None) -> None:
        self.hook = hook
        self.args = args
        self.env = dict(os.environ if env is None else env)
        self.node = args.node or self.env.get("SLURMD_NODENAME") or \
            socket.gethostname().split(".")[0]
        total = _early_budget(self.env)
        # The interpreter's own start counts; a process older than the whole budget is not a
        # hook's fresh process (the CLI called in a long-lived one): it gets the whole budget.
        age = process_age_s()
        self.budget = Budget(total, already_s=age if age < total else 0.0)
        self.client = SlurmClient(scontrol=args.scontrol or default_client("scontrol"),
                                  sinfo=args.sinfo or default_client("sinfo"), say=self.say)
        self.outcome = HookOutcome(hook=hook, budget_s=self.budget.total_s,
                                   report_only=bool(args.report_only))
        self.config: Config | None = None
        self.phase = "starting"
        self.drained = False

    # -- output ---------------------------------------------------------------------------
    def say(self, line: str) -> None:
        """One line to stderr (the slurmd log), control characters escaped: a value from the
        job's environment cannot forge a second log line or drive a terminal."""
        print(f"preflight {self.hook}: {escape(line, 2000)}", file=sys.stderr, flush=True)

    # -- the run ---------------------------------------------------------------------------
    def execute(self, judge: Callable[[HookRun], int]) -> int:
        """``judge(self)`` under the budget's watchdog; its exit code, or 0 (1 with
        ``--fail-closed``) for an internal error. The metrics file is written in any case."""
        dog = Watchdog(self.budget, margin_s=WATCHDOG_MARGIN_S, message=self._overrun,
                       code=self._overrun_code).start()
        try:
            try:
                return judge(self)
            except Exception as exc:  # preflight's own trouble never drains (unless asked)
                log.debug("traceback of the %s's internal error", self.hook, exc_info=True)
                self.say(f"internal error, so the node is undecided: {type(exc).__name__}: {exc} "
                         f"(run `preflight {self.hook} --log-level debug` by hand for the "
                         "traceback and report it)")
                if self.args.fail_closed:
                    return self.drain(f"{REASON_PREFIX} internal error")
                return 0
        finally:
            self.write_prom()
            dog.stop()

    def _overrun(self) -> str:
        then = "the node was drained" if self.drained else (
            "exit 1 (--fail-closed)" if self.args.fail_closed else "letting the job run")
        return (f"preflight {self.hook}: the run reached its {self.budget.total_s:g} s budget "
                f"(prolog_budget_s) while {escape(self.phase, 300)}; {then}")

    def _overrun_code(self) -> int:
        return 1 if (self.drained or self.args.fail_closed) and not self.args.report_only else 0

    def context(self, overrides: Mapping[str, Any]) -> Context:
        """The run's Context, its config loaded and the checks' deadline cut to the budget.

        Raises:
            ConfigError: the configuration is bad (the caller hands it to :meth:`config_error`).
        """
        self.phase = "loading the configuration"
        # The config first, so that a --root error still drains (--fail-closed) through the
        # fleet guard configured there.
        self.config = load(path=self.args.config, env=self.env, overrides=overrides)
        self.budget.set_total(self.config.prolog_budget_s)
        self.outcome.budget_s = self.config.prolog_budget_s
        # Only the node checks' deadline is cut (the GPU probe's follows it): the GPU tests
        # (--bandwidth) keep their own, whose phases would call a slow start a stall if squeezed
        # (the watchdog ends them, fail-open, when the budget is too small for them).
        config = self.config.replace(check_timeout_s=self.checks_deadline(self.config))
        return make_context(config, env=self.env, root=check_root(self.args.root))

    def checks_deadline(self, config: Config) -> float:
        """Each check's deadline: its configured one, cut so that the actions still fit."""
        reserve = min(ACTIONS_RESERVE_S, 0.25 * self.budget.total_s) + WATCHDOG_MARGIN_S
        return max(MIN_CHECKS_S, min(config.check_timeout_s, self.budget.left() - reserve))

    def action_time(self) -> float:
        """Seconds a Slurm call may take now."""
        return self.budget.left() - WATCHDOG_MARGIN_S - 0.1

    def config_error(self, exc: ConfigError | SelectionError) -> int:
        self.outcome.config_ok = False
        self.say(f"configuration error: {exc}")
        if self.args.fail_closed:
            return self.drain(f"{REASON_PREFIX} configuration error")
        return 0

    def act(self, report: Report, ctx: Context, *, count_pass: bool = True) -> int:
        """Log what matters, drain for node faults, count the verdict (see :meth:`count`),
        resume if asked."""
        self.outcome.report = report
        for r in report.results:
            if r.status >= Status.WARN:
                fix = f" fix: {r.remedy}" if r.remedy else ""
                self.say(f"{r.status.name} {r.check} {r.reason} (scope {r.scope.value}): "
                         f"{r.message}{fix}")
        code = 0
        if report.node_status is Status.FAIL:
            code = self.drain(drain_reason(report))
        elif report.node_status is Status.ERROR and self.args.fail_closed:
            code = self.drain(drain_reason(report, undecided=True))
        passed = report.node_status <= Status.WARN
        self.count(passed, report, ctx, count_pass=count_pass)
        return code

    # -- acts ------------------------------------------------------------------------------
    def drain(self, reason: str) -> int:
        """Drain this node through the fleet guard; the exit code (1: drained or tried, 0:
        report-only or held back)."""
        if self.args.report_only:
            self.outcome.would_drain = True
            self.say(f"report-only: would drain {self.node} with reason {reason!r}")
            return 0
        held, counted = self._guard()
        if held is not None:
            self.outcome.held_back = held
            advice = ("If those drains are right, raise max_drain_fraction; if preflight is "
                      "wrong, roll back or use --report-only, then resume the nodes (scontrol "
                      "update nodename=<nodes> state=resume)" if counted else
                      "the guard cannot tell a preflight bug from a bad node without the count: "
                      "fix sinfo (--sinfo PATH), or set max_drain_fraction: 1.0 to turn the "
                      "guard off")
            self.say(f"FLEET GUARD: NOT draining {self.node} ({reason}): {held}. {advice}. "
                     "Exit 0: the job runs.")
            return 0
        self.phase = f"draining {self.node} (scontrol update)"
        self.drained = self.outcome.drained = self.client.drain(
            self.node, reason, timeout_s=self.action_time())
        return 1

    def _guard(self) -> tuple[str | None, bool]:
        """(why the drain is held back or None, whether the fleet was counted)."""
        fraction = self.config.max_drain_fraction if self.config else Config().max_drain_fraction
        if fraction >= 1.0:
            return None, False
        self.phase = "counting the drained nodes (sinfo, fleet guard)"
        try:
            fleet = self.client.fleet(timeout_s=self.action_time())
        except SlurmError as exc:
            return f"could not count the nodes already drained ({exc})", False
        self.outcome.fleet_nodes = fleet.nodes
        self.outcome.fleet_drained = len(fleet.drained_by_preflight)
        return guard(fleet, node=self.node, max_fraction=fraction), True

    def count(self, passed: bool, report: Report, ctx: Context, *,
              count_pass: bool = True) -> None:
        """Record the verdict in ``state_dir`` (a run that did not pass restarts the count),
        then resume the node with ``--resume``. Without ``--resume`` the count is kept only
        where a state file already exists (a site that resumes from HealthCheckProgram), so a
        plain prolog writes nothing. ``count_pass`` False: a pass is not counted (the epilog
        checks only what a job left, not the node)."""
        resume = bool(getattr(self.args, "resume", False))
        if passed and not count_pass:
            return
        self.phase = "recording the verdict in state_dir"
        try:
            passes = record_verdict(ctx.config.state_dir, self.node, passed=passed,
                                    hook=self.hook, create=resume)
        except StateError as exc:
            if resume:
                self.say(f"cannot keep the count of passing runs, so no resume: {exc}")
            else:
                log.debug("state not recorded: %s", exc)
            return
        self.outcome.passes = passes
        if resume and passed and passes is not None:
            self.resume(passes, report, ctx)

    def resume(self, passes: int, report: Report, ctx: Context) -> None:
        """Resume this node when preflight drained it and it passed ``resume_after`` runs in a
        row, and this run covered what drained it; a node drained for any other reason is
        never touched."""
        want = ctx.config.resume_after
        if passes < want:
            log.info("%d of %d passing runs: not resuming yet", passes, want)
            return
        self.phase = f"reading {self.node}'s state (scontrol show node)"
        try:
            info = self.client.show_node(self.node, timeout_s=self.action_time())
        except SlurmError as exc:
            self.say(f"cannot read the state of {self.node}, so no resume: {exc}")
            return
        if not info.drained:
            return
        if not info.ours:
            log.info("%s is drained for %r (not by preflight): never resumed by preflight",
                     self.node, info.reason)
            return
        why_not = self._not_covered(info.reason, info.idle, report, ctx)
        if why_not:
            self.say(f"not resuming {self.node} (drained for {info.reason!r}): {why_not}")
            return
        if self.args.report_only:
            self.say(f"report-only: would resume {self.node} (drained for {info.reason!r}, "
                     f"{passes} passing runs in a row)")
            return
        self.phase = f"resuming {self.node} (scontrol update)"
        if self.client.resume(self.node, timeout_s=self.action_time()):
            self.outcome.resumed = True
            self.say(f"resumed {self.node}: it was drained by preflight ({info.reason!r}) and "
                     f"has passed {passes} runs in a row (resume_after {want})")

    def _not_covered(self, reason: str, idle: bool, report: Report, ctx: Context) -> str:
        ran = {r.check for r in report.results if r.status is not Status.SKIP}
        named = reason_checks(reason)
        known = {r.check for r in report.results}
        missing = [c for c in named if c in known and c not in ran]
        if missing:
            return (f"this run did not test {', '.join(missing)}, which drained it (run the "
                    "resume with the same checks as the drain)")
        if any(c in LEFTOVER_CHECKS for c in named):
            if not idle:
                return "a job runs on it, so leftovers of the last job cannot be told apart"
            snap = ctx.gpus()
            if not snap.available:
                return f"NVML cannot tell what the last job left ({snap.error})"
            left = gpu_leftovers(snap, gpus=None, job_id=None,
                                 memory_max_bytes=ctx.config.epilog_idle_memory_max_bytes,
                                 proc=ctx.host_path("/proc"))
            if left:
                return describe_leftovers(left)
        return ""

    # -- metrics ---------------------------------------------------------------------------
    def write_prom(self) -> None:
        """``--prom-file``: the prolog's check metrics (as ``check --prom-file``) and the hook's
        own; the epilog's file has only the hook's (no series in common with the prolog's file).
        Written by ``check --prom-file``'s rules (:mod:`preflight.outputs.textfile`: only a
        regular file is replaced, a failed write leaves the error gauge). A failure is one line
        on stderr, never a change of the exit code."""
        path = getattr(self.args, "prom_file", None)
        if not path:
            return
        from preflight.outputs.hook_metrics import ESSENTIAL_HOOK_FAMILIES, render_hook
        from preflight.outputs.prom import MetricsSnapshot, render
        from preflight.outputs.textfile import ESSENTIAL_FAMILIES, write_metrics_file

        self.phase = f"writing {path} (--prom-file)"
        self.outcome.timestamp_s = time.time()
        self.outcome.duration_s = self.budget.elapsed()
        report = self.outcome.report if self.hook == "prolog" else None
        try:
            data = render(MetricsSnapshot(report=report)) if report is not None else b""
            write_metrics_file(path, data + render_hook(self.outcome),
                               essential=(*ESSENTIAL_FAMILIES, *ESSENTIAL_HOOK_FAMILIES),
                               labels={"hook": self.hook})
        except OSError as exc:  # TextfileError: refused (a device, a FIFO, ...) or failed
            self.say(f"cannot write the metrics to --prom-file {path}: {exc.strerror or exc}")
        except Exception as exc:  # the metrics never decide the exit code, a bug here included
            log.debug("traceback of the --prom-file error", exc_info=True)
            self.say(f"internal error while writing --prom-file {path}: {type(exc).__name__}: "
                     f"{exc}")


def _early_budget(env: Mapping[str, str]) -> float:
    """The budget before the config is loaded (loading it may be what hangs):
    ``PREFLIGHT_PROLOG_BUDGET_S`` when valid (it overrides any file anyway), else the default."""
    try:
        config = from_env({k: v for k, v in env.items() if k == "PREFLIGHT_PROLOG_BUDGET_S"},
                          base=Config())
    except ConfigError:
        return Config().prolog_budget_s
    return config.prolog_budget_s


def describe_leftovers(left: Leftovers, limit: int = 6) -> str:
    parts = [f"GPU {i}: {p.describe()}" for i, p in left.processes[:limit]]
    parts += [f"GPU {i}: {b / (1 << 20):.0f} MiB in use with no compute process"
              for i, b in left.memory[:limit]]
    more = len(left.processes) + len(left.memory) - len(parts)
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def job_gpus(env: Mapping[str, str]) -> list[int] | None:
    """The job's GPUs as NVML indices from ``SLURM_JOB_GPUS`` (physical indices in a prolog or
    epilog, which run outside the job's cgroup); None when unset or not a list of indices."""
    raw = env.get("SLURM_JOB_GPUS", "").strip()
    if not raw:
        return None
    out = []
    for item in (i.strip() for i in raw.split(",")):
        if not item.isdigit() or len(item) > 4:
            return None
        out.append(int(item))
    return out


def names(text: str) -> list[str]:
    return [n for n in text.split(",") if n]


__all__ = ["LEFTOVER_CHECKS", "HookRun", "Leftovers", "describe_leftovers",
           "drain_reason", "gpu_leftovers", "job_gpus", "names"]
