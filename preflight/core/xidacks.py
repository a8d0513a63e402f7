"""Acknowledged Xids: since when an operator says a GPU's logged Xids are dealt with.

An Xid stays in the kernel log until the next boot, so after the GPU is reset (``nvidia-smi
-r``) the ``xid`` check would fail it again at every run. The driver logs nothing for a reset
(NVIDIA's own NVSentinel design notes there is no syslog entry for one), so preflight records
it: ``preflight xid --reset --gpu BUSID`` resets and records, ``preflight xid --ack [--gpu
BUSID]`` records only. A record says "Xids of this GPU (or of every GPU) logged up to this
moment since boot are acknowledged"; a new Xid after it counts again.

Records live in ``<state_dir>/xid-acks.json`` with this boot's id; records of an earlier boot
are ignored (that boot's log is gone too) and dropped at the next write. Times are seconds since
boot (``/proc/uptime``), the clock of the kernel log's timestamps.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from preflight.core.state import StateError, StateFile, boot_id

ACK_STATE = "xid-acks"
#: Records kept per boot (the newest).
MAX_ACKS = 64


@dataclass(frozen=True)
class Ack:
    """One record.

    Attributes:
        gpu: the GPU's PCI address as Xid lines name it (``0000:3b:00``), None = every GPU.
        uptime_s: seconds after boot it was recorded: Xids logged up to then are acknowledged.
        time_s: Unix time it was recorded (for people).
        by: ``ack`` or ``reset`` (the GPU was reset through ``preflight xid --reset``).
    """

    gpu: str | None
    uptime_s: float
    time_s: float
    by: str = "ack"

    def to_json(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "uptime_s": self.uptime_s, "time_s": self.time_s, "by": self.by}

    @classmethod
    def from_json(cls, data: Any) -> Ack | None:
        if not isinstance(data, dict):
            return None
        gpu, up, when, by = (data.get(k) for k in ("gpu", "uptime_s", "time_s", "by"))
        if gpu is not None and not isinstance(gpu, str):
            return None
        if not isinstance(up, (int, float)) or isinstance(up, bool) or up < 0:
            return None
        return cls(gpu, float(up), float(when) if isinstance(when, (int, float)) else 0.0,
                   by if by in ("ack", "reset") else "ack")

    def describe(self) -> str:
        what = "GPU reset" if self.by == "reset" else "acknowledged"
        hours = self.uptime_s / 3600
        at = f"{hours:.1f} h" if hours >= 1 else f"{self.uptime_s:.0f} s"
        return f"{what} at {at} after boot"


def load(state_dir: str, root: Path) -> tuple[Ack, ...]:
    """This boot's records; () when there are none (or the boot id is unknown).

    Raises:
        StateError: the state file exists but cannot be read.
    """
    try:
        data = StateFile(state_dir, ACK_STATE).read()
    except StateError as exc:
        if "does not exist" in str(exc):
            return ()
        raise
    boot = boot_id(root)
    if boot is None or data.get("boot_id") != boot:
        return ()
    acks = data.get("acks")
    parsed = (Ack.from_json(a) for a in acks) if isinstance(acks, list) else ()
    return tuple(a for a in parsed if a is not None)


def record(state_dir: str, root: Path, *, gpu: str | None, uptime_s: float,
           by: str = "ack") -> Ack:
    """Add a record for this boot (earlier boots' records are dropped).

    Raises:
        StateError: the boot id is unknown, or the state cannot be written.
    """
    boot = boot_id(root)
    if boot is None:
        raise StateError(f"cannot read this boot's id under {root}/proc, so an "
                         "acknowledgement could not be tied to this boot")
    ack = Ack(gpu, round(uptime_s, 3), round(time.time(), 3), by)
    with StateFile(state_dir, ACK_STATE).update() as data:
        old = data.get("acks") if data.get("boot_id") == boot else None
        kept = [a for a in old if Ack.from_json(a) is not None] if isinstance(old, list) else []
        data.clear()
        data.update(boot_id=boot, acks=[*kept, ack.to_json()][-MAX_ACKS:])
    return ack


def covering(acks: Sequence[Ack], gpu: str, uptime_s: float | None) -> Ack | None:
    """The newest record that acknowledges an Xid of ``gpu`` logged at ``uptime_s``; None for
    none (an Xid without a time is never acknowledged: its order is unknown)."""
    if uptime_s is None:
        return None
    found = [a for a in acks if (a.gpu is None or a.gpu == gpu) and uptime_s <= a.uptime_s]
    return max(found, key=lambda a: a.uptime_s) if found else None


__all__ = ["ACK_STATE", "Ack", "covering", "load", "record"]
