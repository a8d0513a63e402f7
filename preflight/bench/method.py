"""The arithmetic of the all-reduce test, as nccl-tests does it, and what the hardware allows.

Pure functions, no torch: the parent, the ``allreduce`` check and the tests share them.

* busbw (docs/bandwidth.md, nccl-tests ``src/all_reduce.cu`` AllReduceGetBw): algbw = bytes /
  seconds / 1e9; busbw = algbw x 2(n-1)/n. GB/s means 1e9 B/s; sizes are 1024-based.
* The size sweep doubles from ``min_bytes`` to ``max_bytes`` (nccl-tests ``-f 2``).
* The expected busbw per GPU model and GPU count comes from docs/bandwidth.md; a node is judged at
  its largest size (never on an average over the sweep), FAIL below 0.9 x expected.
* The theoretical link bandwidth is read from NVML: active NVLinks x per-link bandwidth, else
  PCIe generation x width, so a GPU with a link down shows as a lower link efficiency.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from preflight.probes.gpu import Gpu

GB = 1e9
GiB = 1 << 30
#: Bytes of one element: the test reduces float32 holding small integers, so the sum is exact.
ELEMENT_BYTES = 4
#: nccl-tests fails a run below 0.9 x the floor it is given (NCCL_TESTS_MIN_BW, docs/bandwidth.md).
EXPECTED_FRACTION = 0.9
#: The reference figures hold for large messages; below this size busbw is still rising
#: (2x H200: 300 GB/s at 256 MiB, 330 at 1 GiB, docs/bandwidth.md).
REFERENCE_MIN_BYTES = GiB
#: Share of a GPU's memory the test may use for its largest buffer (one buffer, a mask of a
#: quarter of its size for the check, NCCL's own buffers and the CUDA context share the rest).
MEMORY_SHARE = 4
#: Most ranks one node's all-reduce may start (``bench --nproc``, ``cluster --nproc-per-node``):
#: more than any node's GPUs (NVL72 trays hold 4; HGX boards 8, 16 at most), and a bound on the
#: processes a typo (``--nproc 100000``) can start.
MAX_NPROC = 64

#: PCIe per-lane, per-direction payload bandwidth in bytes/s by generation: 2.5/5 GT/s with
#: 8b/10b coding, 8/16/32 GT/s with 128b/130b, 64 GT/s PAM4 with FLIT mode (242/256).
PCIE_LANE_BYTES_PER_SECOND = {1: 0.25e9, 2: 0.5e9, 3: 0.985e9, 4: 1.969e9, 5: 3.938e9, 6: 7.563e9}


def bus_factor(world_size: int) -> float:
    """2(n-1)/n: how much of the data each rank sends and receives in a ring all-reduce."""
    if world_size < 1:
        raise ValueError(f"world size must be >= 1, got {world_size}")
    return 2.0 * (world_size - 1) / world_size


def algbw_gbps(size_bytes: int, time_s: float) -> float:
    """Algorithm bandwidth in GB/s (1e9 B/s): bytes reduced per second of one operation."""
    if time_s <= 0:
        raise ValueError(f"time must be > 0 s, got {time_s}")
    return size_bytes / time_s / GB


def busbw_gbps(size_bytes: int, time_s: float, world_size: int) -> float:
    """Bus bandwidth in GB/s, comparable across GPU counts and to the hardware's link speed."""
    return algbw_gbps(size_bytes, time_s) * bus_factor(world_size)


def sweep(min_bytes: int, max_bytes: int) -> list[int]:
    """Sizes from ``min_bytes`` doubling up to ``max_bytes`` (both included), each a whole number
    of float32 elements.

    Raises:
        ValueError: when a bound is below one element or ``min_bytes > max_bytes``.
    """
    lo = _round_elements(min_bytes)
    hi = _round_elements(max_bytes)
    if min_bytes < ELEMENT_BYTES or max_bytes < ELEMENT_BYTES:
        raise ValueError(f"sizes must be >= {ELEMENT_BYTES} bytes (one float32), got "
                         f"{min_bytes}..{max_bytes}")
    if lo > hi:
        raise ValueError(f"--min-bytes {min_bytes} is larger than --max-bytes {max_bytes}")
    sizes = []
    size = lo
    while size < hi:
        sizes.append(size)
        size *= 2
    sizes.append(hi)
    return sizes


def _round_elements(n: int) -> int:
    return max(ELEMENT_BYTES, n - n % ELEMENT_BYTES)


def memory_cap_bytes(gpus: Sequence[Gpu]) -> int | None:
    """Largest power-of-two size the GPUs' memory allows, None when NVML gave no memory size."""
    totals = [g.memory_total_bytes for g in gpus if g.memory_total_bytes]
    if not totals:
        return None
    budget = min(totals) // MEMORY_SHARE
    cap = ELEMENT_BYTES
    while cap * 2 <= budget:
        cap *= 2
    return cap


def parse_size(text: str) -> int:
    """``"1G"`` -> 1073741824: a byte count with an optional 1024-based K/M/G/T suffix (as
    nccl-tests' ``-b``/``-e``), also ``KiB``/``MiB``/``GiB``/``TiB``.

    Raises:
        ValueError: on anything else, with a message naming the text.
    """
    raw = text.strip()
    units = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    low = raw.lower().removesuffix("ib").removesuffix("b") if raw else raw
    suffix = low[-1:] if low[-1:] in units and low[-1:] else ""
    number = low[: len(low) - len(suffix)].strip()
    if not number.isdigit() or not number.isascii():
        raise ValueError(f"not a size: {text!r} (examples: 1048576, 64M, 1G)")
    return int(number) * units[suffix]


@dataclass(frozen=True)
class Reference:
    """Expected busbw at large messages for one GPU family and count, and where it comes from."""

    busbw_gbps: float
    source: str


_H100_H200 = ("H100", "H200")
#: Expected all-reduce busbw by GPU family and GPU count at >= 1 GiB (docs/bandwidth.md).
#: 8 GPUs: the ring / NVLS-off figure, so a node with NVLink SHARP disabled is not failed for it.
REFERENCES: dict[tuple[tuple[str, ...], int], Reference] = {
    (_H100_H200, 2): Reference(330.0, "nccl-tests all_reduce_perf -g 2 on 2x H200 NV18, 1 GiB"),
    (_H100_H200, 3): Reference(360.0, "NVLink4 ring, <= 4 GPUs (nccl-tests#212, #290)"),
    (_H100_H200, 4): Reference(360.0, "NVLink4 ring, <= 4 GPUs (nccl-tests#212, #290)"),
    (_H100_H200, 8): Reference(365.0, "8x H100/H200 ring, NVLS off (nccl-tests#212, #290, #309)"),
    (("A100",), 8): Reference(230.0, "8x A100 SXM (nccl-tests#119, #290)"),
}


def reference_for(gpus: Sequence[Gpu]) -> Reference | None:
    """The expected busbw for these GPUs, None when the table has no row (WARN, not FAIL).

    Only NVLinked GPUs are in the table: a PCIe card of the same name is far slower.
    """
    if not gpus:
        return None
    names = {g.name for g in gpus}
    if len(names) != 1 or any(g.active_nvlinks == 0 for g in gpus):
        return None
    name = names.pop().upper()
    for (families, count), ref in REFERENCES.items():
        if count == len(gpus) and any(f in name for f in families):
            return ref
    return None


@dataclass(frozen=True)
class LinkBandwidth:
    """What the links allow, per GPU and direction, and how it was worked out.

    Attributes:
        bytes_per_second: the nominal figure the efficiency is computed against (the best GPU's,
            so a GPU with fewer links lowers the efficiency instead of the yardstick).
        basis: the figures used, e.g. "18 active NVLinks x 25 GB/s = 450 GB/s".
        degraded: one line per GPU below the nominal figure.
    """

    bytes_per_second: float
    basis: str
    degraded: tuple[str, ...] = ()


def _gpu_link(gpu: Gpu) -> tuple[float, str] | None:
    speed = gpu.nvlink_link_bytes_per_second
    if gpu.active_nvlinks and speed:
        total = gpu.active_nvlinks * speed
        return total, (f"{gpu.active_nvlinks} active NVLinks x {speed / GB:g} GB/s = "
                       f"{total / GB:g} GB/s")
    if gpu.active_nvlinks:
        # NVLinked GPUs talk over NVLink: PCIe is not their yardstick (issue 14: an unknown
        # NVLink version read as PCIe gave an "efficiency" of 5.23). Unknown stays unknown.
        return None
    if gpu.pcie and gpu.pcie.gen in PCIE_LANE_BYTES_PER_SECOND and gpu.pcie.width > 0:
        total = PCIE_LANE_BYTES_PER_SECOND[gpu.pcie.gen] * gpu.pcie.width
        return total, f"PCIe gen{gpu.pcie.gen} x{gpu.pcie.width} = {total / GB:.1f} GB/s"
    return None


def link_bandwidth(gpus: Sequence[Gpu]) -> LinkBandwidth | None:
    """The theoretical per-direction link bandwidth of these GPUs from NVML, None when unknown."""
    links = [(g, _gpu_link(g)) for g in gpus]
    known = [(g, lb) for g, lb in links if lb is not None]
    if not known:
        return None
    best_gpu, (best, basis) = max(known, key=lambda item: item[1][0])
    degraded = tuple(f"GPU {g.index} ({g.pci_bus_id}): {lb[1]}" for g, lb in known
                     if lb[0] < best)
    return LinkBandwidth(best, f"{basis} (per direction, GPU {best_gpu.index})", degraded)


def link_efficiency(busbw_gbps: float, link: LinkBandwidth | None) -> float | None:
    """busbw / what the links allow, in 0..1; None when unknown or when busbw is above the link
    figure (the figure is then wrong, not the GPUs faster than their links)."""
    if link is None or link.bytes_per_second <= 0 or busbw_gbps < 0:
        return None
    eff = busbw_gbps * GB / link.bytes_per_second
    return eff if eff <= 1.0 else None
