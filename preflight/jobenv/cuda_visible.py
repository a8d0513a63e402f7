"""``CUDA_VISIBLE_DEVICES`` read the way CUDA reads it, and resolved against NVML's GPUs.

Pure functions: :func:`parse` turns the text into entries, :func:`resolve_devices` walks them
against a :class:`~preflight.probes.gpu.GpuSnapshot` and says which devices CUDA will really
expose, in which order, and why it stopped where it stopped.

The rules (CUDA Programming Guide, "CUDA_VISIBLE_DEVICES"; the MIG user guide):

- Unset: every GPU. Empty string: none.
- Comma-separated entries: integer indices, ``GPU-<uuid>`` or a unique prefix of it (the "GPU-"
  is part of the prefix: the docs and the MPS guide only show it with "GPU-"),
  ``MIG-<GPU-uuid>/<GI>/<CI>`` and ``MIG-<uuid>``. Only one MIG instance is usable per process.
- Enumeration stops at the first invalid entry: "0,2,-1,1" exposes 0 and 2.
- An index is read like ``strtoul``: leading blanks and a sign are skipped and reading stops at the
  first non-digit, so "1gpu" is index 1 (observed on the driver by PyTorch's
  ``torch.cuda._parse_visible_devices``, which models it the same way).
- The first entry fixes the kind (indices, GPU UUIDs, or MIG UUIDs); an entry of another kind ends
  the list (PyTorch's and nvitop's parsers model the driver that way).
- A device listed twice makes the driver expose no device at all (PyTorch and nvitop model it so);
  NCCL, when it gets that far, fails with "Duplicate GPU detected".
- An index i counts in CUDA's enumeration order: ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` is PCI bus
  order; the default FASTEST_FIRST equals PCI order only when all GPUs are the same model. Each
  entry is therefore mapped to an NVML device by UUID or PCI bus id, never by NVML index.
- In a Slurm prolog the variable holds physical (NVML) indices (Slurm docs, "Prolog and Epilog
  Guide").

Facts that no document states and that were taken from PyTorch's / nvitop's model of the driver
(strtoul indices, kind mixing, duplicates) are named as such in the messages; docs/checks.md gives
a ctypes one-liner that asks the real driver.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass

from preflight.probes.gpu import Gpu, GpuSnapshot, MigInstance
from preflight.probes.pci import normalize_bus_id

ORDER_PCI = "PCI_BUS_ID"
ORDER_FASTEST = "FASTEST_FIRST"

_INDEX = re.compile(r"^[ \t\n\r\f\v]*([+-]?)([0-9]+)")
_HEX_UUIDISH = re.compile(r"^[0-9a-fA-F]{4,}(?:-[0-9a-fA-F]*)*$")
#: Indices larger than this are out of range on any machine; keeps int() cheap on huge input.
_MAX_INDEX_DIGITS = 12


class Kind(enum.Enum):
    """What an entry is, as CUDA reads it."""

    INDEX = "index"
    GPU_UUID = "gpu-uuid"
    MIG = "mig"
    INVALID = "invalid"


@dataclass(frozen=True)
class Entry:
    """One comma-separated entry.

    Attributes:
        position: 1-based position in the list (as messages count it).
        raw: the text between the commas, untouched.
        kind: how CUDA reads it.
        index: for INDEX, the value ``strtoul`` reads (may be negative or huge).
        trailing: for INDEX, the text after the digits that CUDA ignores ("gpu" in "1gpu").
        uuid: for GPU_UUID, the text after "GPU-"; for MIG, the uuid text after "MIG-" or
            after "MIG-GPU-" (lower-cased, stripped of nothing else).
        gpu_instance, compute_instance: for ``MIG-GPU-<uuid>/<GI>/<CI>``.
        why_invalid: for INVALID, why CUDA rejects the text.
    """

    position: int
    raw: str
    kind: Kind
    index: int | None = None
    trailing: str = ""
    uuid: str = ""
    gpu_instance: int | None = None
    compute_instance: int | None = None
    why_invalid: str = ""

    @property
    def looks_like_bare_uuid(self) -> bool:
        """Hex text like a UUID or its prefix, written without "GPU-"."""
        return bool(_HEX_UUIDISH.match(self.raw.strip()))


@dataclass(frozen=True)
class Parsed:
    """The variable as text: ``entries`` is None when it is unset."""

    raw: str | None
    entries: tuple[Entry, ...] | None

    @property
    def unset(self) -> bool:
        return self.raw is None

    @property
    def empty(self) -> bool:
        return self.raw == ""


def parse_entry(position: int, raw: str) -> Entry:
    """Classify one entry the way CUDA reads it (never raises)."""
    if raw.startswith("MIG-"):
        body = raw[len("MIG-"):]
        if "/" in body:
            uuid, _, rest = body.partition("/")
            gi, sep, ci = rest.partition("/")
            if not uuid.startswith("GPU-") or not sep or not gi.isascii() or not ci.isascii() \
                    or not gi.isdigit() or not ci.isdigit():
                return Entry(position, raw, Kind.INVALID,
                             why_invalid="not of the form MIG-GPU-<uuid>/<GI>/<CI>")
            return Entry(position, raw, Kind.MIG, uuid=uuid[len("GPU-"):].lower(),
                         gpu_instance=int(gi[:_MAX_INDEX_DIGITS]),
                         compute_instance=int(ci[:_MAX_INDEX_DIGITS]))
        if body.startswith("GPU-"):
            return Entry(position, raw, Kind.INVALID,
                         why_invalid="MIG-GPU-<uuid> needs /<GI>/<CI> after the GPU UUID")
        if not body:
            return Entry(position, raw, Kind.INVALID, why_invalid="MIG- without a UUID")
        return Entry(position, raw, Kind.MIG, uuid=body.lower())
    if raw.startswith("GPU-"):
        body = raw[len("GPU-"):]
        if not body:
            return Entry(position, raw, Kind.INVALID, why_invalid="GPU- without a UUID")
        return Entry(position, raw, Kind.GPU_UUID, uuid=body.lower())
    m = _INDEX.match(raw)
    if m is None:
        why = "empty entry" if not raw.strip() else "neither an index nor GPU-/MIG- UUID"
        return Entry(position, raw, Kind.INVALID, why_invalid=why)
    sign, digits = m.groups()
    digits = digits.lstrip("0") or "0"
    value = int(digits) if len(digits) <= _MAX_INDEX_DIGITS else 10 ** _MAX_INDEX_DIGITS
    return Entry(position, raw, Kind.INDEX, index=-value if sign == "-" else value,
                 trailing=raw[m.end():])


def parse(value: str | None) -> Parsed:
    """Split ``CUDA_VISIBLE_DEVICES`` into entries (None = unset, "" = no device)."""
    if value is None:
        return Parsed(None, None)
    if value == "":
        return Parsed("", ())
    return Parsed(value, tuple(parse_entry(i, part)
                               for i, part in enumerate(value.split(","), start=1)))


@dataclass(frozen=True)
class Device:
    """One device CUDA will expose: ``cuda_index`` is what ``cuda:N`` means in the job."""

    cuda_index: int
    gpu: Gpu
    mig: MigInstance | None = None
    entry: Entry | None = None

    def describe(self) -> str:
        where = f"GPU {self.gpu.index} ({self.gpu.pci_bus_id})"
        if self.mig is not None:
            return f"MIG {self.mig.uuid} on {where}"
        return where

    def to_json(self) -> dict[str, object]:
        return {"cuda_index": self.cuda_index, "nvml_index": self.gpu.index,
                "uuid": self.gpu.uuid, "pci_bus_id": self.gpu.pci_bus_id, "name": self.gpu.name,
                "mig_uuid": self.mig.uuid if self.mig else None}


@dataclass(frozen=True)
class Stop:
    """Where and why CUDA stopped reading the list."""

    entry: Entry
    why: str
    #: entries after the stop that CUDA never reads
    dropped: tuple[Entry, ...]
    #: True for a deliberate-looking terminator ("-1", an empty last entry) that hides nothing
    harmless: bool = False


@dataclass(frozen=True)
class Resolution:
    """What CUDA will really see.

    Attributes:
        parsed: the entries.
        devices: the devices CUDA exposes, in ``cuda:N`` order.
        stop: where enumeration stopped, if it did before the end.
        duplicate: (first, second) entries naming the same device; CUDA then exposes none.
        ambiguous: (entry, matching GPUs) for a UUID prefix that fits several GPUs.
        mig_dropped: MIG devices listed after the first one (CUDA uses only one).
        mig_parents: GPUs in MIG mode named by index or GPU UUID.
        order: the CUDA_DEVICE_ORDER in effect (PCI_BUS_ID or FASTEST_FIRST).
        order_ambiguous: index i may not be the i-th GPU in PCI order (mixed GPU models under
            FASTEST_FIRST); the index mapping is then a guess.
        physical_indices: indices were read as NVML indices (Slurm prolog).
        notes: (entry position, text) of cosmetic findings (text after an index, blanks).
    """

    parsed: Parsed
    devices: tuple[Device, ...]
    stop: Stop | None = None
    duplicate: tuple[Entry, Entry] | None = None
    ambiguous: tuple[Entry, tuple[Gpu, ...]] | None = None
    mig_dropped: tuple[Entry, ...] = ()
    mig_parents: tuple[Gpu, ...] = ()
    order: str = ORDER_FASTEST
    order_ambiguous: bool = False
    physical_indices: bool = False
    notes: tuple[tuple[int, str], ...] = ()

    @property
    def uses_indices(self) -> bool:
        entries = self.parsed.entries
        return bool(entries) and entries is not None and entries[0].kind is Kind.INDEX


def cuda_order(gpus: Sequence[Gpu], order: str) -> tuple[list[Gpu], bool]:
    """NVML GPUs in CUDA's enumeration order, and whether that order is only a guess.

    PCI_BUS_ID: PCI bus order. FASTEST_FIRST (default): on a node of one GPU model CUDA breaks the
    tie by PCI bus id, so it is PCI order too; on a mixed node the order depends on CUDA's speed
    heuristic, which NVML cannot reproduce: we return PCI order and say it is a guess.
    """
    usable = [g for g in gpus if g.error is None and g.pci_bus_id]
    ordered = sorted(usable, key=lambda g: normalize_bus_id(g.pci_bus_id))
    models = {g.name for g in usable}
    return ordered, order != ORDER_PCI and len(models) > 1


def _match_gpu_uuid(prefix: str, gpus: Sequence[Gpu]) -> list[Gpu]:
    exact = [g for g in gpus if g.uuid.lower() == f"gpu-{prefix}"]
    return exact or [g for g in gpus if g.uuid.lower().startswith(f"gpu-{prefix}")]


def _match_mig(entry: Entry, gpus: Sequence[Gpu]) -> list[tuple[Gpu, MigInstance]]:
    found: list[tuple[Gpu, MigInstance]] = []
    if entry.gpu_instance is not None:
        for gpu in _match_gpu_uuid(entry.uuid, gpus):
            found += [(gpu, m) for m in gpu.mig_instances
                      if m.gpu_instance == entry.gpu_instance
                      and m.compute_instance == entry.compute_instance]
        return found
    pairs = [(g, m) for g in gpus for m in g.mig_instances]
    exact = [(g, m) for g, m in pairs if m.uuid.lower() == f"mig-{entry.uuid}"]
    return exact or [(g, m) for g, m in pairs if m.uuid.lower().startswith(f"mig-{entry.uuid}")]


def resolve_devices(parsed: Parsed, snapshot: GpuSnapshot, *, device_order: str | None = None,
                    physical_indices: bool = False) -> Resolution:
    """Walk the entries as CUDA does and return the devices it will expose, and why.

    Args:
        parsed: from :func:`parse`.
        snapshot: NVML's view of the node (must be ``available``).
        device_order: the value of CUDA_DEVICE_ORDER (None = unset = FASTEST_FIRST).
        physical_indices: read indices as NVML indices (a Slurm prolog runs outside the job's
            device cgroup, Slurm docs, "Prolog and Epilog Guide").
    """
    order = ORDER_PCI if device_order == ORDER_PCI else ORDER_FASTEST
    ordered, order_guess = cuda_order(snapshot.gpus, order)
    if physical_indices:
        by_index = sorted((g for g in snapshot.gpus if g.error is None), key=lambda g: g.index)
        ordered, order_guess = by_index, False
    usable = [g for g in snapshot.gpus if g.error is None]
    base = Resolution(parsed=parsed, devices=(), order=order, physical_indices=physical_indices)

    if parsed.entries is None:
        devices = tuple(Device(i, g) for i, g in enumerate(ordered))
        return _mig_view(_replace(base, devices=devices, order_ambiguous=order_guess))

    notes: list[tuple[int, str]] = []
    picked: list[tuple[Entry, Gpu, MigInstance | None]] = []
    stop: Stop | None = None
    duplicate: tuple[Entry, Entry] | None = None
    ambiguous: tuple[Entry, tuple[Gpu, ...]] | None = None
    entries = parsed.entries
    first_kind = entries[0].kind if entries else Kind.INVALID
    for n, entry in enumerate(entries):
        why = ""
        target: tuple[Gpu, MigInstance | None] | None = None
        if entry.kind is Kind.INVALID:
            why = entry.why_invalid
        elif entry.kind is not first_kind:
            why = (f"a {entry.kind.value} entry after {first_kind.value} entries (CUDA reads "
                   "one kind per list)")
        elif entry.kind is Kind.INDEX:
            assert entry.index is not None
            if entry.index < 0:
                why = f"negative index {entry.index}"
            elif entry.index >= len(ordered):
                valid = {0: "none", 1: "0"}.get(len(ordered), f"0..{len(ordered) - 1}")
                why = (f"index {entry.index} is out of range: the node has {len(ordered)} "
                       f"GPU{'s' if len(ordered) != 1 else ''} (valid: {valid})")
            else:
                target = (ordered[entry.index], None)
                if entry.trailing.strip():
                    notes.append((entry.position, f"entry {entry.position} {entry.raw!r} reads "
                                  f"as index {entry.index}: CUDA ignores {entry.trailing!r}"))
                elif entry.raw != entry.raw.strip():
                    notes.append((entry.position,
                                  f"entry {entry.position} {entry.raw!r} has blanks"))
        elif entry.kind is Kind.GPU_UUID:
            matches = _match_gpu_uuid(entry.uuid, usable)
            if not matches:
                why = "no GPU has a UUID starting with it"
            elif len(matches) > 1:
                why = (f"the prefix fits {len(matches)} GPUs ("
                       + ", ".join(f"GPU {g.index} {g.uuid}" for g in matches) + ")")
                ambiguous = (entry, tuple(matches))
            else:
                target = (matches[0], None)
        else:
            migs = _match_mig(entry, usable)
            if not migs:
                why = "no MIG device has that UUID / GI / CI"
            elif len(migs) > 1:
                why = f"the prefix fits {len(migs)} MIG devices"
            else:
                target = migs[0]
        if target is not None:
            same = next((e for e, g, m in picked if g is target[0] and m is target[1]), None)
            if same is not None:
                duplicate = (same, entry)
                break
            picked.append((entry, target[0], target[1]))
            continue
        rest = entries[n + 1:]
        terminator = (entry.kind is Kind.INDEX and (entry.index or 0) < 0) \
            or not entry.raw.strip()
        harmless = not rest and terminator and bool(picked)
        stop = Stop(entry, why, tuple(rest), harmless=harmless)
        break

    if duplicate is not None:
        # The driver exposes no device at all for a repeated device.
        return _replace(base, duplicate=duplicate, order_ambiguous=order_guess,
                        notes=tuple(notes))
    mig_dropped: list[Entry] = []
    migs_seen = [p for p in picked if p[2] is not None]
    if len(migs_seen) > 1:
        first = migs_seen[0]
        mig_dropped = [e for e, _g, m in migs_seen[1:]]
        picked = [p for p in picked if p[2] is None or p is first]
    devices = tuple(Device(i, g, m, e) for i, (e, g, m) in enumerate(picked))
    return _mig_view(_replace(base, devices=devices, stop=stop, ambiguous=ambiguous,
                              mig_dropped=tuple(mig_dropped),
                              order_ambiguous=order_guess and first_kind is Kind.INDEX,
                              notes=tuple(notes)))


def text_problems(parsed: Parsed) -> tuple[Stop | None, tuple[Entry, Entry] | None]:
    """What can be said without knowing the GPUs (no NVML): the first entry CUDA rejects on its
    text alone (garbage, a negative index, an entry of another kind), and a repeated entry."""
    entries = parsed.entries or ()
    seen: dict[tuple[Kind, object], Entry] = {}
    for n, entry in enumerate(entries):
        why = ""
        if entry.kind is Kind.INVALID:
            why = entry.why_invalid
        elif entry.kind is not entries[0].kind:
            why = f"a {entry.kind.value} entry after {entries[0].kind.value} entries"
        elif entry.kind is Kind.INDEX and (entry.index or 0) < 0:
            why = f"negative index {entry.index}"
        if why:
            rest = entries[n + 1:]
            return Stop(entry, why, tuple(rest), harmless=not rest and n > 0), None
        key: tuple[Kind, object] = (entry.kind, entry.index if entry.kind is Kind.INDEX
                                    else (entry.uuid, entry.gpu_instance, entry.compute_instance))
        if key in seen:
            return None, (seen[key], entry)
        seen[key] = entry
    return None, None


def _mig_view(res: Resolution) -> Resolution:
    """A GPU in MIG mode named as a whole exposes (at most) its first MIG instance to CUDA."""
    parents = tuple(d.gpu for d in res.devices if d.mig is None and d.gpu.mig_enabled)
    if not parents:
        return res
    devices: list[Device] = []
    mig_used = any(d.mig is not None for d in res.devices)
    for d in res.devices:
        if d.mig is None and d.gpu.mig_enabled:
            if d.gpu.mig_instances and not mig_used:
                devices.append(Device(len(devices), d.gpu, d.gpu.mig_instances[0], d.entry))
                mig_used = True
            continue
        devices.append(Device(len(devices), d.gpu, d.mig, d.entry))
    return _replace(res, devices=tuple(devices), mig_parents=parents)


def _replace(res: Resolution, **changes: object) -> Resolution:
    return dataclasses.replace(res, **changes)  # type: ignore[arg-type]


__all__ = ["ORDER_FASTEST", "ORDER_PCI", "Device", "Entry", "Kind", "Parsed", "Resolution",
           "Stop", "cuda_order", "parse", "parse_entry", "resolve_devices", "text_problems"]
