"""What NVML tells about the node's GPUs, as plain data, and the probe interface.

The data types here carry no behaviour beyond (de)serialisation, so a fixture file (JSON) can stand
for a whole node in tests and demos (``PREFLIGHT_NVML_FIXTURE``).
"""

from __future__ import annotations

import json
import os
import stat
import threading
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from preflight.core.boundedio import MAX_FILE_BYTES, BoundedReadError, read_bounded
from preflight.core.context import activity


@dataclass(frozen=True)
class PcieLink:
    """PCIe link state: a link trained below its maximum halves (or worse) host<->GPU bandwidth."""

    gen: int
    max_gen: int
    width: int
    max_width: int


@dataclass(frozen=True)
class NvLink:
    """One NVLink of a GPU. ``remote_bus_id`` is the peer's PCI bus id when NVML knows it."""

    link: int
    active: bool
    remote_bus_id: str | None = None


@dataclass(frozen=True)
class GpuClocks:
    """Clocks, power and why the GPU runs slow now, for the gpu_speed check's limits and reasons.

    ``clock_reasons`` are all active NVML clock-event reasons (``GpuIdle`` and
    ``ApplicationsClocksSetting`` included), not only the slowdowns of ``Gpu.throttle_reasons``.
    """

    sm_clock_mhz: int | None = None
    max_sm_clock_mhz: int | None = None
    max_mem_clock_mhz: int | None = None
    mem_bus_width_bits: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    default_power_limit_w: float | None = None
    temperature_c: int | None = None
    clock_reasons: tuple[str, ...] = ()


@dataclass(frozen=True)
class MigInstance:
    uuid: str
    gpu_instance: int | None = None
    compute_instance: int | None = None


@dataclass(frozen=True)
class Gpu:
    """One physical GPU as NVML sees it (``index`` is NVML's index, i.e. PCI bus order).

    ``error`` is set when the GPU did not answer (GPU lost, NVML error); the other fields then hold
    what could still be read. ``None`` means "not supported / not readable", never "healthy".
    """

    index: int
    uuid: str
    pci_bus_id: str
    name: str = ""
    memory_total_bytes: int | None = None
    #: GPU memory in use (NVML's ``used``, the driver's own reservation included), bytes.
    memory_used_bytes: int | None = None
    error: str | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    ecc_uncorrectable_volatile: int | None = None
    throttle_reasons: tuple[str, ...] = ()
    pcie: PcieLink | None = None
    nvlinks: tuple[NvLink, ...] = ()
    #: per-link, per-direction NVLink bandwidth in bytes/s, when known
    nvlink_link_bytes_per_second: float | None = None
    mig_enabled: bool = False
    mig_instances: tuple[MigInstance, ...] = ()
    compute_pids: tuple[int, ...] = ()
    #: "DEFAULT", "EXCLUSIVE_PROCESS", "PROHIBITED" (nvidia-smi -c), "EXCLUSIVE_THREAD" (old).
    compute_mode: str | None = None
    clocks: GpuClocks | None = None

    @property
    def active_nvlinks(self) -> int:
        return sum(1 for link in self.nvlinks if link.active)


@dataclass(frozen=True)
class GpuSnapshot:
    """The node's GPUs at one moment.

    Attributes:
        available: NVML could be initialised.
        error: why NVML is not available (no driver, library missing...).
        driver_version: e.g. "570.124.06".
        cuda_driver_version: CUDA version the driver supports, as NVML gives it (12080 = 12.8).
        gpus: one entry per NVML index, including the ones that did not answer.
        pci_gpu_bus_ids: NVIDIA display/3D controllers found on the PCI bus (sysfs); a GPU there but
            absent from NVML has fallen off the bus or is not bound to the driver.
        unanswered: None when the probe answered; else why it did not, as
            :class:`DeadlineGpuProbe` judged it: ``hung`` (the driver is initialised, yet NVML
            did not answer within ``gpu_probe_timeout_s``: the node's fault) or ``slow`` (no
            answer within the longest wait, and nothing shows the GPUs initialised: possibly a
            first initialisation without persistence mode, undecided).
    """

    available: bool
    error: str | None = None
    driver_version: str | None = None
    cuda_driver_version: int | None = None
    nvml_version: str | None = None
    gpus: tuple[Gpu, ...] = ()
    pci_gpu_bus_ids: tuple[str, ...] = field(default=())
    unanswered: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GpuSnapshot:
        gpus = []
        for raw in data.get("gpus", ()):
            g = dict(raw)
            pcie = g.pop("pcie", None)
            nvlinks = g.pop("nvlinks", ())
            mig = g.pop("mig_instances", ())
            clocks = g.pop("clocks", None)
            gpus.append(
                Gpu(
                    **{k: v for k, v in g.items() if k not in ("throttle_reasons", "compute_pids")},
                    throttle_reasons=tuple(g.get("throttle_reasons", ())),
                    compute_pids=tuple(g.get("compute_pids", ())),
                    pcie=PcieLink(**pcie) if pcie else None,
                    nvlinks=tuple(NvLink(**link) for link in nvlinks),
                    mig_instances=tuple(MigInstance(**m) for m in mig),
                    clocks=GpuClocks(**{**clocks, "clock_reasons": tuple(
                        clocks.get("clock_reasons", ()))}) if clocks else None,
                )
            )
        return cls(
            available=bool(data["available"]),
            error=data.get("error"),
            driver_version=data.get("driver_version"),
            cuda_driver_version=data.get("cuda_driver_version"),
            nvml_version=data.get("nvml_version"),
            gpus=tuple(gpus),
            pci_gpu_bus_ids=tuple(data.get("pci_gpu_bus_ids", ())),
            unanswered=data.get("unanswered"),
        )


class GpuProbe(Protocol):
    """Anything that can tell what GPUs the node has (real NVML, or a fixture in tests)."""

    def snapshot(self) -> GpuSnapshot: ...


class FixtureGpuProbe:
    """A probe that answers from a fixed snapshot: tests, demos, and replaying a captured node."""

    def __init__(self, snapshot: GpuSnapshot) -> None:
        self._snapshot = snapshot

    def snapshot(self) -> GpuSnapshot:
        return self._snapshot


class FixtureFileGpuProbe:
    """Answers from a snapshot JSON file, read when asked (so a bad file is that check's ERROR).

    A regular file is read bounded (:func:`~preflight.core.boundedio.read_bounded`). A FIFO is
    the one other thing taken: it is read like a driver that answers late or never (the tests'
    hung ``nvmlInit``), waiting for its writer, at most :data:`MAX_FILE_BYTES`; only
    :class:`DeadlineGpuProbe`, which every Context puts in front, bounds that wait. A device or
    a directory is refused.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def snapshot(self) -> GpuSnapshot:
        try:
            return GpuSnapshot.from_json(json.loads(self._read()))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise RuntimeError(f"NVML fixture {self.path} unusable: {exc}") from exc

    def _read(self) -> bytes:
        if not stat.S_ISFIFO(os.stat(self.path).st_mode):
            return read_bounded(self.path)
        with open(self.path, "rb") as f:  # blocks until a writer comes: a hung driver
            data = f.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise BoundedReadError(f"{self.path}: more than the {MAX_FILE_BYTES} bytes a "
                                   "snapshot may have")
        return data


class DeadlineGpuProbe:
    """A probe whose snapshot always comes back in time: a driver that does not answer is data.

    NVML calls have no timeout: a hung driver blocks ``nvmlInit`` (or any query) for good, and
    NHC treats a hung ``nvidia-smi`` as a bad node. The inner probe runs on a daemon thread. When
    it has not answered after ``timeout_s`` and ``driver_warm()`` names evidence that the GPUs
    are already initialised (a persistence daemon, another process holding ``/dev/nvidiaN``), a
    warm NVML answers in well under a second (docs/slurm.md has the figures), so the snapshot
    says ``unanswered="hung"``. Without such evidence the first initialisation may simply be slow
    (NVIDIA: "order of 1-3 second" per GPU without persistence mode), so it waits up to
    ``longest_s`` and then says ``unanswered="slow"``. Once a call hung, later calls answer the
    same at once: the stuck thread still holds the driver.

    Args:
        inner: the probe to bound (NVML, a fixture file).
        timeout_s: the deadline when the driver is known to be initialised.
        longest_s: the deadline otherwise (at least ``timeout_s``).
        driver_warm: evidence that the GPUs are initialised (a sentence), or None.
    """

    def __init__(self, inner: GpuProbe, *, timeout_s: float, longest_s: float,
                 driver_warm: Callable[[], str | None]) -> None:
        self._inner = inner
        self.timeout_s = timeout_s
        self.longest_s = max(timeout_s, longest_s)
        self._driver_warm = driver_warm
        self._stuck: GpuSnapshot | None = None

    def snapshot(self) -> GpuSnapshot:
        if self._stuck is not None:
            return self._stuck
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["value"] = self._inner.snapshot()
            except BaseException as exc:  # handed to the caller's thread below
                box["error"] = exc

        thread = threading.Thread(target=target, name="gpu-probe", daemon=True)
        with activity("NVML snapshot (nvmlInit and the queries of every GPU)"):
            thread.start()
            thread.join(self.timeout_s)
            return self._judge(thread, box)

    def _judge(self, thread: threading.Thread, box: dict[str, Any]) -> GpuSnapshot:
        if thread.is_alive():
            warm = self._driver_warm()
            if warm is not None:
                self._stuck = GpuSnapshot(
                    available=False, unanswered="hung",
                    error=f"NVML did not answer within {self.timeout_s:.3g} s although the driver "
                          f"is initialised ({warm}); a warm NVML answers in well under a second")
                return self._stuck
            thread.join(self.longest_s - self.timeout_s)
        if thread.is_alive():
            self._stuck = GpuSnapshot(
                available=False, unanswered="slow",
                error=f"NVML did not answer within {self.longest_s:.3g} s, and nothing shows the "
                      "GPUs initialised (no persistence daemon, no process holding /dev/nvidia*): "
                      "a first initialisation without persistence mode can take 1-3 s per GPU, "
                      "so this may be slow rather than hung")
            return self._stuck
        if "error" in box:
            raise box["error"]
        value: GpuSnapshot = box["value"]
        return value
