"""The parent of the GPU workers: one run of a plan, followed to its end or to a deadline.

It never imports torch or the CUDA bindings. Why a separate parent: a collective that hangs
cannot be interrupted from inside the process that waits in it, and a frozen GPU cannot report
itself; the parent owns every deadline (:class:`~preflight.bench.options.Limits`) and says which
worker did not reach which phase (:mod:`preflight.bench.diagnosis`).

A :class:`WorkerRun` starts one worker per GPU (:mod:`preflight.bench.procs`) and is driven by
the caller's thread: :meth:`WorkerRun.speed` until every GPU is measured, then
:meth:`WorkerRun.allreduce` to the end, so two checks can share one run, one after the other.
Once every worker that measures is ready, each gets the go at the same moment (all GPUs measure
at once; host limits they share lower them alike). Rendezvous: rank 0 publishes its store's port
(torch) or NCCL's unique id (nccl4py) and the parent writes it to the others' stdin
(across nodes: :mod:`preflight.bench.relay`).

Nothing is left behind: every worker dies with the parent (PR_SET_PDEATHSIG, set by the worker);
each run registers its undo with :mod:`preflight.core.aborting` (the one SIGTERM path: the CLI's
handler, or the run's own while it runs on the main thread outside the CLI); every worker's
process group is killed and reaped at the end, and NCCL's files left in /dev/shm are removed
(:mod:`preflight.bench.leftovers`).
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

from preflight.bench import diagnosis, leftovers, procs, protocol
from preflight.bench.options import BenchOptions, RunOptions, SpeedOptions, WorldSpec
from preflight.bench.prestart import Prestarted
from preflight.bench.records import Failure, RunRecord, SpeedRecord, WorkerState, progress_order
from preflight.bench.relay import UID_KEY, UidFetch, publish_uid, uid_missing
from preflight.bench.worker import wire
from preflight.core import aborting

#: After the first sign of failure, how long to keep reading so the first cause is the one named.
GRACE_S = 0.5
#: How often the parent looks at the workers when none writes (their heartbeat: 0.5 s).
POLL_S = 0.05

__all__ = ["UID_KEY", "BenchOptions", "RunRecord", "SpeedOptions", "SpeedRecord", "WorkerRun",
           "WorldSpec", "run_speed", "run_workers"]


class WorkerRun:
    """One worker per GPU running ``opts``' steps; see the module docstring. Never raises for a
    worker's failure (the records say what went wrong) and leaves no worker process behind."""

    def __init__(self, opts: RunOptions, *,
                 on_progress: Callable[[str], None] | None = None,
                 prestarted: Prestarted | None = None) -> None:
        self.opts, self.on_progress = opts, on_progress
        self.started = time.monotonic()
        self.limits = opts.limits()
        self.keep = opts.debug
        self.log_dir = tempfile.mkdtemp(prefix="preflight-gpu-")
        self.workers = tuple(WorkerState(rank=i, label=opts.label(i), measures=opts.measures(i),
                                         reduces=opts.allreduce is not None
                                         or opts.ddp is not None,
                                         bus_id=opts.plan(i)["bus_id"],
                                         entered=self.started, last_beat=self.started)
                             for i in range(opts.count))
        ar = opts.allreduce
        self.sizes = ar.sizes if ar else ()
        # (The DDP ladder's steps start on their go: :meth:`ddp_step`.)
        self.step_started = {} if opts.ddp else {
            wire.SPEED if opts.speed else wire.ALLREDUCE: self.started}
        self.failure: Failure | None = None
        self.store_port: int | None = None
        self.speed_done: float | None = None
        self.all_done: float | None = None
        self.go_sent = False
        self.failing_since: float | None = None
        self.fetch: UidFetch | None = None
        nccl = (ar is not None and ar.backend == "nccl") or (
            opts.ddp is not None and any(st.backend == "nccl" for st in opts.ddp.steps))
        self.shm_before = leftovers.snapshot() if nccl else None
        self.shm_removed: tuple[str, ...] = ()
        self.sel = selectors.DefaultSelector()
        self.logs: list[Any] = []
        self.closed = False
        self.ended: float | None = None
        #: started before the plan and not needed (told to exit; reaped with the others)
        self.extra: list[WorkerState] = []
        # Until the workers are reaped: a signal that ends preflight while this runs in a
        # check's daemon thread (whose finally never runs then) kills them, removes their files.
        self.undo = aborting.register(self._abandon)
        try:
            adopted = self._adopt(prestarted) if prestarted is not None else 0
            self._spawn(adopted)
        except BaseException:
            self._close(interrupted=True)
            raise

    # ------------------------------------------------------------------------------ driving
    def speed(self) -> SpeedRecord:
        """Run until every GPU is measured (or the run failed); the run ends here unless the
        all-reduce follows."""
        self._drive(lambda: self.speed_done is not None)
        if self.opts.allreduce is None or self.failure is not None:
            self._drive(lambda: False)
        return self.speed_record()

    def allreduce(self) -> RunRecord:
        """Run to the end."""
        self._drive(lambda: False)
        return self.allreduce_record()

    def ddp_step(self, step: str) -> Failure | None:
        """One step of the DDP ladder: its go to every worker, then until every rank reported
        it (None) or the run failed (the failure; the run is over then)."""
        if self.closed:
            return self.failure or Failure("spawn", "the workers are gone", ())
        procs.write(self.workers, wire.control_line(**{wire.go_key(step): True}))
        self._drive(lambda: all(step in st.steps_done for st in self.workers))
        return self.failure

    def finish(self) -> None:
        """End the run: the workers waiting for another step's go get end of file (stop) and
        exit; every one is reaped (killed past the deadline)."""
        procs.release(self.workers)
        self._drive(lambda: False)
        self._close(interrupted=False)

    @property
    def failed_before_allreduce(self) -> bool:
        return self.failure is not None and wire.ALLREDUCE not in self.step_started

    def _drive(self, until: Callable[[], bool]) -> None:
        if self.closed:
            return
        try:
            with aborting.undo_on_signals():
                self._loop(until)
        except BaseException:
            self._close(interrupted=True)
            raise
        if self.failure is not None or self._finished():
            self._close(interrupted=False)

    def _loop(self, until: Callable[[], bool]) -> None:
        while self.failure is None and not self._finished() and not until():
            for st, chunk in procs.read_ready(self.sel, POLL_S):
                self._consume(st, chunk, time.monotonic())
            if self.failure is not None:
                return
            now = time.monotonic()
            self._advance(now)
            if self._finished() or until():
                return
            procs.poll(self.workers)
            if diagnosis.failing(self.workers):
                # Let the first cause's own report arrive before naming it.
                self.failing_since = self.failing_since or now
                if now - self.failing_since >= GRACE_S:
                    self.failure = diagnosis.broken(self.workers)
                continue
            self.failure = (self._missing()
                            or uid_missing(self.fetch, self.workers,
                                           self.limits.init_s or 0.0, now)
                            or diagnosis.frozen(self.workers, now)
                            or diagnosis.late(self.workers, self.limits, now, self.step_started))

    def _finished(self) -> bool:
        return self.all_done is not None and all(
            st.proc is not None and st.proc.poll() == 0 for st in self.workers)

    # ----------------------------------------------------------------------------- messages
    def _consume(self, st: WorkerState, chunk: bytes, now: float) -> None:
        for msg in protocol.messages(st, chunk, now):
            try:
                published = protocol.apply(st, msg, now, self.sizes, self._on_phase)
            except (KeyError, TypeError, ValueError):
                continue  # a malformed line from a worker is ignored, never fatal
            if published is not None:
                self._publish(published)

    def _on_phase(self, st: WorkerState) -> None:
        if st.step == wire.ALLREDUCE and wire.ALLREDUCE not in self.step_started:
            self.step_started[wire.ALLREDUCE] = time.monotonic()
        elif (st.step in wire.DDP_STEPS and st.phase != "ready"
              and st.step not in self.step_started):
            # A DDP step's total counts from its first rank's start (after its go and, for the
            # first step, after the start-up, which has a deadline of its own).
            self.step_started[st.step] = time.monotonic()
        if self.on_progress is not None and st.rank == 0:
            self.on_progress(st.where())

    def _publish(self, published: dict[str, Any]) -> None:
        """Rank 0's rendezvous to the other local ranks (and across nodes, to the store)."""
        if wire.PORT in published:
            self.store_port = int(published[wire.PORT])
        procs.write(self.workers[1:], wire.control_line(**published))
        w = self.opts.allreduce.world if self.opts.allreduce else None
        if wire.UID in published and w is not None and w.relay is not None:
            self.failure = self.failure or publish_uid(w.relay, str(published[wire.UID]),
                                                       self.workers)

    def _advance(self, now: float) -> None:
        """The run's own steps: the go, the speed step's end, the unique id from another node,
        the release once every rank is done."""
        measuring = [st for st in self.workers if st.measures and wire.SPEED not in st.missing]
        if not self.go_sent and measuring and all(
                st.order >= progress_order(wire.SPEED, "ready", None, ())
                for st in measuring):
            self.go_sent = True
            procs.write(measuring, wire.control_line(**{wire.GO: True}))
        if self.speed_done is None and self.opts.speed is not None and all(
                wire.SPEED in st.steps_done or wire.SPEED in st.missing or st.done
                for st in self.workers if st.measures):
            self.speed_done = now
        f = self.fetch
        if f is not None and f.value is not None and not f.relayed:
            procs.write(self.workers, wire.control_line(**{wire.UID: f.value}))
            f.relayed = True
        if self.all_done is None and all(st.done for st in self.workers):
            self.all_done = now
            # Every rank is past its last collective: the nccl4py workers may exit now.
            procs.release(self.workers)
        if self.all_done is not None:
            # Everything is reported: wait on the exits themselves, waking the moment the last
            # one is reaped; exits slower than a step's deadline fall through to the run's own.
            step_s = self.limits.step_s or self.limits.speed_measure_s or 10.0
            procs.await_exits(self.workers, max(0.0, self.all_done + step_s - now))

    def _missing(self) -> Failure | None:
        """The all-reduce's engine missing on some ranks only: the others would wait for them."""
        lacking = [st for st in self.workers if wire.ALLREDUCE in st.missing]
        if lacking and any(st.step == wire.ALLREDUCE for st in self.workers):
            return Failure("engine", f"{diagnosis.names(lacking)} cannot run the all-reduce, "
                           "the others can: " + self._lacks(wire.ALLREDUCE, lacking[0]),
                           tuple(s.rank for s in lacking))
        return None

    def _lacks(self, step: str, st: WorkerState) -> str:
        what = "the GPU speed test" if step == wire.SPEED else "the all-reduce test"
        why = st.missing_why.get(step)
        if why:
            return f"{what} needs {st.missing[step]}, which {self.opts.python} cannot use " \
                   f"here: {why}"
        return f"{what} needs {st.missing[step]}, which {self.opts.python} cannot import"

    # ------------------------------------------------------------------------------- records
    def _engine_failure(self, step: str, workers: tuple[WorkerState, ...]) -> Failure | None:
        lacking = [st for st in workers if step in st.missing]
        if not lacking or len(lacking) < len(workers):
            return None
        return Failure("engine", self._lacks(step, lacking[0]), tuple(st.rank for st in lacking))

    def speed_record(self) -> SpeedRecord:
        assert self.opts.speed is not None
        workers = tuple(st for st in self.workers if st.measures)
        failure = None if self.speed_done is not None and (
            self.failure is None or wire.ALLREDUCE in self.step_started) else self.failure
        end = self.speed_done or self.ended or time.monotonic()
        teardown = (self.ended - self.speed_done if self.ended is not None
                    and self.speed_done is not None and self.opts.allreduce is None else None)
        return SpeedRecord(self.opts.speed, workers,
                           failure or self._engine_failure(wire.SPEED, workers),
                           end - self.started, self.log_dir if self.keep else None, teardown)

    def allreduce_record(self) -> RunRecord:
        assert self.opts.allreduce is not None
        ended = self.ended or time.monotonic()
        failure = self.failure or self._engine_failure(wire.ALLREDUCE, self.workers)
        start = self.step_started.get(wire.ALLREDUCE, self.started)
        return RunRecord(options=self.opts.allreduce, ranks=self.workers, failure=failure,
                         store_port=self.store_port, log_dir=self.log_dir if self.keep else None,
                         elapsed_s=ended - start,
                         teardown_s=ended - self.all_done
                         if self.all_done is not None and failure is None else None,
                         shm_removed=self.shm_removed)

    # ------------------------------------------------------------------------ process life
    def _adopt(self, pre: Prestarted) -> int:
        """Take over the workers started before the plan (each gets its plan now); how many."""
        across = self.opts.allreduce is not None and self.opts.allreduce.world is not None
        if across or not pre.fits(self.opts):
            pre.release()
            return 0
        pre.taken = True
        aborting.unregister(pre.undo)
        shutil.rmtree(self.log_dir, ignore_errors=True)
        self.log_dir, self.sel, self.logs = pre.log_dir, pre.sel, pre.logs
        count = min(len(pre.workers), len(self.workers))
        adopted = []
        now = time.monotonic()
        for mine, st in zip(self.workers[:count], pre.workers[:count], strict=True):
            st.label, st.measures, st.reduces, st.bus_id = (mine.label, mine.measures,
                                                            mine.reduces, mine.bus_id)
            st.entered = now  # its start-up deadline counts from its plan
            procs.write([st], wire.control_line(**{wire.PLAN: self.opts.plan(st.rank)}))
            adopted.append(st)
        self.workers = (*adopted, *self.workers[count:])
        self.extra = pre.workers[count:]
        procs.write(self.extra, wire.control_line(**{wire.PLAN: None}))
        return count

    def _spawn(self, adopted: int = 0) -> None:
        opts, ar, ddp = self.opts, self.opts.allreduce, self.opts.ddp
        env = procs.worker_env(opts.env, ar) if ddp is None else {}
        if ar and ar.world is not None and ar.engine == "nccl4py" and ar.world.relay is None:
            self.failure = Failure("spawn", "the nccl4py engine across nodes needs the cluster "
                                   "store to carry its unique id; run --engine torch",
                                   tuple(st.rank for st in self.workers))
            return
        for st in self.workers[adopted:]:
            read_fd, write_fd = os.pipe()
            argv = procs.argv_for(opts.python, json.dumps(opts.plan(st.rank)), write_fd)
            st.spawned_wall = time.time()
            exc = procs.launch(st, argv, pipe=(read_fd, write_fd),
                               env=env if ddp is None else ddp.env_for(st.rank),
                               log_dir=self.log_dir, sel=self.sel, logs=self.logs)
            if exc is not None:
                why = exc.strerror or str(exc)
                self.failure = Failure("spawn", f"cannot start {diagnosis.who(st)} with "
                                       f"{opts.python}: {why}", (st.rank,))
                return
        w = ar.world if ar else None
        if (w is not None and w.relay is not None and w.rank_offset > 0
                and ar is not None and ar.engine == "nccl4py"):
            # Global rank 0 is on another node: its unique id comes through the store.
            self.fetch = UidFetch(w.relay, self.limits.start_s + (self.limits.init_s or 0.0))

    def _abandon(self) -> None:
        procs.abandon([*self.workers, *self.extra], self.log_dir, self.shm_before)

    def _close(self, *, interrupted: bool) -> None:
        if self.closed:
            return
        self.closed = True
        if self.fetch is not None:
            self.fetch.stop()
        procs.close_run([*self.workers, *self.extra], self.sel, self.logs)
        if self.shm_before is not None:
            # Every worker is reaped: what NCCL left in /dev/shm has no owner any more.
            self.shm_removed = leftovers.remove_orphans(self.shm_before)
        procs.collect_tracebacks(self.workers, self.log_dir)
        procs.collect_nccl_warnings(self.workers, self.log_dir)
        if interrupted or not self.keep:
            shutil.rmtree(self.log_dir, ignore_errors=True)
        aborting.unregister(self.undo)
        self.ended = time.monotonic()


def run_workers(opts: BenchOptions, *,
                on_progress: Callable[[str], None] | None = None) -> RunRecord:
    """The all-reduce alone (``preflight bench``, ``preflight cluster``): ``opts.nproc`` workers
    to the end or to a deadline; ``on_progress`` gets rank 0's phase ("measure of 1 GiB")."""
    return WorkerRun(RunOptions(allreduce=opts), on_progress=on_progress).allreduce()


def run_speed(opts: SpeedOptions) -> SpeedRecord:
    """The speed step alone (``preflight bench --gpu``)."""
    return WorkerRun(RunOptions(speed=opts)).speed()

