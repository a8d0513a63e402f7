"""``xid``: the NVIDIA driver's Xid errors in the kernel log, judged by who is at fault.

Verifies: no Xid that means a bad GPU (48 double-bit ECC, 63/64 row remapping pending or failed,
74 NVLink, 79 fell off the bus, 92/94/95 ECC, 119/120 GSP, ...) was logged since boot (or within
``xid_since_s``). Why: such a GPU passes NVML's quick queries for a while and then breaks the next
job mid-run (an NCCL "unhandled cuda error" or a hang); NVIDIA's Xid catalogue says to reset,
reboot or replace it (docs/checks.md, section xid, has the table and its sources). Xids that the
job's own code causes (13, 31, 43, 45, ...) are reported only: a job bug must not drain a node.

Source: ``/dev/kmsg`` under ``--root``, else ``journalctl -k -b 0`` (``preflight.probes.kmsg``),
both with a deadline. Each Xid names the GPU by PCI address; NVML's bus ids map it to an index.
An unreadable kernel log is a WARN (the hardened systemd unit hides it: docs/daemon.md).

Xids that stay fixed: an Xid logged before the GPU was reset through ``preflight xid --reset``,
or before ``preflight xid --ack [--gpu BUSID]`` (records per boot in ``state_dir``,
:mod:`preflight.core.xidacks`), is reported as acknowledged and does not fail; a new Xid after
the record fails again.

Knobs: ``xid_since_s`` (default None = since boot), ``state_dir`` (the acknowledgements).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from preflight.core import xidacks
from preflight.core.context import Context, activity
from preflight.core.result import Result, Status
from preflight.core.state import StateError
from preflight.core.xidacks import Ack, covering
from preflight.probes.kernlog import XidClass, XidEvent, gpu_key, scan

NAME = "xid"
#: A log whose first record is this close to boot covers the whole boot.
_BOOT_COVERED_S = 60.0
#: GPUs / codes named in one message before "and N more".
_MAX_LISTED = 6
CATALOGUE = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"


@dataclass(frozen=True)
class XidCount:
    """How often one GPU logged one Xid code, and the last time. ``acknowledged`` of ``count``
    were logged before a reset or an acknowledgement (``ack`` says which, the newest)."""

    gpu: str
    bus_id: str
    code: int
    count: int
    last_uptime_s: float | None
    last_detail: str
    acknowledged: int = 0
    ack: str = ""

    @property
    def active(self) -> int:
        """The Xids that still count: logged after the last acknowledgement."""
        return self.count - self.acknowledged

    def to_json(self) -> dict[str, Any]:
        info = XidEvent(self.bus_id, self.code, "").info
        return {"gpu": self.gpu, "bus_id": self.bus_id, "xid": self.code, "count": self.count,
                "class": info.cls.value, "what": info.what, "action": info.action,
                "last_uptime_s": self.last_uptime_s, "last_detail": self.last_detail,
                "acknowledged": self.acknowledged, "ack": self.ack or None}


def count(events: Sequence[XidEvent], gpu_of: Mapping[str, int],
          acks: Sequence[Ack] = ()) -> list[XidCount]:
    """Events grouped by (GPU, code) in order of first appearance; ``gpu`` is the NVML index
    when the bus id maps to one, else the bus id (a GPU that fell off the bus is not in NVML).
    An event covered by one of ``acks`` counts as acknowledged."""
    groups: dict[tuple[str, int], list[XidEvent]] = {}
    for ev in events:
        groups.setdefault((ev.bus_id, ev.code), []).append(ev)
    out = []
    for (bus, code), evs in groups.items():
        index = gpu_of.get(bus)
        covered = [a for a in (covering(acks, bus, ev.uptime_s) for ev in evs) if a is not None]
        newest = max(covered, key=lambda a: a.uptime_s).describe() if covered else ""
        out.append(XidCount(str(index) if index is not None else bus, bus, code, len(evs),
                            evs[-1].uptime_s, evs[-1].detail, len(covered), newest))
    return out


def _when(uptime: float | None) -> str:
    if uptime is None:
        return ""
    hours = uptime / 3600
    return f" (last {hours:.1f} h after boot)" if hours >= 1 else f" (last {uptime:.0f} s " \
        "after boot)"


def _name(c: XidCount) -> str:
    return f"GPU {c.gpu} ({c.bus_id})" if c.gpu != c.bus_id else f"GPU at {c.bus_id} " \
        "(not seen by NVML)"


def _listed(items: Sequence[str]) -> str:
    more = len(items) - _MAX_LISTED
    return "; ".join(items[:_MAX_LISTED]) + (f"; and {more} more" if more > 0 else "")


def judge(counts: Sequence[XidCount], *, span: str, source: str) -> Result:
    """The verdict over the counted Xids (pure). ``span`` says since when the log looked."""
    details: dict[str, Any] = {"source": source, "span": span,
                               "xids": [c.to_json() for c in counts]}
    by_class: dict[XidClass, list[XidCount]] = {}
    for c in counts:
        if c.active:
            by_class.setdefault(XidEvent(c.bus_id, c.code, "").info.cls, []).append(c)

    def line(c: XidCount) -> str:
        info = XidEvent(c.bus_id, c.code, "").info
        return f"{_name(c)}: Xid {c.code} x{c.active}, {info.what}{_when(c.last_uptime_s)}"

    job = by_class.get(XidClass.JOB, [])
    job_note = (f" Job-caused Xids (reported only, the node is fine): "
                f"{_listed([line(c) for c in job])}.") if job else ""
    acked = [c for c in counts if c.acknowledged and
             XidEvent(c.bus_id, c.code, "").info.cls is not XidClass.JOB]
    if acked:
        job_note += (" Acknowledged (logged before a GPU reset or `preflight xid --ack`, not "
                     "counted): " + _listed([f"{_name(c)}: Xid {c.code} x{c.acknowledged} "
                                             f"({c.ack})" for c in acked]) + ".")
    node = by_class.get(XidClass.NODE, [])
    if node:
        actions: dict[str, list[str]] = {}
        for c in node:
            actions.setdefault(XidEvent(c.bus_id, c.code, "").info.action, []).append(
                f"{_name(c)} (Xid {c.code})")
        remedy = " ".join(f"{', '.join(dict.fromkeys(who))}: {action}." for action, who in
                          actions.items())
        return Result(NAME, Status.FAIL, "XidNodeFault",
                      f"{len(node)} GPU fault(s) in the kernel log {span}: "
                      f"{_listed([line(c) for c in node])}; expected none.{job_note}",
                      f"{remedy} Meaning of each code: docs/checks.md#xid and {CATALOGUE}",
                      details=details)
    unknown = by_class.get(XidClass.UNKNOWN, [])
    if unknown:
        return Result(NAME, Status.WARN, "XidUnknown",
                      f"Xid code(s) not in preflight's table in the kernel log {span}: "
                      f"{_listed([line(c) for c in unknown])}.{job_note}",
                      f"Look each code up in NVIDIA's Xid catalogue ({CATALOGUE}); if it is a "
                      "hardware fault, drain the node.", details=details)
    if acked:
        return Result(NAME, Status.PASS, "XidAcknowledged",
                      f"no GPU fault in the kernel log {span} after its acknowledgement "
                      f"({source}).{job_note}", details=details)
    if job:
        return Result(NAME, Status.PASS, "XidJobOnly",
                      f"no GPU fault in the kernel log {span} ({source}).{job_note}",
                      details=details)
    return Result(NAME, Status.PASS, "NoXid", f"no Xid in the kernel log {span} ({source})",
                  details=details)


def span_text(first: float | None, *, since_s: float | None) -> str:
    """Since when the verdict looks, in words (``first``: the oldest record's time since boot)."""
    if since_s is not None:
        return f"in the last {since_s:g} s (xid_since_s)"
    if first is None or first <= _BOOT_COVERED_S:
        return "since boot"
    return (f"since {first / 3600:.1f} h after boot (older messages have left the kernel's "
            "ring buffer)")


def run(ctx: Context) -> Result:
    from preflight.probes.kmsg import KernelLogError, read_kernel_log, uptime_s

    deadline = max(1.0, ctx.config.check_timeout_s / 2)
    with activity("reading the kernel log (/dev/kmsg, else journalctl -k)"):
        try:
            log = ctx.cached("kernel_log", lambda: read_kernel_log(ctx.root, deadline_s=deadline))
        except KernelLogError as exc:
            return Result(NAME, Status.WARN, "KernelLogUnreadable",
                          f"cannot read the kernel log, so Xid errors are unknown: {exc}",
                          "Run as root (or with CAP_SYSLOG), or allow the journal: under the "
                          "systemd unit set ProtectKernelLogs=no (docs/daemon.md#kernel-log); "
                          "in a container mount the host's /dev/kmsg or /var/log/journal under "
                          "--root.", details={"error": str(exc)})
    events, first_uptime = scan(log.text, log.form)
    now = uptime_s(ctx.root)
    since = ctx.config.xid_since_s
    if since is not None and now is not None:
        events = [e for e in events if e.uptime_s is None or now - e.uptime_s <= since]
    gpu_of: dict[str, int] = {}
    with activity("NVML query (GPU bus ids)"):
        try:
            snap = ctx.gpus()
        except RuntimeError:  # an unusable fixture: name GPUs by bus id only
            pass
        else:
            gpu_of = {gpu_key(g.pci_bus_id): g.index for g in snap.gpus if g.pci_bus_id}
    source = log.source + (" (truncated)" if log.truncated else "")
    if log.tried:
        source += f"; {'; '.join(log.tried)}"
    try:
        acks = xidacks.load(ctx.config.state_dir, ctx.root)
    except StateError as exc:  # no acknowledgement known: every Xid counts (the safe side)
        acks = ()
        source += f"; acknowledgements unreadable: {exc}"
    return judge(count(events, gpu_of, acks), span=span_text(first_uptime, since_s=since),
                 source=source)
