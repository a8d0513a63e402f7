"""``cuda_devices``: what CUDA will really see through CUDA_VISIBLE_DEVICES, and whether the local
ranks fit in it.

What: reads CUDA_VISIBLE_DEVICES exactly as CUDA does (:mod:`preflight.jobenv.cuda_visible`:
indices, GPU UUIDs and
unique UUID prefixes, MIG, enumeration stopping at the first invalid entry, duplicates), maps every
entry to an NVML GPU by UUID or PCI bus id (never by NVML index), and checks that
LOCAL_RANK < visible GPUs and LOCAL_WORLD_SIZE <= visible GPUs.

Why: a wrong CUDA_VISIBLE_DEVICES fails late and obscurely. ``device_ids=[rank]`` or a physical GPU
number where the remapped local rank belongs gives "RuntimeError: CUDA error: invalid device
ordinal"; "0,-1,1" silently hides GPU 1 (CUDA stops at the invalid entry: CUDA C Programming Guide,
"CUDA Environment Variables"); a GPU listed twice leaves CUDA with no device, and NCCL says
"Duplicate GPU detected"; on a node of mixed GPU models CUDA's default FASTEST_FIRST order is not
nvidia-smi's, so index 0 may be another card than intended.

Verdicts: FAIL when CUDA would see no GPU, a different set than listed (stop, duplicate, ambiguous
prefix, second MIG device), or fewer GPUs than the local ranks need; WARN for an ambiguous index
order, unclean entries, a GPU in MIG mode; SKIP with ``expect_gpus = 0`` or when NVML reports no
GPU (``gpu_visible`` judges that); without NVML the text alone is judged (WARN) or SKIP.

Knobs: ``expect_gpus`` (0 skips the check). Environment read: CUDA_VISIBLE_DEVICES,
CUDA_DEVICE_ORDER, LOCAL_RANK, LOCAL_WORLD_SIZE, SLURM_SCRIPT_CONTEXT (a prolog sees physical
indices, Slurm docs, "Prolog and Epilog Guide").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from preflight.core.context import Context, activity
from preflight.core.result import Finding, Result, Scope, Status, fold
from preflight.jobenv import cuda_visible
from preflight.jobenv.launcher import env_int
from preflight.probes.gpu import GpuSnapshot

NAME = "cuda_devices"
SHOW_DEVICES = 4

REMEDY_LOCAL_RANK = (
    "Index GPUs by the local rank within the visible set: torch.cuda.set_device(local_rank) and "
    "DDP(model, device_ids=[local_rank]) with local_rank = int(os.environ['LOCAL_RANK']), never "
    "the global rank or a physical GPU number; make CUDA_VISIBLE_DEVICES list at least "
    "LOCAL_WORLD_SIZE GPUs (or unset it) and start torchrun --nproc-per-node=<visible GPUs>. "
    "If Slurm binds one GPU per task (--gpus-per-task=1), every task uses cuda:0.")
REMEDY_ORDER = ("export CUDA_DEVICE_ORDER=PCI_BUS_ID (CUDA indices then equal nvidia-smi indices), "
                "or list GPUs by UUID: CUDA_VISIBLE_DEVICES=GPU-<uuid> (nvidia-smi -L)")


#: CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER and the local ranks are the job's own settings.
JOB = Scope.JOB


def _shown(raw: str | None) -> str:
    return "CUDA_VISIBLE_DEVICES unset" if raw is None else f"CUDA_VISIBLE_DEVICES={raw}"


def _listed(devices: Sequence[cuda_visible.Device]) -> str:
    """'cuda:0 = GPU 0 (0000:18:00.0), ...' for the first few devices."""
    parts = [f"cuda:{d.cuda_index} = {d.describe()}" for d in devices[:SHOW_DEVICES]]
    more = f", ... ({len(devices)} in all)" if len(devices) > SHOW_DEVICES else ""
    return ", ".join(parts) + more


def _sees(devices: Sequence[cuda_visible.Device]) -> str:
    """'sees only GPU 0 (0000:18:00.0)' / 'sees 8 GPUs: ...' / 'sees no GPU'."""
    if not devices:
        return "sees no GPU"
    if len(devices) == 1:
        return f"sees only {devices[0].describe()}"
    return f"sees {len(devices)} GPUs: {_listed(devices)}"


def _entries_text(entries: Sequence[cuda_visible.Entry]) -> str:
    return ", ".join(repr(e.raw) for e in entries)


def _suggest(parsed: cuda_visible.Parsed, snap: GpuSnapshot, skip: cuda_visible.Entry | None, *,
             order: str | None, physical: bool) -> str:
    """A value without the offending entry, if that one resolves cleanly; else ''."""
    entries = parsed.entries or ()
    keep: list[str] = []
    for e in entries:
        if e is skip or e.raw in keep or not e.raw.strip():
            continue
        keep.append(e.raw.strip())
    if not keep:
        return ""
    value = ",".join(keep)
    res = cuda_visible.resolve_devices(cuda_visible.parse(value), snap, device_order=order,
                               physical_indices=physical)
    if res.stop or res.duplicate or not res.devices:
        return ""
    return f"export CUDA_VISIBLE_DEVICES={value}"


def _uuid_without_prefix(entry: cuda_visible.Entry, snap: GpuSnapshot) -> str:
    """'GPU 1 (GPU-11a0...)' when ``entry`` is the start of a GPU UUID written without 'GPU-'."""
    text = entry.raw.strip().lower()
    if not entry.looks_like_bare_uuid:
        return ""
    hits = [g for g in snap.gpus if g.uuid.lower().startswith("gpu-" + text)]
    return f"GPU {hits[0].index} ({hits[0].uuid})" if len(hits) == 1 else ""


def _without_nvml(parsed: cuda_visible.Parsed, snap: GpuSnapshot,
                  details: dict[str, Any]) -> Result:
    why = snap.error or "NVML not available"
    shown = _shown(parsed.raw)
    if parsed.unset:
        return Result(NAME, Status.SKIP, "NvmlUnavailable",
                      f"{shown}: CUDA would see every GPU, but {why}; cannot map devices",
                      details=details)
    if parsed.empty:
        return Result(NAME, Status.WARN, "CvdEmpty",
                      f"{shown} (empty): CUDA sees no GPU ({why})",
                      "unset CUDA_VISIBLE_DEVICES to use every GPU, or list them: "
                      "export CUDA_VISIBLE_DEVICES=0,1,...", details=details, scope=JOB)
    stop, dup = cuda_visible.text_problems(parsed)
    if dup is not None:
        return Result(NAME, Status.WARN, "CvdDuplicate",
                      f"{shown}: entries {dup[0].position} and {dup[1].position} ({dup[0].raw!r})"
                      f" name the same device; CUDA then exposes no device and NCCL fails with "
                      f"'Duplicate GPU detected' ({why}, GPUs not checked)",
                      "List each GPU once in CUDA_VISIBLE_DEVICES.", details=details, scope=JOB)
    if stop is not None and not stop.harmless:
        return Result(NAME, Status.WARN, "CvdStopsEarly",
                      f"{shown}: CUDA stops at {stop.entry.raw!r} (entry {stop.entry.position}: "
                      f"{stop.why}) and ignores the rest ({_entries_text(stop.dropped) or 'none'})"
                      f"; {why}, GPUs not checked",
                      f"Remove or fix entry {stop.entry.position} of CUDA_VISIBLE_DEVICES.",
                      details=details, scope=JOB)
    count = len(parsed.entries or ())
    return Result(NAME, Status.SKIP, "NvmlUnavailable",
                  f"{shown}: {count} entr{'y' if count == 1 else 'ies'}, no text problem; "
                  f"{why}, so they cannot be mapped to GPUs", details=details)


def run(ctx: Context) -> Result:
    raw = ctx.env.get("CUDA_VISIBLE_DEVICES")
    order_raw = ctx.env.get("CUDA_DEVICE_ORDER")
    prolog = ctx.env.get("SLURM_SCRIPT_CONTEXT", "").startswith("prolog")
    details: dict[str, Any] = {"cuda_visible_devices": raw, "cuda_device_order": order_raw,
                                  "slurm_prolog": prolog}
    if ctx.config.expect_gpus == 0:
        return Result(NAME, Status.SKIP, "NoGpuExpected",
                      "expect_gpus is 0 (CPU-only node): CUDA devices not checked", details=details)
    parsed = cuda_visible.parse(raw)
    with activity("NVML query"):
        snap = ctx.gpus()
    if not snap.available:
        return _without_nvml(parsed, snap, details)
    if not any(g.error is None for g in snap.gpus):
        return Result(NAME, Status.SKIP, "NoGpu",
                      f"NVML reports no usable GPU; nothing for {_shown(raw)} to select "
                      "(gpu_visible judges the GPU count)", details=details)

    order = order_raw if order_raw in (cuda_visible.ORDER_PCI, cuda_visible.ORDER_FASTEST) else None
    res = cuda_visible.resolve_devices(parsed, snap, device_order=order, physical_indices=prolog)
    details["visible"] = [d.to_json() for d in res.devices]
    details["visible_count"] = len(res.devices)
    details["device_order"] = res.order
    shown = _shown(raw)
    findings: list[Finding] = []

    if parsed.empty:
        findings.append(Finding(
            Status.FAIL, "CvdEmpty",
            f"{shown} (empty string): CUDA sees no GPU; the node has {len(snap.gpus)}",
            "unset CUDA_VISIBLE_DEVICES to use every GPU, or list the job's GPUs "
            "(export CUDA_VISIBLE_DEVICES=0,1,...); in Kubernetes request nvidia.com/gpu",
            scope=JOB))
    if res.duplicate is not None:
        first, second = res.duplicate
        fix = _suggest(parsed, snap, second, order=order, physical=prolog)
        findings.append(Finding(
            Status.FAIL, "CvdDuplicate",
            f"{shown}: entries {first.position} ({first.raw!r}) and {second.position} "
            f"({second.raw!r}) name the same GPU; CUDA then exposes no device at all (as PyTorch "
            "and nvitop model the driver) and NCCL fails with 'Duplicate GPU detected'",
            "List each GPU once" + (f": {fix}" if fix else " in CUDA_VISIBLE_DEVICES"), scope=JOB))
        details["duplicate_entries"] = [first.position, second.position]
    if res.stop is not None:
        stop = res.stop
        details["stopped_at_entry"] = stop.entry.position
        details["stopped_at"] = stop.entry.raw
        bare = _uuid_without_prefix(stop.entry, snap)
        at = (f"{shown}: CUDA stops at {stop.entry.raw!r} (entry {stop.entry.position}: "
              f"{stop.why}) and {_sees(res.devices)}")
        ignored = f"; ignored after it: {_entries_text(stop.dropped)}" if stop.dropped else ""
        if bare:
            at += (f"; {stop.entry.raw!r} looks like the start of {bare} without 'GPU-', but "
                   "CUDA reads an entry without GPU-/MIG- as an index")
        fix = _suggest(parsed, snap, stop.entry, order=order, physical=prolog)
        remedy = (f"Write GPU-{stop.entry.raw.strip()}" if bare else
                  f"Remove or fix entry {stop.entry.position}" + (f": {fix}" if fix else
                  " (a valid index, or GPU-<uuid> from nvidia-smi -L)"))
        if res.ambiguous is not None:
            findings.append(Finding(Status.FAIL, "CvdAmbiguousPrefix", at + ignored,
                                    "Use a longer UUID prefix or the full UUID from nvidia-smi "
                                    "-L (e.g. " + res.ambiguous[1][0].uuid + ")", scope=JOB))
        elif stop.harmless:
            findings.append(Finding(Status.WARN, "CvdTerminator", at, remedy, scope=JOB))
        else:
            findings.append(Finding(Status.FAIL, "CvdStopsEarly", at + ignored, remedy,
                                    scope=JOB))
    bare_entries: set[int] = set()
    for dev in res.devices:
        entry = dev.entry
        bare = _uuid_without_prefix(entry, snap) if entry is not None and entry.trailing else ""
        if entry is None or not bare:
            continue
        bare_entries.add(entry.position)
        same = dev.gpu.uuid.lower().startswith("gpu-" + entry.raw.strip().lower())
        findings.append(Finding(
            Status.WARN if same else Status.FAIL, "CvdUuidWithoutPrefix",
            f"{shown}: entry {entry.position} {entry.raw!r} looks like the start of {bare} "
            f"without 'GPU-', but CUDA reads it as index {entry.index} ("
            + ("the same GPU by luck)" if same else f"{dev.describe()}, another GPU)"),
            f"Write GPU-{entry.raw.strip()} in CUDA_VISIBLE_DEVICES", scope=JOB))
    if res.mig_dropped:
        kept = next((d for d in res.devices if d.mig is not None), None)
        findings.append(Finding(
            Status.FAIL, "CvdMultipleMig",
            f"{shown}: lists {len(res.mig_dropped) + 1} MIG devices but CUDA enumerates only one "
            f"per process ({kept.describe() if kept else 'the first'}); ignored: "
            f"{_entries_text(res.mig_dropped)}",
            "Give each process one MIG device (CUDA_VISIBLE_DEVICES=MIG-<uuid> from nvidia-smi "
            "-L), or use whole GPUs for multi-GPU training", scope=JOB))
    if res.mig_parents:
        findings.append(Finding(
            Status.WARN, "CvdMigGpu",
            f"{shown}: " + ", ".join(f"GPU {g.index} ({g.pci_bus_id})" for g in res.mig_parents)
            + " in MIG mode: CUDA sees one MIG instance at most, not the whole GPU",
            "Disable MIG for multi-GPU training (nvidia-smi -i N -mig 0) or select one MIG "
            "device by UUID"))

    local_rank, local_ws = env_int(ctx.env, "LOCAL_RANK"), env_int(ctx.env, "LOCAL_WORLD_SIZE")
    details["local_rank"], details["local_world_size"] = local_rank, local_ws
    n = len(res.devices)
    if not prolog and not parsed.empty and res.duplicate is None:
        rank_bad = local_rank is not None and local_rank >= n
        size_bad = local_ws is not None and local_ws > n
        if rank_bad or size_bad:
            have = (f"CUDA sees only {n} GPU{'s' if n != 1 else ''}"
                    + (f" (cuda:0..cuda:{n - 1})" if n > 1 else " (cuda:0)" if n else ""))
            parts = ([f"LOCAL_RANK={local_rank}"] if rank_bad else []) + \
                ([f"LOCAL_WORLD_SIZE={local_ws}"] if size_bad else [])
            why = (f": torch.cuda.set_device({local_rank}) / device_ids=[{local_rank}] fails with "
                   "'CUDA error: invalid device ordinal'" if rank_bad else
                   f": {local_ws} local processes need {local_ws} GPUs")
            findings.append(Finding(
                Status.FAIL, "LocalRankOutOfRange" if rank_bad else "LocalWorldSizeTooBig",
                f"{' and '.join(parts)} but {have} with {shown}{why}", REMEDY_LOCAL_RANK,
                scope=JOB))

    if order_raw is not None and order is None:
        findings.append(Finding(
            Status.WARN, "CudaOrderUnknown",
            f"CUDA_DEVICE_ORDER={order_raw!r} is neither PCI_BUS_ID nor FASTEST_FIRST; CUDA "
            "falls back to its default, FASTEST_FIRST", "export CUDA_DEVICE_ORDER=PCI_BUS_ID",
            scope=JOB))
    if res.order_ambiguous and (res.uses_indices or parsed.unset):
        models = sorted({g.name for g in snap.gpus if g.error is None})
        findings.append(Finding(
            Status.WARN, "CudaOrderAmbiguous",
            f"GPU models differ ({', '.join(models)}) and CUDA_DEVICE_ORDER is "
            f"{'unset' if order_raw is None else repr(order_raw)} (FASTEST_FIRST): CUDA's device i "
            "(cuda:i, and index i in CUDA_VISIBLE_DEVICES) need not be nvidia-smi GPU i; the "
            "mapping shown assumes PCI order",
            REMEDY_ORDER, scope=JOB))
    for position, note in res.notes:
        if position in bare_entries:
            continue
        findings.append(Finding(Status.WARN, "CvdNotClean", f"{shown}: {note}",
                                "Write plain comma-separated entries without blanks or suffixes",
                                scope=JOB))

    return fold(NAME, findings, ok_reason="CvdOk",
                summary=_summary(res, shown, local_rank, prolog=prolog), details=details)


def _summary(res: cuda_visible.Resolution, shown: str, local_rank: int | None, *,
             prolog: bool) -> str:
    n = len(res.devices)
    text = f"{shown}: CUDA {_sees(res.devices)}"
    if res.parsed.unset and n:
        text = f"{shown}: CUDA sees all {n} GPU{'s' if n != 1 else ''}: {_listed(res.devices)}"
    if local_rank is not None and 0 <= local_rank < n:
        text += f"; LOCAL_RANK {local_rank} -> cuda:{local_rank} = " \
                f"{res.devices[local_rank].describe()}"
    if prolog:
        text += ("; Slurm prolog: indices are physical GPU numbers, the job sees them renumbered "
                 "from cuda:0")
    return text
