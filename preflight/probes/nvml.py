"""The real GPU probe, through NVML (``nvidia-ml-py``, imported as ``pynvml``).

Callers never touch pynvml: this module initialises it, decodes bytes, maps NVML errors to text and
returns a :class:`~preflight.probes.gpu.GpuSnapshot`. A call that is not supported on a GPU gives
``None`` for that field, never an exception.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from preflight.core.boundedio import read_small_text
from preflight.probes.gpu import Gpu, GpuClocks, GpuSnapshot, MigInstance, NvLink, PcieLink
from preflight.probes.pci import normalize_bus_id

log = logging.getLogger(__name__)
T = TypeVar("T")

#: NVML clock-event reason bits that mean the hardware is slowing the GPU down (nvml.h).
_SLOWDOWN_BITS = {
    0x0000000000000008: "HwSlowdown",
    0x0000000000000020: "SwThermalSlowdown",
    0x0000000000000040: "HwThermalSlowdown",
    0x0000000000000080: "HwPowerBrakeSlowdown",
}

#: ``nvmlNvlinkVersion_t`` as nvml.h defines it: what ``nvmlDeviceGetNvLinkVersion`` returns is this
#: enum, not the version number (a 2x H200 node answers 6 = NVLink 4.0).
NVLINK_VERSIONS: dict[int, str] = {0: "invalid", 1: "1.0", 2: "2.0", 3: "2.2", 4: "3.0", 5: "3.1",
                                   6: "4.0", 7: "5.0", 8: "6.0"}
#: Nominal per-link, per-direction NVLink bandwidth by NVML enum value, bytes/s (NVIDIA product
#: briefs): NVLink 1.0 (P100) 20 GB/s; 2.x (V100) 25; 3.x (A100, 12 links = 300) 25; 4.0
#: (H100/H200, 18 links = 450) 25; 5.0 (B200, 18 links = 900) 50. NVLink 6.0 has no figure here
#: (its per-link split is not in a brief we can cite): only NVML's speed field can size it.
NVLINK_NOMINAL_BYTES_PER_SECOND: dict[int, float] = {1: 20e9, 2: 25e9, 3: 25e9, 4: 25e9, 5: 25e9,
                                                     6: 25e9, 7: 50e9}
#: ``NVML_FI_DEV_NVLINK_GET_SPEED`` (nvml.h): the link's speed in MB/s (1e6 B/s) per direction,
#: scoped by link; 26562 on an H200 link.
FI_NVLINK_GET_SPEED = 164


def nvlink_link_bytes_per_second(version: int | None,
                                 speed_mbps: int | None = None) -> tuple[float | None, str]:
    """(per-link, per-direction bandwidth in bytes/s, where it came from) for one GPU.

    NVML's measured speed field wins (``speed_mbps``, MB/s); else the nominal figure of the NVLink
    version enum; else ``None``: an unknown enum value is never guessed (nor read as PCIe).
    """
    if speed_mbps is not None and 0 < speed_mbps < 10_000_000:
        return speed_mbps * 1e6, f"NVML link speed {speed_mbps / 1000:g} GB/s"
    if version is None:
        return None, "NVLink version unknown"
    name = NVLINK_VERSIONS.get(int(version))
    nominal = NVLINK_NOMINAL_BYTES_PER_SECOND.get(int(version))
    if name is None:
        return None, f"NVLink version enum {version} unknown to preflight"
    if nominal is None:
        return None, f"NVLink {name}: no nominal per-link figure"
    return nominal, f"NVLink {name} nominal {nominal / 1e9:g} GB/s"


#: Every NVML clock-event reason bit by name (nvml.h nvmlClocksEventReason*), for gpu_speed's why.
_CLOCK_REASON_BITS = {
    0x1: "GpuIdle", 0x2: "ApplicationsClocksSetting", 0x4: "SwPowerCap", 0x8: "HwSlowdown",
    0x10: "SyncBoost", 0x20: "SwThermalSlowdown", 0x40: "HwThermalSlowdown",
    0x80: "HwPowerBrakeSlowdown", 0x100: "DisplayClockSetting",
}
_NVLINK_MAX_LINKS = 18
#: nvmlComputeMode_t values (nvml.h) by name.
_COMPUTE_MODES = {0: "DEFAULT", 1: "EXCLUSIVE_THREAD", 2: "PROHIBITED", 3: "EXCLUSIVE_PROCESS"}

_init_lock = threading.Lock()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def scan_pci_gpus(sys_root: Path) -> tuple[str, ...]:
    """Bus ids of NVIDIA display / 3D controllers under ``<sys_root>/bus/pci/devices``.

    ``vendor`` and ``class`` are read as sysfs attributes (:func:`preflight.core.boundedio.
    read_small_text`): a FIFO, a device or a huge file in their place (a hostile ``--root``) is
    skipped unread, never blocks or fills memory."""
    found = []
    devices = sys_root / "bus" / "pci" / "devices"
    try:
        entries = sorted(devices.iterdir())
    except OSError:
        return ()
    for dev in entries:
        try:
            vendor = read_small_text(dev / "vendor").lower()
            klass = read_small_text(dev / "class").lower()
        except OSError:
            continue
        # 0x0300xx VGA controller, 0x0302xx 3D controller (data-centre GPUs).
        if vendor == "0x10de" and klass[:6] in ("0x0300", "0x0302"):
            found.append(normalize_bus_id(dev.name))
    return tuple(found)


class NvmlGpuProbe:
    """Reads every GPU through NVML. ``sys_root`` is the host's /sys (``--root`` aware)."""

    def __init__(self, *, sys_root: Path = Path("/sys")) -> None:
        self._sys_root = sys_root

    def snapshot(self) -> GpuSnapshot:
        pci_ids = scan_pci_gpus(self._sys_root)
        try:
            import pynvml
        except ImportError as exc:  # pragma: no cover - dependency missing
            return GpuSnapshot(available=False, error=f"nvidia-ml-py not installed: {exc}",
                               pci_gpu_bus_ids=pci_ids)
        try:
            with _init_lock:
                pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            return GpuSnapshot(available=False, error=_init_error(pynvml, exc),
                               pci_gpu_bus_ids=pci_ids)
        try:
            return self._read(pynvml, pci_ids)
        finally:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()

    def _read(self, nv: Any, pci_ids: tuple[str, ...]) -> GpuSnapshot:
        def opt(fn: Callable[..., T], *args: Any) -> T | None:
            try:
                return fn(*args)
            except nv.NVMLError:
                return None

        count = nv.nvmlDeviceGetCount()
        gpus = [self._gpu(nv, opt, i) for i in range(count)]
        driver = opt(nv.nvmlSystemGetDriverVersion)
        nvml_version = opt(nv.nvmlSystemGetNVMLVersion)
        return GpuSnapshot(
            available=True,
            driver_version=_text(driver) if driver is not None else None,
            cuda_driver_version=opt(nv.nvmlSystemGetCudaDriverVersion),
            nvml_version=_text(nvml_version) if nvml_version is not None else None,
            gpus=tuple(gpus),
            pci_gpu_bus_ids=pci_ids,
        )

    def _gpu(self, nv: Any, opt: Callable[..., Any], index: int) -> Gpu:
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
        except nv.NVMLError as exc:
            return Gpu(index=index, uuid="", pci_bus_id="", error=f"NVML: {exc}")
        try:
            uuid = _text(nv.nvmlDeviceGetUUID(handle))
            bus_id = normalize_bus_id(_text(nv.nvmlDeviceGetPciInfo(handle).busId))
        except nv.NVMLError as exc:
            return Gpu(index=index, uuid="", pci_bus_id="", error=f"NVML: {exc}")
        name = opt(nv.nvmlDeviceGetName, handle)
        mem = opt(nv.nvmlDeviceGetMemoryInfo, handle)
        remap = opt(nv.nvmlDeviceGetRemappedRows, handle)
        ecc = opt(nv.nvmlDeviceGetTotalEccErrors, handle,
                  nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)
        reasons_fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            nv.nvmlDeviceGetCurrentClocksThrottleReasons
        reasons = opt(reasons_fn, handle) or 0
        pcie = self._pcie(nv, opt, handle)
        nvlinks, link_speed = self._nvlinks(nv, opt, handle)
        mig_mode = opt(nv.nvmlDeviceGetMigMode, handle)
        mig_enabled = bool(mig_mode and mig_mode[0] == nv.NVML_DEVICE_MIG_ENABLE)
        procs = opt(nv.nvmlDeviceGetComputeRunningProcesses, handle) or []
        mode = opt(nv.nvmlDeviceGetComputeMode, handle)
        # A GPU that answered the handle but fails a plain query has usually fallen off the bus.
        error = None
        temperature = opt(nv.nvmlDeviceGetTemperature, handle, nv.NVML_TEMPERATURE_GPU)
        if temperature is None and mem is None:
            error = "NVML: GPU does not answer queries (temperature and memory both failed)"
        return Gpu(
            index=index,
            uuid=uuid,
            pci_bus_id=bus_id,
            name=_text(name) if name is not None else "",
            memory_total_bytes=int(mem.total) if mem is not None else None,
            memory_used_bytes=int(mem.used) if mem is not None else None,
            error=error,
            remap_pending=bool(remap[2]) if remap is not None else None,
            remap_failure=bool(remap[3]) if remap is not None else None,
            ecc_uncorrectable_volatile=int(ecc) if ecc is not None else None,
            throttle_reasons=tuple(n for bit, n in _SLOWDOWN_BITS.items() if reasons & bit),
            pcie=pcie,
            nvlinks=nvlinks,
            nvlink_link_bytes_per_second=link_speed,
            mig_enabled=mig_enabled,
            mig_instances=self._mig(nv, opt, handle) if mig_enabled else (),
            compute_pids=tuple(int(p.pid) for p in procs),
            compute_mode=_COMPUTE_MODES.get(int(mode), str(mode)) if mode is not None else None,
            clocks=self._clocks(nv, opt, handle, reasons, temperature),
        )

    @staticmethod
    def _clocks(nv: Any, opt: Callable[..., Any], handle: Any, reasons: int,
                temperature: int | None) -> GpuClocks:
        def mw(value: Any) -> float | None:
            return float(value) / 1000 if value is not None else None

        bus = getattr(nv, "nvmlDeviceGetMemoryBusWidth", None)
        return GpuClocks(
            sm_clock_mhz=opt(nv.nvmlDeviceGetClockInfo, handle, nv.NVML_CLOCK_SM),
            max_sm_clock_mhz=opt(nv.nvmlDeviceGetMaxClockInfo, handle, nv.NVML_CLOCK_SM),
            max_mem_clock_mhz=opt(nv.nvmlDeviceGetMaxClockInfo, handle, nv.NVML_CLOCK_MEM),
            mem_bus_width_bits=opt(bus, handle) if bus is not None else None,
            power_w=mw(opt(nv.nvmlDeviceGetPowerUsage, handle)),
            power_limit_w=mw(opt(nv.nvmlDeviceGetEnforcedPowerLimit, handle)),
            default_power_limit_w=mw(opt(nv.nvmlDeviceGetPowerManagementDefaultLimit, handle)),
            temperature_c=int(temperature) if temperature is not None else None,
            clock_reasons=tuple(n for bit, n in _CLOCK_REASON_BITS.items() if reasons & bit),
        )

    @staticmethod
    def _pcie(nv: Any, opt: Callable[..., Any], handle: Any) -> PcieLink | None:
        gen = opt(nv.nvmlDeviceGetCurrPcieLinkGeneration, handle)
        max_gen = opt(nv.nvmlDeviceGetMaxPcieLinkGeneration, handle)
        width = opt(nv.nvmlDeviceGetCurrPcieLinkWidth, handle)
        max_width = opt(nv.nvmlDeviceGetMaxPcieLinkWidth, handle)
        if None in (gen, max_gen, width, max_width):
            return None
        return PcieLink(gen=int(gen), max_gen=int(max_gen), width=int(width),
                        max_width=int(max_width))

    @staticmethod
    def _nvlinks(nv: Any, opt: Callable[..., Any],
                 handle: Any) -> tuple[tuple[NvLink, ...], float | None]:
        links = []
        version = None
        speed_mbps: int | None = None
        for link in range(_NVLINK_MAX_LINKS):
            state = opt(nv.nvmlDeviceGetNvLinkState, handle, link)
            if state is None:
                continue
            active = state == nv.NVML_FEATURE_ENABLED
            remote = None
            if active:
                info = opt(nv.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
                if info is not None:
                    remote = normalize_bus_id(_text(info.busId))
                version = version or opt(nv.nvmlDeviceGetNvLinkVersion, handle, link)
                if speed_mbps is None:
                    speed_mbps = _field_uint(nv, opt, handle, FI_NVLINK_GET_SPEED, link)
            links.append(NvLink(link=link, active=active, remote_bus_id=remote))
        speed, _ = nvlink_link_bytes_per_second(int(version) if version else None, speed_mbps)
        return tuple(links), speed

    @staticmethod
    def _mig(nv: Any, opt: Callable[..., Any], handle: Any) -> tuple[MigInstance, ...]:
        out = []
        for i in range(opt(nv.nvmlDeviceGetMaxMigDeviceCount, handle) or 0):
            mig = opt(nv.nvmlDeviceGetMigDeviceHandleByIndex, handle, i)
            if mig is None:
                continue
            uuid = opt(nv.nvmlDeviceGetUUID, mig)
            if uuid is None:
                continue
            out.append(MigInstance(uuid=_text(uuid),
                                   gpu_instance=opt(nv.nvmlDeviceGetGpuInstanceId, mig),
                                   compute_instance=opt(nv.nvmlDeviceGetComputeInstanceId, mig)))
        return tuple(out)


def _field_uint(nv: Any, opt: Callable[..., Any], handle: Any, field: int,
                link: int) -> int | None:
    """One unsigned NVML field value scoped to a link, None when unsupported or unreadable."""
    try:
        values = opt(nv.nvmlDeviceGetFieldValues, handle, [(field, link)])
    except (TypeError, ValueError, AttributeError):  # an nvidia-ml-py without scoped fields
        return None
    if not values:
        return None
    value = values[0]
    if getattr(value, "nvmlReturn", 1) != 0:
        return None
    with contextlib.suppress(AttributeError, TypeError, ValueError):
        return int(value.value.uiVal)
    return None


def _init_error(nv: Any, exc: Exception) -> str:
    code = getattr(exc, "value", None)
    if code == getattr(nv, "NVML_ERROR_LIBRARY_NOT_FOUND", object()):
        return ("NVML not available: libnvidia-ml.so.1 not found, no NVIDIA driver on this node "
                "(or the container lacks NVIDIA_DRIVER_CAPABILITIES=utility)")
    if code == getattr(nv, "NVML_ERROR_DRIVER_NOT_LOADED", object()):
        return "NVML not available: the NVIDIA kernel driver is not loaded (nvidia.ko)"
    if code == getattr(nv, "NVML_ERROR_NO_PERMISSION", object()):
        return "NVML not available: no permission to open /dev/nvidiactl"
    return f"NVML not available: {exc}"
