"""Judging a run of the all-reduce test, and showing it (nccl-tests-like table, JSON).

The verdict is taken at the largest size only (docs/bandwidth.md: never on an average over the
sweep): against an explicit floor (``--min-busbw`` / ``min_busbw_gbps``), else against the table
of expected busbw per GPU model and count (FAIL below 0.9 x expected, WARN where the model is
unknown). A stall, a dead worker and a wrong sum are verdicts of their own: a hang is never
reported as "slow". The link efficiency (busbw / what NVML says the links allow) is always given.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from preflight.bench import method
from preflight.bench.nccl_debug import summarize
from preflight.bench.records import PHASE_TIMES, RunRecord
from preflight.core.result import Status
from preflight.core.units import fmt_bytes
from preflight.probes.gpu import Gpu

REMEDY_STALL = ("Look for Xid errors (dmesg | grep -i xid) and a GPU that does not answer "
                "(nvidia-smi -q -i <index>) on the named GPU; preflight bench --debug keeps "
                "NCCL_DEBUG=INFO output; if it repeats, drain the node.")
REMEDY_SLOW = ("Check that every NVLink is up (nvidia-smi nvlink --status), that the PCIe links "
               "run at full generation and width (nvidia-smi -q | grep -A3 'Link Width'), that "
               "NCCL_P2P_DISABLE / NCCL_SHM_DISABLE are unset; preflight bench --debug shows the "
               "transport NCCL chose.")
KEEP_LOGS = " preflight bench --debug keeps the workers' logs."


@dataclass(frozen=True)
class Row:
    """One size of the sweep: time per op averaged over ranks (nccl-tests ``-a 1``)."""

    size_bytes: int
    time_s: float
    algbw_gbps: float
    busbw_gbps: float
    correct: bool | None
    wrong: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"size_bytes": self.size_bytes, "time_s": self.time_s,
                "algbw_gbps": round(self.algbw_gbps, 3), "busbw_gbps": round(self.busbw_gbps, 3),
                "correct": self.correct, "wrong_elements": self.wrong}


@dataclass(frozen=True)
class BenchResult:
    """The outcome of ``preflight bench`` and of the ``allreduce`` check."""

    backend: str
    world_size: int
    devices: tuple[str, ...]
    rows: tuple[Row, ...]
    status: Status
    reason: str
    message: str
    remedy: str = ""
    busbw_gbps: float | None = None
    expected_busbw_gbps: float | None = None
    floor_source: str | None = None
    link_bytes_per_second: float | None = None
    link_basis: str | None = None
    link_efficiency: float | None = None
    stalled_ranks: tuple[int, ...] = ()
    store_port: int | None = None
    pids: tuple[int, ...] = ()
    debug_log: str | None = None
    nccl: dict[str, Any] | None = None
    elapsed_s: float = 0.0
    notes: tuple[str, ...] = field(default=())
    #: seconds per phase (interpreter, imports, cuda_context, nccl_init, allocation, warmup,
    #: sweep), the slowest rank's; the engine the workers ran and the NCCL they loaded
    phase_times_s: dict[str, float] = field(default_factory=dict)
    engine: str | None = None
    nccl_version: str | None = None
    libnccl: str | None = None
    first_allreduce_s: float | None = None
    #: NCCL files the workers left in /dev/shm, removed after the run (bench/leftovers.py)
    shm_removed: tuple[str, ...] = ()
    #: the workers' interpreter and what it loaded, from where (torch, nccl4py, libnccl.so.2)
    environment: dict[str, Any] = field(default_factory=dict)

    def details(self) -> dict[str, Any]:
        """Flat facts for a check Result and metrics."""
        return {"backend": self.backend, "world_size": self.world_size,
                "busbw_gbps": self.busbw_gbps, "expected_busbw_gbps": self.expected_busbw_gbps,
                "link_bytes_per_second": self.link_bytes_per_second,
                "link_efficiency": self.link_efficiency,
                "largest_size_bytes": self.rows[-1].size_bytes if self.rows else None,
                "stalled_ranks": list(self.stalled_ranks), "debug_log": self.debug_log}

    def to_json(self) -> dict[str, Any]:
        return {"backend": self.backend, "world_size": self.world_size,
                "devices": list(self.devices), "rows": [r.to_json() for r in self.rows],
                "status": self.status.word, "reason": self.reason, "message": self.message,
                "remedy": self.remedy, "busbw_gbps": self.busbw_gbps,
                "expected_busbw_gbps": self.expected_busbw_gbps,
                "floor_source": self.floor_source,
                "link_bytes_per_second": self.link_bytes_per_second,
                "link_basis": self.link_basis, "link_efficiency": self.link_efficiency,
                "stalled_ranks": list(self.stalled_ranks), "store_port": self.store_port,
                "pids": list(self.pids), "debug_log": self.debug_log, "nccl": self.nccl,
                "elapsed_s": round(self.elapsed_s, 3), "notes": list(self.notes),
                "engine": self.engine, "nccl_version": self.nccl_version,
                "libnccl": self.libnccl,
                "phase_times_s": {k: round(v, 4) for k, v in self.phase_times_s.items()},
                "first_allreduce_s": (round(self.first_allreduce_s, 4)
                                      if self.first_allreduce_s is not None else None),
                "shm_removed": list(self.shm_removed), "environment": self.environment}


def rows_of(record: RunRecord) -> list[Row]:
    """Sizes every rank measured, time averaged over ranks, correctness from every rank."""
    rows = []
    n = record.options.world_size
    for size in record.options.sizes:
        times = [st.times.get(size) for st in record.ranks]
        if any(t is None or t <= 0 for t in times):
            break
        t = sum(x for x in times if x) / len(times)
        checks = [st.verified.get(size) for st in record.ranks]
        correct = None if any(c is None for c in checks) else all(bool(c and c.get("ok"))
                                                                  for c in checks)
        wrong = sum(int(c.get("mismatches", 0)) for c in checks if c)
        rows.append(Row(size, t, method.algbw_gbps(size, t), method.busbw_gbps(size, t, n),
                        correct, wrong))
    return rows


def _wrong_sum(record: RunRecord, rows: Sequence[Row]) -> str | None:
    for row in rows:
        if row.correct is False:
            bad = [(st.rank, st.label, st.verified[row.size_bytes]) for st in record.ranks
                   if not st.verified[row.size_bytes].get("ok")]
            parts = [f"rank {r} ({label}): {v.get('mismatches')} of {v.get('elements')} elements "
                     f"wrong, first at element {v.get('first_index')}: got {v.get('got'):g}, "
                     f"expected {v.get('want'):g}" for r, label, v in bad]
            return f"the all-reduce of {fmt_bytes(row.size_bytes)} gave a wrong sum on " + \
                "; ".join(parts)
    return None


def phase_times(record: RunRecord) -> dict[str, float]:
    """Per phase, the slowest rank's seconds (the run waits for it), in the order they happen;
    ``speed``: the speed step the same workers ran first."""
    out: dict[str, float] = {}
    per_rank = [{**st.start_times, **st.allreduce_times,
                 **({"speed": sum(st.speed_times.values())} if st.speed_times else {})}
                for st in record.ranks]
    for name in PHASE_TIMES:
        values = [times[name] for times in per_rank if name in times]
        if values:
            out[name] = max(values)
    if record.teardown_s is not None:
        out["teardown"] = record.teardown_s
    return out


def _shm_note(record: RunRecord) -> tuple[str, ...]:
    if not record.shm_removed:
        return ()
    return (f"removed {len(record.shm_removed)} NCCL file(s) the workers left in /dev/shm: "
            f"{', '.join(record.shm_removed)}",)


def _run_facts(record: RunRecord) -> dict[str, Any]:
    first = [st.first_allreduce_s for st in record.ranks if st.first_allreduce_s is not None]
    loaded = next((st.loaded for st in record.ranks if st.loaded), {})
    environment = {"python": record.options.python, **loaded}
    nccl = next((st.nccl_version for st in record.ranks if st.nccl_version), None)
    if isinstance(environment.get("libnccl"), dict) and nccl:
        environment["libnccl"] = {**environment["libnccl"], "version": nccl}
    return dict(phase_times_s=phase_times(record), environment=environment,
                engine=next((st.engine for st in record.ranks if st.engine), None),
                nccl_version=next((st.nccl_version for st in record.ranks if st.nccl_version),
                                  None),
                libnccl=next((st.libnccl for st in record.ranks if st.libnccl), None),
                first_allreduce_s=max(first) if first else None,
                shm_removed=record.shm_removed)


def judge(record: RunRecord, *, gpus: Sequence[Gpu] = (),
          min_busbw_gbps: float | None = None, floor_source: str = "--min-busbw",
          notes: Sequence[str] = ()) -> BenchResult:
    """Turn what the workers reported into one verdict (see the module docstring)."""
    opts = record.options
    rows = rows_of(record)
    devices = tuple(st.label for st in record.ranks)
    nccl_info = None
    debug_log = None
    if record.log_dir:
        debug_log = record.log_dir
        text = "".join(p.read_text(errors="replace")
                       for p in sorted(Path(record.log_dir).glob("rank*.log")))
        nccl_info = summarize(text) if opts.backend == "nccl" else None
    base: dict[str, Any] = dict(
        backend=opts.backend, world_size=opts.world_size, devices=devices, rows=tuple(rows),
        store_port=record.store_port, pids=tuple(st.pid for st in record.ranks if st.pid),
        debug_log=debug_log, nccl=nccl_info.to_json() if nccl_info else None,
        elapsed_s=record.elapsed_s, notes=tuple(notes) + _shm_note(record), **_run_facts(record))
    nccl_text = f" NCCL chose: {nccl_info.text()}." if nccl_info else ""
    log_text = f" Worker logs: {debug_log}" if debug_log else KEEP_LOGS

    f = record.failure
    if f is not None:
        if f.kind in ("stalled", "hung"):
            return BenchResult(**base, status=Status.FAIL, reason="AllreduceStalled",
                               message=f.message + "." + nccl_text, remedy=REMEDY_STALL + log_text,
                               stalled_ranks=f.ranks)
        if f.kind == "slow_start":
            return BenchResult(**base, status=Status.ERROR, reason="WorkerStartSlow",
                               message=f.message + "; nothing ran on the GPUs yet.",
                               remedy=f"The workers' interpreter ({opts.python}) took longer "
                                      "than the start-up deadline to start and import its "
                                      "packages: raise bench_timeout_s (preflight bench "
                                      "--timeout S; the start-up may take half of it, at most "
                                      "60 s), or look at the filesystem the environment lives on "
                                      "(a cold NFS cache)." + log_text,
                               stalled_ranks=f.ranks)
        if f.kind == "timeout":
            return BenchResult(**base, status=Status.ERROR, reason="BenchTimeout",
                               message=f.message + ".",
                               remedy="Raise bench_timeout_s (preflight bench --timeout S), or "
                                      "lower bench_max_bytes (preflight bench --max-bytes B)."
                                      + log_text,
                               stalled_ranks=f.ranks)
        tb = ""
        for st in record.ranks:
            if st.rank in f.ranks and st.traceback:
                tb = " Last output: " + st.traceback.strip().splitlines()[-1][-300:]
                break
        if f.kind == "engine":
            return BenchResult(**base, status=Status.ERROR, reason="EngineMissing",
                               message=f.message + ".",
                               remedy="Point --python (config key python) at the training "
                                      "environment's interpreter, or install torch (or nccl4py: "
                                      "pip install nccl4py cuda-bindings) in that environment.",
                               stalled_ranks=f.ranks)
        reason = {"died": "WorkerDied", "spawn": "WorkerSpawnFailed"}.get(f.kind, "WorkerFailed")
        remedy = ("See the named rank's error; a rank killed by SIGKILL is often the OOM killer "
                  "(dmesg | grep -i oom)." + log_text)
        return BenchResult(**base, status=Status.ERROR, reason=reason,
                           message=f.message + "." + (tb if f.kind != "error" else "") + nccl_text,
                           remedy=remedy, stalled_ranks=f.ranks)

    wrong = _wrong_sum(record, rows)
    if wrong:
        return BenchResult(**base, status=Status.FAIL, reason="AllreduceWrongSum",
                           message=wrong + " (integer-valued data, the sum must be exact)." +
                           nccl_text,
                           remedy="Silent data corruption: drain the node and run the GPU "
                                  "diagnostics (dcgmi diag -r 3) on the named GPU." + log_text)
    if not rows:
        return BenchResult(**base, status=Status.ERROR, reason="NoMeasurement",
                           message="the workers finished without reporting a measurement")

    last = rows[-1]
    busbw = last.busbw_gbps
    # A run across nodes (preflight cluster) is bound by the network between them: this node's
    # NVLink / PCIe figures and the per-node table say nothing about it.
    across = opts.world is not None and opts.world_size > opts.nproc
    link = method.link_bandwidth(gpus) if opts.backend == "nccl" and not across else None
    eff = method.link_efficiency(busbw, link)
    at = f"busbw {busbw:.2f} GB/s at {fmt_bytes(last.size_bytes)} over {opts.world_size} ranks"
    link_text = (f"; link efficiency {eff:.2f} of {link.basis}" if link and eff is not None
                 else f"; link efficiency not shown: busbw is above the link figure {link.basis}"
                      f", so NVML's link figures are wrong" if link
                 else "; link bandwidth unknown (no NVML figures)"
                 if opts.backend == "nccl" and not across else "")
    if link and link.degraded:
        link_text += "; below the others: " + "; ".join(link.degraded)
    extra: dict[str, Any] = dict(busbw_gbps=round(busbw, 3),
                                 link_bytes_per_second=link.bytes_per_second if link else None,
                                 link_basis=link.basis if link else None,
                                 link_efficiency=round(eff, 4) if eff is not None else None)

    if min_busbw_gbps is not None:
        status = Status.FAIL if busbw < min_busbw_gbps else Status.PASS
        return BenchResult(**base, **extra, status=status,
                           reason="BusbwLow" if status is Status.FAIL else "AllreduceOk",
                           message=f"{at}; floor {min_busbw_gbps:g} GB/s ({floor_source})"
                                   f"{link_text}.{nccl_text if status is Status.FAIL else ''}",
                           remedy=REMEDY_SLOW if status is Status.FAIL else "",
                           expected_busbw_gbps=min_busbw_gbps, floor_source=floor_source)

    ref = method.reference_for(gpus) if opts.backend == "nccl" and not across else None
    if ref is None and across and opts.backend == "nccl":
        return BenchResult(**base, **extra, status=Status.WARN, reason="NoReference",
                           message=f"{at} across nodes; no built-in expectation for the network "
                                   "between nodes (the built-in table is per node).",
                           remedy="Give the floor for the network between the nodes: preflight "
                                  "cluster --min-busbw <GB/s> (or min_busbw_gbps in the config).")
    if ref is None:
        if opts.backend == "gloo":
            return BenchResult(**base, **extra, status=Status.PASS, reason="AllreduceOk",
                               message=f"{at} (gloo on CPU: no floor unless --min-busbw is given)"
                                       f"{link_text}.")
        model = ", ".join(sorted({g.name or "unknown GPU" for g in gpus})) or "unknown GPUs"
        return BenchResult(**base, **extra, status=Status.WARN, reason="NoReference",
                           message=f"{at}; no expected busbw for {opts.nproc}x {model} in the "
                                   f"built-in table{link_text}.",
                           remedy="Give the floor for this node: preflight bench --min-busbw "
                                  "<GB/s> (or min_busbw_gbps in the config).")
    floor = ref.busbw_gbps * method.EXPECTED_FRACTION
    expected = (f"expected {ref.busbw_gbps:g} GB/s for {opts.nproc}x {gpus[0].name} "
                f"({ref.source}), floor {floor:g} GB/s")
    extra.update(expected_busbw_gbps=ref.busbw_gbps, floor_source=ref.source)
    if busbw >= floor:
        status = Status.WARN if link and link.degraded else Status.PASS
        return BenchResult(**base, **extra, status=status,
                           reason="LinksDegraded" if status is Status.WARN else "AllreduceOk",
                           message=f"{at}; {expected}{link_text}.",
                           remedy=REMEDY_SLOW if status is Status.WARN else "")
    if last.size_bytes < method.REFERENCE_MIN_BYTES:
        return BenchResult(**base, **extra, status=Status.WARN, reason="BusbwUnjudged",
                           message=f"{at}; {expected} at >= {fmt_bytes(method.REFERENCE_MIN_BYTES)}"
                                   f"; the largest size was too small to judge{link_text}.",
                           remedy="Judge it at 1 GiB or more: preflight bench --max-bytes 1G, "
                                  "or bench_max_bytes (config) for the allreduce check.")
    return BenchResult(**base, **extra, status=Status.FAIL, reason="BusbwLow",
                       message=f"{at}; {expected}{link_text}.{nccl_text}", remedy=REMEDY_SLOW)


def render_table(result: BenchResult) -> str:
    """nccl-tests-like: one row per size, then the verdict."""
    head = [f"# preflight bench: {result.backend}, {result.world_size} ranks: "
            + ", ".join(f"rank {i} {d}" for i, d in enumerate(result.devices)),
            f"# {'size':>12} {'count':>12} {'type':>6} {'time':>10} {'algbw':>8} {'busbw':>8}"
            f" {'#wrong':>7}",
            f"# {'(B)':>12} {'(elements)':>12} {'':>6} {'(us)':>10} {'(GB/s)':>8} {'(GB/s)':>8}"
            f" {'':>7}"]
    lines = list(head)
    for r in result.rows:
        wrong = "N/A" if r.correct is None else str(r.wrong)
        lines.append(f"  {r.size_bytes:>12} {r.size_bytes // method.ELEMENT_BYTES:>12} "
                     f"{'float':>6} {r.time_s * 1e6:>10.1f} {r.algbw_gbps:>8.2f} "
                     f"{r.busbw_gbps:>8.2f} {wrong:>7}")
    lines.append(f"# {result.status.name} {result.reason}: {result.message}")
    if result.remedy and result.status >= Status.WARN:
        lines.append(f"# fix: {result.remedy}")
    for note in result.notes:
        lines.append(f"# note: {note}")
    if result.phase_times_s:
        lines.append("# phases (s, slowest rank): " + ", ".join(
            f"{k} {v:.3f}" for k, v in result.phase_times_s.items())
            + (f"; engine {result.engine}" if result.engine else "")
            + (f", NCCL {result.nccl_version}" if result.nccl_version else ""))
    if result.environment.get("python"):
        lines.append(f"# environment: {environment_text(result.environment)}")
    return "\n".join(lines)


def environment_text(env: dict[str, Any]) -> str:
    """"python /venv/bin/python 3.12.3; torch 2.11.0 (/venv/.../torch/__init__.py); libnccl
    2.28.9 (/venv/.../libnccl.so.2)": what a worker imported and loaded, from where."""
    parts = [f"python {env.get('python')}" + (f" {env['python_version']}"
                                              if env.get("python_version") else "")]
    for key, word in (("torch", "torch"), ("nccl4py", "nccl4py"),
                      ("cuda_bindings", "cuda-bindings"), ("libnccl", "libnccl"),
                      ("libcublas", "libcublas")):
        item = env.get(key)
        if isinstance(item, dict) and item.get("path"):
            version = f" {item['version']}" if item.get("version") else ""
            parts.append(f"{word}{version} ({item['path']})")
    return "; ".join(parts)
