"""End to end on CPU: real gloo workers, real faults injected from outside (SIGSTOP, SIGKILL),
and what a person checks afterwards: the verdict names the rank, nothing of the run is left."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Callable

import psutil
import pytest

from preflight.bench.options import BenchOptions, Deadlines
from preflight.bench.parent import run_workers
from preflight.bench.records import RunRecord
from preflight.bench.verdict import judge
from preflight.core.result import Status
from tests.bench.workers import rank as worker_of_rank

SIZES = (1 << 20, 2 << 20, 4 << 20)


def _opts(nproc: int = 2, timeout_s: float = 16.0, **env: str) -> BenchOptions:
    return BenchOptions(backend="gloo", nproc=nproc, sizes=SIZES, timeout_s=timeout_s,
                        iters=200, warmup=2, env={**os.environ, **env})


def _worker(rank: int) -> psutil.Process | None:
    """The bench worker of ``rank`` among this process's children (the bench parent is us)."""
    return worker_of_rank(None, rank)


def _run_with_fault(opts: BenchOptions, when: str, fault: Callable[[psutil.Process], None]
                    ) -> tuple[RunRecord, float]:
    """Run the bench; when rank 0 reports phase ``when``, apply ``fault`` to rank 1's process.
    Returns the record and the seconds from the fault to the verdict."""
    hit = threading.Event()
    record: list[RunRecord] = []

    def progress(where: str) -> None:
        if where == when:
            hit.set()

    t = threading.Thread(target=lambda: record.append(run_workers(opts, on_progress=progress)))
    t.start()
    assert hit.wait(30), f"rank 0 never reached {when}"
    victim = _worker(1)
    assert victim is not None
    fault(victim)
    faulted = time.monotonic()
    t.join(60)
    assert not t.is_alive()
    return record[0], time.monotonic() - faulted


def _assert_nothing_left(record: RunRecord) -> None:
    pids = [st.pid for st in record.ranks if st.pid]
    assert pids
    for pid in pids:
        assert not psutil.pid_exists(pid), f"worker {pid} still exists"
    assert _worker(0) is None and _worker(1) is None
    port = record.store_port
    assert port is not None
    listening = [c for c in psutil.net_connections(kind="tcp")
                 if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN]
    assert listening == []
    with socket.socket() as s:
        # As any server would rebind it (TIME_WAIT of killed connections may linger).
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()


def test_sigstop_names_the_frozen_rank_within_the_step_deadline() -> None:
    # A 40 s run: its step deadline (10 s) plus a margin a loaded machine meets stays well
    # below the run's own deadline, which a missed stop would end at.
    opts = _opts(timeout_s=40)
    record, took = _run_with_fault(opts, "measure of 2 MiB",
                                   lambda p: p.send_signal(signal.SIGSTOP))
    result = judge(record)
    assert result.status is Status.FAIL
    assert result.reason == "AllreduceStalled"
    assert result.stalled_ranks == (1,)
    assert "rank 1 (CPU)" in result.message
    assert "rank 0" not in result.message.split(";")[0]
    step = Deadlines.from_timeout(opts.timeout_s).step_s
    assert took < step + 10, f"verdict after {took:.1f} s, step deadline {step} s"
    _assert_nothing_left(record)


def test_sigkill_is_a_clear_error_naming_the_rank() -> None:
    opts = _opts(timeout_s=40)
    record, took = _run_with_fault(opts, "measure of 2 MiB",
                                   lambda p: p.send_signal(signal.SIGKILL))
    result = judge(record)
    assert result.status is Status.ERROR
    assert result.reason == "WorkerDied"
    assert result.message.startswith("rank 1 (CPU) killed by SIGKILL in ")
    # Named from its exit status, not by a deadline: before the first (the 10 s step) could fire.
    step = Deadlines.from_timeout(opts.timeout_s).step_s
    assert took < step, f"verdict after {took:.1f} s, step deadline {step} s"
    _assert_nothing_left(record)


def test_short_pause_is_slow_not_dead() -> None:
    """A rank paused for 1 s (less than the step deadline) makes the run slow, never 'stalled'."""
    def pause(p: psutil.Process) -> None:
        p.send_signal(signal.SIGSTOP)
        time.sleep(1.0)
        p.send_signal(signal.SIGCONT)

    record, _ = _run_with_fault(_opts(timeout_s=30), "measure of 2 MiB", pause)
    result = judge(record, min_busbw_gbps=1e6)
    assert record.failure is None
    assert result.reason == "BusbwLow" and result.status is Status.FAIL
    assert [r.correct for r in result.rows] == [True, True, True]


def test_corrupted_result_fails_naming_size_and_rank() -> None:
    opts = BenchOptions(backend="gloo", nproc=2, sizes=(4096, 1 << 20), timeout_s=30, iters=2,
                        warmup=1, env={**os.environ, "PREFLIGHT_BENCH_TEST_CORRUPT_RANK": "1"})
    result = judge(run_workers(opts))
    assert result.status is Status.FAIL
    assert result.reason == "AllreduceWrongSum"
    assert "wrong sum" in result.message and "4 KiB" in result.message
    assert "rank 1 (CPU): 1 of 1024 elements wrong" in result.message
    assert "rank 0" not in result.message
    assert [r.correct for r in result.rows] == [False, False]


@pytest.mark.parametrize("nproc", [4])
def test_four_rank_sweep_is_exact(nproc: int) -> None:
    opts = BenchOptions(backend="gloo", nproc=nproc, sizes=(4, 4096 + 12, 1 << 20, 4 << 20),
                        timeout_s=60, iters=3, warmup=1)
    record = run_workers(opts)
    result = judge(record)
    assert result.status is Status.PASS, result.message
    assert [r.size_bytes for r in result.rows] == [4, 4108, 1 << 20, 4 << 20]
    assert all(r.correct for r in result.rows)
    # busbw = algbw x 2(n-1)/n, as nccl-tests reports it
    for r in result.rows:
        assert r.busbw_gbps == pytest.approx(r.algbw_gbps * 2 * (nproc - 1) / nproc)
    _assert_nothing_left(record)
