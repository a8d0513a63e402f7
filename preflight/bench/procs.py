"""The GPU workers as processes: start, read, write, wait, kill, clean up.

Each worker is the leader of a new session (``start_new_session``, safe from threads and on
Python 3.10), so the parent kills its whole process group; stdout and stderr go to one log file
per worker (NCCL_DEBUG writes there), progress comes as JSON lines on a dedicated pipe, control
lines go to its stdin. Nothing outlives a run: :func:`kill_all` SIGKILLs every group and reaps
it; :func:`abandon` is what ``core/aborting`` runs when a signal ends preflight mid-run.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import selectors
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from preflight.bench import leftovers
from preflight.bench.options import BenchOptions
from preflight.bench.records import WorkerState
from preflight.core import aborting

#: The worker program (stdlib at import time; see :mod:`preflight.bench.worker`).
WORKER_SCRIPT = Path(__file__).with_name("worker") / "start.py"


def worker_env(job_env: Mapping[str, str] | None, ar: BenchOptions | None = None) -> dict[str, str]:
    """The job's environment (``job_env``, else this process's), as the workers get it: nothing
    of preflight's own is added."""
    env = dict(os.environ if job_env is None else job_env)
    # With CUDA_VISIBLE_DEVICES unset, cuda:r is then NVML index r (docs/checks.md, cuda_devices).
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    if ar is not None and ar.backend == "gloo" and ar.world is None:
        # A local test: keep gloo on loopback even where the hostname resolves elsewhere.
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if ar is not None and ar.debug:
        env["NCCL_DEBUG"] = "INFO"
        env.setdefault("NCCL_DEBUG_SUBSYS", "INIT,ENV,NET,GRAPH")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def launch(st: WorkerState, argv: Sequence[str], *, pipe: tuple[int, int],
           env: Mapping[str, str], log_dir: str, sel: selectors.BaseSelector,
           logs: list[Any]) -> OSError | None:
    """Start one worker in its own session with ``pipe``'s write end as its progress fd and its
    output in ``log_dir/rank<N>.log``; register the read end in ``sel`` with ``st`` as data.
    Returns the OSError when it cannot start."""
    read_fd, write_fd = pipe
    log = open(Path(log_dir) / f"rank{st.rank}.log", "wb")  # noqa: SIM115 - closed by the caller
    logs.append(log)
    try:
        # A signal meanwhile waits until st.proc is set: the run's undo then kills this worker.
        with aborting.starting():
            st.proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=log,
                                       stderr=subprocess.STDOUT, env=dict(env),
                                       pass_fds=(write_fd,), start_new_session=True,
                                       close_fds=True)
    except OSError as exc:  # Aborted included: the run's undo has run already
        os.close(read_fd)
        return exc
    finally:
        os.close(write_fd)
    st.pid = st.proc.pid
    os.set_blocking(read_fd, False)
    sel.register(read_fd, selectors.EVENT_READ, st)
    return None


def argv_for(python: str, plan: str, progress_fd: int) -> list[str]:
    # Run as a script, not `-m`: it needs only the standard library and its engines, so it also
    # runs under the training environment's interpreter, which has no preflight.
    return [python, str(WORKER_SCRIPT), "--plan", plan, "--progress-fd", str(progress_fd),
            "--parent-pid", str(os.getpid())]


def read_ready(sel: selectors.BaseSelector, timeout: float) -> list[tuple[Any, bytes]]:
    """(registered data, bytes) for each progress pipe with output within ``timeout``; a pipe at
    end of file is unregistered and closed."""
    got = []
    for key, _ in sel.select(timeout=timeout):
        try:
            chunk = os.read(key.fd, 65536)
        except OSError:
            chunk = b""
        if not chunk:
            sel.unregister(key.fd)
            os.close(key.fd)
            continue
        got.append((key.data, chunk))
    return got


def write(workers: Sequence[WorkerState], line: bytes) -> None:
    """``line`` to each worker's stdin (one that is gone is skipped)."""
    for st in workers:
        if st.proc is not None and st.proc.stdin is not None and not st.proc.stdin.closed:
            with contextlib.suppress(OSError, ValueError):
                st.proc.stdin.write(line)
                st.proc.stdin.flush()


def release(workers: Sequence[WorkerState]) -> None:
    """Close the workers' control pipes: end of file tells a waiting worker it may exit."""
    for st in workers:
        if st.proc is not None and st.proc.stdin is not None:
            with contextlib.suppress(OSError):
                st.proc.stdin.close()


def poll(workers: Sequence[WorkerState]) -> None:
    """Fill each worker's exit status and kernel state (what :mod:`.diagnosis` judges)."""
    for st in workers:
        if st.proc is None:
            continue
        st.exit_code = st.proc.poll()
        st.kernel_state = proc_state(st.proc.pid) if st.exit_code is None else None


def await_exits(workers: Sequence[WorkerState], timeout_s: float) -> None:
    """Wait up to ``timeout_s`` in all for the workers to exit, waking the moment each does (a
    pidfd where Linux has them; Popen.wait polls in steps of up to 50 ms)."""
    import time

    end = time.monotonic() + timeout_s
    for st in workers:
        if st.proc is None or st.proc.returncode is not None:
            continue
        left = end - time.monotonic()
        if left <= 0:
            return
        try:
            fd = os.pidfd_open(st.proc.pid)
        except (AttributeError, OSError):
            with contextlib.suppress(subprocess.TimeoutExpired):
                st.proc.wait(timeout=left)
            continue
        try:
            select.select([fd], [], [], left)
        finally:
            os.close(fd)
        st.proc.poll()


def kill_all(workers: Sequence[WorkerState]) -> None:
    """SIGKILL every worker's process group and reap it: nothing of the run may outlive it."""
    for st in workers:
        if st.proc is None:
            continue
        if st.proc.stdin:
            with contextlib.suppress(OSError):
                st.proc.stdin.close()
        # Also when the leader already exited: its group may live on without it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(st.proc.pid, signal.SIGKILL)
    for st in workers:
        if st.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                st.proc.wait(timeout=10)


def close_run(workers: Sequence[WorkerState], sel: selectors.BaseSelector,
              logs: Sequence[Any]) -> None:
    """Kill and reap every worker, close the progress pipes, the selector and the log files."""
    kill_all(workers)
    for key in list(sel.get_map().values()):
        with contextlib.suppress(OSError):
            os.close(key.fd)
    sel.close()
    for f in logs:
        f.close()


def abandon(workers: Sequence[WorkerState], log_dir: str,
            shm_before: frozenset[str] | None = None) -> None:
    """Undo a run cut short by a signal (core/aborting.py): kill the workers, remove the log
    directory and, given the snapshot from before the run, what NCCL left in /dev/shm."""
    kill_all(workers)
    shutil.rmtree(log_dir, ignore_errors=True)
    if shm_before is not None:
        leftovers.remove_orphans(shm_before)


def collect_tracebacks(workers: Sequence[WorkerState], log_dir: str) -> None:
    """Keep the tail of each failed worker's log, for the message (the directory may go)."""
    for st in workers:
        if (st.error or st.exit_code not in (None, 0)) and not st.traceback:
            path = Path(log_dir) / f"rank{st.rank}.log"
            with contextlib.suppress(OSError):
                st.traceback = path.read_text(errors="replace")[-2000:]


#: NCCL's WARN lines kept per worker, and the characters of each.
MAX_NCCL_WARNINGS, MAX_WARNING_CHARS = 20, 400


def collect_nccl_warnings(workers: Sequence[WorkerState], log_dir: str) -> None:
    """Keep the ``NCCL WARN`` lines of each worker's log (the first ones: the cause comes
    before its echoes), for the verdict (the directory may go)."""
    for st in workers:
        path = Path(log_dir) / f"rank{st.rank}.log"
        try:
            with open(path, "rb") as f:
                text = f.read(4 << 20).decode("utf-8", "replace")
        except OSError:
            continue
        found = []
        for line in text.splitlines():
            at = line.find("NCCL WARN ")
            if at >= 0:
                found.append(line[at + len("NCCL WARN "):].strip()[:MAX_WARNING_CHARS])
                if len(found) >= MAX_NCCL_WARNINGS:
                    break
        st.nccl_warnings = tuple(found)


def proc_state(pid: int) -> str | None:
    """The kernel's one-letter state of ``pid`` (R, S, D, T, t, Z, ...), None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return stat_state(raw)


def stat_state(raw: bytes) -> str | None:
    """The state letter of a ``/proc/PID/stat`` line, None when the line is not one.

    "pid (comm) S ...": comm may hold spaces and parentheses, the state follows the last ")".
    """
    end = raw.rfind(b")")
    if end < 0:
        return None
    tail = raw[end + 1:].split()
    state = tail[0].decode(errors="replace") if tail else ""
    return state if len(state) == 1 and state.isalpha() else None


#: The engines module, run as a script in another interpreter: it prints that interpreter's facts.
ENGINES_SCRIPT = Path(__file__).with_name("worker") / "engines.py"


def interpreter_facts(python: str, *, env: Mapping[str, str] | None = None,
                      timeout_s: float = 10.0) -> dict[str, Any] | None:
    """What ``python`` can import for the engines (:func:`engines.facts`, run in that
    interpreter with the job's environment; in-process for this one); None when it could not be
    asked (missing, broken, no answer within ``timeout_s``)."""
    from preflight.bench.worker import engines
    from preflight.core.procgroup import GroupTimeout, run_in_group

    if python == sys.executable:
        return engines.facts(libnccl=False)  # what it needs here is whether packages import
    try:
        proc = run_in_group([python, str(ENGINES_SCRIPT)], timeout_s=timeout_s, env=env)
    except (OSError, GroupTimeout):
        return None
    try:
        data = json.loads(proc.stdout.decode("utf-8", "replace")) if proc.returncode == 0 \
            else None
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("modules"), dict):
        return None
    return data
