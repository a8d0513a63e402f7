"""The kernel log's NVIDIA Xid lines, and what each Xid code means for the node (pure).

Two input forms, both carrying the time since boot (so the two sources agree):

* ``/dev/kmsg`` records (Documentation/ABI/testing/dev-kmsg): ``"6,1234,5678901,-;text"`` =
  priority, sequence number, microseconds since boot, flags; continuation lines start with a space
  (``" SUBSYSTEM=pci"``) and belong to the record above.
* ``journalctl -k -o short-monotonic`` lines: ``"[  123.456789] host kernel: text"``.

The driver writes an Xid as ``NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the
bus.`` (older drivers without ``PCI:``). The table below says, per code, whether the node or the
job is at fault, from NVIDIA's Xid catalogue (docs/checks.md, section xid, lists the sources).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from preflight.probes.pci import normalize_bus_id


class XidClass(enum.Enum):
    """Who is at fault: the node (drain it) or the job (its code; the node is fine)."""

    NODE = "node"
    JOB = "job"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class XidInfo:
    """One row of the Xid table.

    Attributes:
        code: the Xid number.
        what: NVIDIA's short description.
        cls: node fault (FAIL) or job fault (reported only).
        action: what the operator does (reset the GPU, drain + reboot, RMA).
    """

    code: int
    what: str
    cls: XidClass
    action: str


_RESET = "reset the GPU (nvidia-smi -r -i <gpu>, no process may use it) or reboot the node"
_DRAIN = "drain the node and reboot it; if it recurs after the reboot, RMA the GPU"
_RMA = "drain the node; open an RMA with the GPU's serial (nvidia-smi -q | grep Serial)"
_APP = "none on the node: the job's own code faulted; fix or rerun the job"

#: Xid code -> class and operator action. Sources: NVIDIA's Xid catalogue ("Analyzing Xid Errors
#: with the Xid Catalog", resolution buckets RESTART_APP / RESET_GPU / RESTART_BM /
#: CONTACT_SUPPORT) and the dynamic page retirement / row remapping guides; docs/checks.md.
XID_TABLE: dict[int, XidInfo] = {info.code: info for info in (
    XidInfo(13, "graphics engine exception (often an out-of-range access in a kernel)",
            XidClass.JOB, _APP),
    XidInfo(31, "GPU memory page fault (MMU fault: the job touched an invalid address)",
            XidClass.JOB, _APP),
    XidInfo(43, "GPU stopped processing: the job's channel was reset (user fault)",
            XidClass.JOB, _APP),
    XidInfo(45, "preemptive cleanup: the job's channels were torn down (killed or crashed)",
            XidClass.JOB, _APP),
    XidInfo(68, "NVDEC0 exception (video decoder; usually the application's stream)",
            XidClass.JOB, _APP),
    XidInfo(69, "graphics engine class error (invalid method from the application)",
            XidClass.JOB, _APP),
    XidInfo(8, "GPU stopped processing: a channel idle timeout (catalogue: RESTART_APP)",
            XidClass.JOB, _APP),
    XidInfo(32, "invalid or corrupted push buffer stream (PCIe or driver)", XidClass.NODE,
            _RESET),
    XidInfo(46, "GPU stopped processing", XidClass.NODE, _RESET),
    XidInfo(48, "double-bit ECC error (uncorrectable memory error)", XidClass.NODE, _RESET),
    XidInfo(63, "page retirement / row remapping recorded: pending until the GPU is reset",
            XidClass.NODE, _RESET),
    XidInfo(64, "page retirement / row remapping failed", XidClass.NODE, _RMA),
    XidInfo(74, "NVLink error", XidClass.NODE, _RESET),
    XidInfo(79, "GPU has fallen off the bus", XidClass.NODE, _DRAIN),
    XidInfo(92, "high single-bit ECC error rate", XidClass.NODE, _RESET),
    XidInfo(94, "contained uncorrectable ECC error", XidClass.NODE, _RESET),
    XidInfo(95, "uncontained uncorrectable ECC error", XidClass.NODE, _RESET),
    XidInfo(119, "GSP RPC timeout (GPU System Processor does not answer)", XidClass.NODE,
            _RESET),
    XidInfo(120, "GSP error", XidClass.NODE, _RESET),
    XidInfo(121, "C2C (chip-to-chip) link error", XidClass.NODE, _DRAIN),
    XidInfo(140, "unrecovered ECC error", XidClass.NODE, _RESET),
    XidInfo(144, "NVLink SAW error", XidClass.NODE, _RESET),
    XidInfo(145, "NVLink RLW error", XidClass.NODE, _RESET),
    XidInfo(146, "NVLink TLW error", XidClass.NODE, _RESET),
    XidInfo(147, "NVLink TREX error", XidClass.NODE, _RESET),
    XidInfo(148, "NVLink NVLPW_CTRL error", XidClass.NODE, _RESET),
    XidInfo(149, "NVLink NETIR error", XidClass.NODE, _RESET),
    XidInfo(150, "NVLink MSE error", XidClass.NODE, _RESET),
    XidInfo(154, "GPU recovery action changed (the driver asks for a reset or a reboot)",
            XidClass.NODE, _RESET),
)}


def classify(code: int) -> XidInfo:
    """The table row of ``code``; codes not in the table are UNKNOWN (reported, never FAIL)."""
    return XID_TABLE.get(code) or XidInfo(
        code, "not in preflight's table", XidClass.UNKNOWN,
        "look the code up in NVIDIA's Xid catalogue "
        "(https://docs.nvidia.com/deploy/xid-errors/)")


@dataclass(frozen=True)
class LogLine:
    """One kernel log message with its time since boot (seconds; None when unknown)."""

    text: str
    uptime_s: float | None = None


@dataclass(frozen=True)
class XidEvent:
    """One Xid the driver logged.

    Attributes:
        bus_id: the GPU's PCI address as the driver printed it, normalised to ``dddd:bb:dd``
            (the driver leaves out the function).
        code: the Xid number.
        detail: the rest of the line (pid, the driver's words).
        uptime_s: seconds after boot it was logged; None when the source has no time.
    """

    bus_id: str
    code: int
    detail: str
    uptime_s: float | None = None

    @property
    def info(self) -> XidInfo:
        return classify(self.code)


_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]{1,8}):([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})"
                  r"(?:\.[0-7])?\): (\d{1,5})\b,? ?(.*)$")
_KMSG = re.compile(r"^(\d+),(\d+),(\d+),([^;]*);(.*)$")
_JOURNAL = re.compile(r"^\[\s*(\d+\.\d+)\]\s+(.*)$")
#: Longest detail text kept per Xid (a bounded report even for a corrupt line).
MAX_DETAIL_CHARS = 240


def parse_xid(line: LogLine) -> XidEvent | None:
    """The Xid in ``line``, or None when it is not an Xid line."""
    m = _XID.search(line.text)
    if m is None:
        return None
    domain, bus, dev, code, detail = m.groups()
    bus_id = f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}"
    return XidEvent(bus_id, int(code), detail.strip()[:MAX_DETAIL_CHARS], line.uptime_s)


def parse_kmsg(text: str) -> Iterator[LogLine]:
    """``/dev/kmsg`` records (one per line; continuation lines skipped) -> messages.

    A line that is not a record (a fixture written by hand, a truncated read) is kept as text
    without a time, so an Xid in it is still seen.
    """
    for raw in text.splitlines():
        if not raw or raw.startswith(" "):
            continue
        m = _KMSG.match(raw)
        if m is None:
            yield LogLine(raw)
            continue
        yield LogLine(_unescape(m.group(5)), int(m.group(3)) / 1e6)


def parse_journal(text: str) -> Iterator[LogLine]:
    """``journalctl -k -o short-monotonic`` lines -> messages (the ``host kernel:`` prefix stays
    in the text; the Xid pattern does not care)."""
    for raw in text.splitlines():
        if not raw or raw.startswith("-- "):
            continue
        m = _JOURNAL.match(raw)
        yield LogLine(m.group(2), float(m.group(1))) if m else LogLine(raw)


def _unescape(text: str) -> str:
    r"""/dev/kmsg escapes non-printable bytes as ``\xNN``; the Xid text never needs them, but a
    bus id must not hide behind one."""
    if "\\x" not in text:
        return text
    return re.sub(r"\\x([0-9a-fA-F]{2})", lambda m: chr(int(m.group(1), 16)), text)


def xids(lines: Iterable[LogLine]) -> list[XidEvent]:
    """Every Xid among ``lines``, in log order."""
    return [x for x in map(parse_xid, lines) if x is not None]


def scan(text: str, form: str) -> tuple[list[XidEvent], float | None]:
    """(every Xid, the first record's time since boot) of a whole log in ``form`` ``kmsg`` or
    ``journal``. Only lines that contain ``Xid`` are parsed in full: a 32 MiB log costs one pass
    of ``str.find`` instead of two regular expressions per line."""
    parse = parse_kmsg if form == "kmsg" else parse_journal
    first: float | None = None
    for line in text[:4096].splitlines()[:8]:
        first = next((ln.uptime_s for ln in parse(line) if ln.uptime_s is not None), None)
        if first is not None:
            break
    candidates = [ln for ln in text.splitlines() if "Xid" in ln]
    return xids(parse("\n".join(candidates))), first


def gpu_key(bus_id: str) -> str:
    """``dddd:bb:dd`` of a full PCI bus id (NVML's ``00000000:3B:00.0``), to match Xid lines."""
    full = normalize_bus_id(bus_id)
    return full.rpartition(".")[0] if "." in full else full


__all__ = ["XID_TABLE", "LogLine", "XidClass", "XidEvent", "XidInfo", "classify", "gpu_key",
           "parse_journal", "parse_kmsg", "parse_xid", "scan", "xids"]
