"""What a node hook (prolog, epilog, HealthCheckProgram) does to Slurm, and within what time.

- :class:`SlurmClient`: ``scontrol update ... state=drain|resume``, ``scontrol show node`` and
  one ``sinfo`` call, each in its own process group under a deadline
  (:func:`~preflight.core.procgroup.run_in_group`); a failure is one log line, never a hang.
- The drain reason: ``preflight: <check> <Reason>, ...``. That prefix is how preflight knows
  its own drains: ``--resume`` and the fleet guard count and touch only those, never a node an
  operator drained for anything else (LBNL NHC does the same with its ``NHC:`` prefix).
- The fleet guard (:func:`guard`): before draining, the nodes already drained by preflight are
  counted; above ``max_drain_fraction`` of the cluster the drain is held back, so a preflight bug
  or a bad config rolled out everywhere cannot drain the fleet.
- Resume bookkeeping (:func:`record_verdict`): consecutive passing runs, in ``state_dir``.
- :class:`Budget` and :class:`Watchdog`: the hook's whole run ends inside ``prolog_budget_s``
  counted from the process start, whatever hangs.
- :class:`HookOutcome`: what the run did, for ``--prom-file`` (outputs/hook_metrics.py).

Parsing of Slurm's output is pure (:func:`parse_show_node`, :func:`parse_sinfo`) and tested on
literal text from Slurm 22.05.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from preflight.core import aborting
from preflight.core.procgroup import HelperFailed, run_checked
from preflight.core.result import Report
from preflight.core.state import StateError, StateFile
from preflight.core.textsafe import escape

REASON_PREFIX = "preflight:"
#: Slurm keeps reasons short in `sinfo -R`; longer ones are cut here, not by Slurm.
MAX_REASON_CHARS = 200
#: Longest any one Slurm client call may take (the budget usually allows less).
CLIENT_TIMEOUT_S = 10.0
#: Bytes of a Slurm client's output parsed (sinfo of 100,000 nodes is ~5 MB).
_MAX_OUTPUT = 16 << 20
#: The state file of the resume bookkeeping.
HEALTH_STATE = "health"


class SlurmError(RuntimeError):
    """A Slurm client did not answer usefully (missing, failed, timed out); the message says
    which, in one line."""


def default_client(name: str) -> str:
    """Where ``name`` (scontrol, sinfo) is: Slurm sets no PATH for a prolog, so the usual
    absolute places come first."""
    for candidate in (f"/usr/bin/{name}", f"/usr/local/bin/{name}"):
        if Path(candidate).exists():
            return candidate
    return shutil.which(name) or f"/usr/bin/{name}"


@dataclass(frozen=True)
class NodeInfo:
    """A node as ``scontrol show node`` says: ``state`` (``IDLE+DRAIN``), ``reason`` without
    Slurm's ``[user@time]`` suffix (empty when none)."""

    state: str
    reason: str

    @property
    def flags(self) -> frozenset[str]:
        return frozenset(self.state.upper().replace("*", "").split("+"))

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags

    @property
    def ours(self) -> bool:
        return self.reason.startswith(REASON_PREFIX)

    @property
    def idle(self) -> bool:
        """No job runs on it (``IDLE``, ``IDLE+DRAIN``)."""
        return "IDLE" in self.flags


_SUFFIX = re.compile(r"\s*\[[^\]@]*@[^\]]*\]\s*$")


def parse_show_node(text: str) -> NodeInfo:
    """``scontrol show node NAME`` (multi-line form) -> NodeInfo.

    Raises:
        SlurmError: no ``State=`` in the text (not a node description).
    """
    state = None
    reason = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("Reason="):  # scontrol prints Reason last on its own line
            reason = _SUFFIX.sub("", line[len("Reason="):]).strip()
            continue
        m = re.search(r"(?:^|\s)State=(\S+)", line)
        if m and state is None:
            state = m.group(1)
    if state is None:
        raise SlurmError("scontrol show node printed no State=")
    return NodeInfo(state, "" if reason in ("(null)", "none") else reason)


#: ``sinfo`` output format: node, state, reason (the reason last: it may hold ``|``).
SINFO_FORMAT = "%N|%T|%E"


def parse_sinfo(text: str) -> dict[str, NodeInfo]:
    """``sinfo --noheader --Node --all --format=%N|%T|%E`` -> {node: NodeInfo}; a node in
    several partitions is listed once."""
    nodes: dict[str, NodeInfo] = {}
    for line in text.splitlines():
        parts = line.strip().split("|", 2)
        if len(parts) != 3 or not parts[0]:
            continue
        name, state, reason = parts
        reason = "" if reason.strip() == "none" else reason.strip()
        nodes.setdefault(name, NodeInfo(state.strip(), reason))
    return nodes


@dataclass(frozen=True)
class Fleet:
    """What one ``sinfo`` call said: how many nodes, which are drained by preflight."""

    nodes: int
    drained_by_preflight: tuple[str, ...]


def fleet_of(nodes: Mapping[str, NodeInfo]) -> Fleet:
    ours = tuple(sorted(n for n, info in nodes.items()
                        if info.ours and ("drain" in info.state.lower()
                                          or "DRAIN" in info.flags)))
    return Fleet(len(nodes), ours)


def guard(fleet: Fleet, *, node: str, max_fraction: float) -> str | None:
    """Why draining ``node`` must be held back, or None when it may go ahead: the other nodes
    drained by preflight are more than ``max_fraction`` of the cluster."""
    if max_fraction >= 1.0:
        return None
    others = [n for n in fleet.drained_by_preflight if n != node]
    if fleet.nodes <= 0:
        return "sinfo listed no node, so the drained fraction is unknown"
    fraction = len(others) / fleet.nodes
    if fraction > max_fraction:
        return (f"{len(others)} of {fleet.nodes} nodes ({fraction:.1%}) are already drained by "
                f"preflight, more than max_drain_fraction {max_fraction:g}")
    return None


def reason_checks(reason: str) -> list[str]:
    """The check names of a drain reason made by :func:`drain_reason` (``preflight: gpu_visible
    GpuLost, shm ShmFull`` -> ``["gpu_visible", "shm"]``); a part cut by the length limit is
    left out."""
    if not reason.startswith(REASON_PREFIX):
        return []
    names = []
    for part in reason[len(REASON_PREFIX):].split(","):
        words = part.split()
        if len(words) == 2 and not part.endswith("...") and re.fullmatch(r"[a-z_][a-z0-9_]*",
                                                                         words[0]):
            names.append(words[0])
    return names


def cut_reason(text: str) -> str:
    return text if len(text) <= MAX_REASON_CHARS else text[:MAX_REASON_CHARS - 3] + "..."


class SlurmClient:
    """scontrol and sinfo for one node hook. ``say`` writes one log line (stderr)."""

    def __init__(self, *, scontrol: str, sinfo: str, say: Callable[[str], None]) -> None:
        self.scontrol = scontrol
        self.sinfo = sinfo
        self._say = say

    def _run(self, argv: list[str], timeout_s: float) -> str:
        if timeout_s <= 0:
            raise SlurmError(f"no time left in the budget for {' '.join(argv[:2])}")
        try:
            proc = run_checked(argv, timeout_s=timeout_s)
        except HelperFailed as exc:
            raise SlurmError(str(exc)) from None
        return proc.stdout[:_MAX_OUTPUT].decode(errors="replace")

    def drain(self, node: str, reason: str, *, timeout_s: float) -> bool:
        """Drain ``node`` with ``reason``; False (and a log line) when scontrol fails. Judged by
        scontrol's exit status, within ``timeout_s``."""
        argv = [self.scontrol, "update", f"nodename={node}", "state=drain",
                f"reason={escape(cut_reason(reason))}"]
        try:
            self._run(argv, min(timeout_s, CLIENT_TIMEOUT_S))
        except SlurmError as exc:
            self._say(f"could not drain {node}: {exc}. Drain by hand: scontrol update "
                      f"nodename={node} state=drain reason=\"{REASON_PREFIX} ...\"")
            return False
        return True

    def resume(self, node: str, *, timeout_s: float) -> bool:
        try:
            self._run([self.scontrol, "update", f"nodename={node}", "state=resume"],
                      min(timeout_s, CLIENT_TIMEOUT_S))
        except SlurmError as exc:
            self._say(f"could not resume {node}: {exc}")
            return False
        return True

    def show_node(self, node: str, *, timeout_s: float) -> NodeInfo:
        """Raises SlurmError."""
        return parse_show_node(self._run([self.scontrol, "show", "node", node],
                                         min(timeout_s, CLIENT_TIMEOUT_S)))

    def fleet(self, *, timeout_s: float) -> Fleet:
        """One ``sinfo`` call over every node of every partition. Raises SlurmError."""
        text = self._run([self.sinfo, "--noheader", "--Node", "--all",
                          f"--format={SINFO_FORMAT}"], min(timeout_s, CLIENT_TIMEOUT_S))
        return fleet_of(parse_sinfo(text))


def record_verdict(state_dir: str, node: str, *, passed: bool, hook: str,
                   create: bool) -> int | None:
    """Count this run in ``state_dir``: the consecutive passing runs of ``node`` now (0 after a
    run that did not pass). ``create``: start the file when it is missing (``--resume``);
    otherwise a missing file stays missing and None is returned.

    Raises:
        StateError: the state cannot be read or written.
    """
    state = StateFile(state_dir, HEALTH_STATE)
    if not create and not state.path.exists():
        return None
    with state.update() as data:
        if data.get("node") != node or not isinstance(data.get("passes"), int):
            data.clear()
            data.update(node=node, passes=0)
        data["passes"] = data["passes"] + 1 if passed else 0
        data["last"] = {"hook": hook, "passed": passed, "time_s": round(time.time(), 3)}
        passes: int = data["passes"]
        return passes


@dataclass
class HookOutcome:
    """What one hook run did (filled as it goes, rendered once at the end).

    Attributes:
        hook: ``prolog`` or ``epilog``.
        timestamp_s: when the run ended (Unix time).
        duration_s: from the process start to the end of the run.
        budget_s: ``prolog_budget_s``.
        config_ok: False when a configuration error stopped the checks.
        report_only: ``--report-only``: nothing drained or resumed.
        drained: this run drained the node.
        would_drain: report-only: a drain that was not made.
        held_back: the fleet guard's sentence when it held a drain back (else None).
        resumed: ``--resume`` resumed the node.
        fleet_nodes, fleet_drained: the one ``sinfo`` count (None: not counted).
        passes: consecutive passing runs in the state (None: unknown).
        counts: further per-hook figures (``shm_files_removed``, ``gpu_leftover_processes``).
        report: the run's results, for ``preflight_slurm_hook_result_info``.
    """

    hook: str
    budget_s: float
    timestamp_s: float = 0.0
    duration_s: float = 0.0
    config_ok: bool = True
    report_only: bool = False
    drained: bool = False
    would_drain: bool = False
    held_back: str | None = None
    resumed: bool = False
    fleet_nodes: int | None = None
    fleet_drained: int | None = None
    passes: int | None = None
    counts: dict[str, float] = field(default_factory=dict)
    report: Report | None = None


def process_age_s(proc: Path = Path("/proc")) -> float:
    """Seconds since this process started (``/proc/self/stat`` start time against
    ``/proc/uptime``), so a budget counts the interpreter's own start-up; 0.0 when unknown."""
    try:
        stat = (proc / "self" / "stat").read_text()
        uptime = float((proc / "uptime").read_text().split()[0])
        start_ticks = int(stat.rpartition(")")[2].split()[19])
        age = uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0
    return age if 0.0 <= age < 3600.0 else 0.0


class Budget:
    """The hook's time, counted from its process start: ``left()`` seconds remain."""

    def __init__(self, total_s: float, *, already_s: float = 0.0) -> None:
        self.total_s = total_s
        self._end = time.monotonic() - already_s + total_s

    def set_total(self, total_s: float) -> None:
        self._end += total_s - self.total_s
        self.total_s = total_s

    @property
    def end(self) -> float:
        return self._end

    def left(self) -> float:
        return self._end - time.monotonic()

    def elapsed(self) -> float:
        return self.total_s - self.left()


class Watchdog:
    """Ends the process when the budget is spent, whatever the main thread waits on.

    At ``budget.end - margin_s`` it writes ``message()`` (one line), undoes what the command
    started (:func:`preflight.core.aborting.abort`: helper process groups, workers) and exits
    with ``code()`` through ``os._exit``: a thread stuck in the driver cannot delay it.
    """

    def __init__(self, budget: Budget, *, margin_s: float, message: Callable[[], str],
                 code: Callable[[], int]) -> None:
        self._budget = budget
        self._margin_s = margin_s
        self._message = message
        self._code = code
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._wait, name="budget-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._done.set()

    def _wait(self) -> None:
        while not self._done.is_set():
            left = self._budget.left() - self._margin_s
            if left <= 0:
                break
            self._done.wait(min(left, 0.5))
        if self._done.is_set():
            return
        code = self._code()
        with contextlib.suppress(Exception):
            sys.stderr.write(self._message() + "\n")
            sys.stderr.flush()
        with contextlib.suppress(Exception):
            aborting.abort()
        os._exit(code)


__all__ = ["REASON_PREFIX", "Budget", "Fleet", "HookOutcome", "NodeInfo", "SlurmClient",
           "SlurmError", "StateError", "Watchdog", "default_client", "fleet_of", "guard",
           "parse_show_node", "parse_sinfo", "process_age_s", "reason_checks", "record_verdict"]
