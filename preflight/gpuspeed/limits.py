"""The hardware limit of each per-GPU figure, from NVML's facts or a table per model (pure).

- Host<->device copies: PCIe generation x width at the link's maximum (NVML
  ``nvmlDeviceGetMaxPcieLinkGeneration`` / ``...Width``, the lower of the GPU's and the slot's),
  times the usable rate of one lane after line coding: Gen1 0.25, Gen2 0.5, Gen3 0.985, Gen4 1.969,
  Gen5 3.938, Gen6 7.877 GB/s per direction (PCI-SIG; 128b/130b from Gen3, FLIT from Gen6).
  Gen5 x16 = 63 GB/s.
- Device copy: memory bus width (bits) / 8 x the maximum memory clock (MHz) x 2 (double data
  rate), counting read + write as the figure does. NVML ``nvmlDeviceGetMemoryBusWidth`` and
  ``nvmlDeviceGetMaxClockInfo(NVML_CLOCK_MEM)``; the worker also reads CUDA's own
  ``CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH``.
- Matrix multiply: SM count (from CUDA) x maximum SM clock (NVML) x dense FLOP per SM per clock
  of the architecture for the data type measured (bf16, else fp16, tensor cores, fp32
  accumulate). NVIDIA's product briefs give the rates at their boost clock; NVML's maximum SM
  clock is often higher (H100/H200 SXM: 1,980 MHz against the brief's 1,830), so this limit sits
  above the datasheet's (1,070 against 989 TFLOP/s on an H200) and fractions read lower.

Where NVML lacks a fact, :data:`MODEL_TABLE` (per GPU model, datasheet figures) gives the limit;
where neither does, the figure is printed without a fraction and only compared across GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

#: Usable GB/s per lane per direction by PCIe generation (after 8b/10b, 128b/130b, FLIT coding).
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.877}

#: Dense tensor-core FLOP per SM per clock, bf16 (fp16 where no bf16) with fp32 accumulate, by
#: compute capability. 8.0 A100 (108 SM x 1,410 MHz x 2,048 = 312 TFLOP/s); 8.6 GA10x data-centre
#: parts (A10, A40: half rate with fp32 accumulate = 512); 8.9 Ada (L4, L40S: 1,024); 9.0
#: H100/H200 (132 SM x 1,830 MHz x 4,096 = 989 TFLOP/s); 10.0 B200 (8,192). Only 9.0 was measured
#: here (docs/benchmarks.md); the others are from the product briefs.
TENSOR_FLOP_PER_SM_PER_CLOCK = {(7, 0): 1024, (8, 0): 2048, (8, 6): 512, (8, 7): 1024,
                                (8, 9): 1024, (9, 0): 4096, (10, 0): 8192}


@dataclass(frozen=True)
class ModelLimits:
    """Datasheet limits of one GPU model (per direction for PCIe; read + write for memory)."""

    memory_gbps: float
    pcie_gbps: float
    matmul_tflops: float


#: By a substring of NVML's name; the first match wins (more specific names first). Datasheets:
#: H200 SXM 4.8 TB/s HBM3e, 989 dense bf16; H100 SXM 3.35 TB/s, 989; H100 PCIe 2.0 TB/s, 756;
#: A100 SXM 80GB 2.04 TB/s (40GB 1.56), 312; L40S 864 GB/s, 362; L4 300 GB/s, 121; B200 8 TB/s,
#: 2,250. PCIe x16 of the model's generation.
MODEL_TABLE: tuple[tuple[str, ModelLimits], ...] = (
    ("H200", ModelLimits(4800.0, 63.0, 989.0)),
    ("H100 PCIe", ModelLimits(2000.0, 63.0, 756.0)),
    ("H100", ModelLimits(3350.0, 63.0, 989.0)),
    ("A100-SXM4-80GB", ModelLimits(2039.0, 31.5, 312.0)),
    ("A100", ModelLimits(1555.0, 31.5, 312.0)),
    ("L40S", ModelLimits(864.0, 31.5, 362.0)),
    ("L4", ModelLimits(300.0, 31.5, 121.0)),
    ("B200", ModelLimits(8000.0, 63.0, 2250.0)),
)

KINDS = ("d2d", "h2d", "d2h", "gemm")
UNITS = {"d2d": "GB/s", "h2d": "GB/s", "d2h": "GB/s", "gemm": "TFLOP/s"}
WORDS = {"d2d": "device copy", "h2d": "host-to-device", "d2h": "device-to-host",
         "gemm": "matrix multiply"}


@dataclass(frozen=True)
class Limit:
    """One figure's limit and where it came from (shown next to the fraction)."""

    value: float
    source: str


def model_limits(name: str) -> ModelLimits | None:
    for key, limits in MODEL_TABLE:
        if key.lower() in name.lower():
            return limits
    return None


def pcie_limit(gen: int | None, width: int | None) -> Limit | None:
    if not gen or not width or gen not in PCIE_LANE_GBPS:
        return None
    return Limit(PCIE_LANE_GBPS[gen] * width, f"PCIe Gen{gen} x{width}")


def memory_limit(bus_width_bits: int | None, max_mem_clock_mhz: int | None) -> Limit | None:
    if not bus_width_bits or not max_mem_clock_mhz:
        return None
    gbps = bus_width_bits / 8 * max_mem_clock_mhz * 1e6 * 2 / 1e9
    return Limit(gbps, f"{bus_width_bits}-bit bus x {max_mem_clock_mhz} MHz x 2")


def matmul_limit(sm_count: int | None, max_sm_clock_mhz: int | None,
                 capability: tuple[int, int] | None) -> Limit | None:
    rate = TENSOR_FLOP_PER_SM_PER_CLOCK.get(capability) if capability else None
    if not sm_count or not max_sm_clock_mhz or not rate or capability is None:
        return None
    tflops = sm_count * max_sm_clock_mhz * 1e6 * rate / 1e12
    return Limit(tflops, f"{sm_count} SM x {max_sm_clock_mhz} MHz x {rate} FLOP/clk "
                         f"(sm_{capability[0]}{capability[1]})")


def limits_for(*, name: str, pcie_gen: int | None, pcie_width: int | None,
               bus_width_bits: int | None, max_mem_clock_mhz: int | None,
               sm_count: int | None, max_sm_clock_mhz: int | None,
               capability: tuple[int, int] | None) -> Mapping[str, Limit]:
    """Each kind's limit: NVML-derived where the facts are there, else the model table."""
    table = model_limits(name)
    pcie = pcie_limit(pcie_gen, pcie_width) or (
        Limit(table.pcie_gbps, f"table: {name}") if table else None)
    memory = memory_limit(bus_width_bits, max_mem_clock_mhz) or (
        Limit(table.memory_gbps, f"table: {name}") if table else None)
    matmul = matmul_limit(sm_count, max_sm_clock_mhz, capability) or (
        Limit(table.matmul_tflops, f"table: {name}") if table else None)
    out = {"d2d": memory, "h2d": pcie, "d2h": pcie, "gemm": matmul}
    return {k: v for k, v in out.items() if v is not None}
