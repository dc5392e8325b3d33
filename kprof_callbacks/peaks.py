"""Datasheet peaks of the GPUs training runs on: dense FLOP/s, for model FLOPs utilization (MFU), and memory
bandwidth, for how close a memory-bound kernel gets to the spec.

Each FLOP/s number is the vendor datasheet's figure *without* sparsity: NVIDIA quotes Tensor Core rates "with
sparsity" (2:4 structured), twice what a dense training matmul can reach. Dividing by the sparse figure is how MFU
numbers ended up off by 2x. TF32 and lower are Tensor Core rates; fp32 is the non-Tensor-Core rate. Memory bandwidth
is the datasheet's TB/s (10^12 bytes/s), the figure published kernel benchmarks quote as "% of peak". Sources:
NVIDIA's A100, H100 (SXM, PCIe, NVL), H200, GH200, B200 (HGX, per GPU), L40S, L4 and A10 datasheets.
"""

from __future__ import annotations

DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")

_HOPPER = {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9}
_AMPERE = {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}

# (pattern found in torch.cuda.get_device_name(), dense TFLOP/s by dtype, memory TB/s); the longest matching
# pattern wins.
DEVICES: tuple[tuple[str, dict[str, float], float], ...] = (
    ("H100 PCIe", {"fp32": 51.2, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0, "fp8": 1513.0}, 2.0),
    ("H100 NVL", {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5}, 3.9),
    ("H100", _HOPPER, 3.35),  # SXM5 ("NVIDIA H100 80GB HBM3")
    ("H200", _HOPPER, 4.8),
    ("GH200", _HOPPER, 4.0),
    ("B200", {"fp32": 75.0, "tf32": 1100.0, "bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0}, 8.0),
    ("A100-SXM4-80GB", _AMPERE, 2.039),
    ("A100 80GB PCIe", _AMPERE, 1.935),
    ("A100", _AMPERE, 1.555),  # 40GB
    ("L40S", {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05, "fp8": 733.0}, 0.864),
    ("L4", {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0, "fp8": 242.5}, 0.3),
    ("A10", {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0}, 0.6),
)


HIGHEST_TFLOPS = max(peak for _, table, _ in DEVICES for peak in table.values())
"""No device in the table computes faster than this, in any dtype: a rate above it is a wrong FLOP count."""


def _device(device_name: str) -> tuple[str, dict[str, float], float] | None:
    """The table's row for the GPU called ``device_name`` (as torch names it), or None.

    Longer patterns are tried first (``H100 PCIe`` before ``H100``, ``GH200`` before ``H200``, ``L40S`` before
    ``L4``), so a name matches its most specific row."""
    for row in sorted(DEVICES, key=lambda row: -len(row[0])):
        if row[0] in device_name:
            return row
    return None


def peak_tflops(device_name: str, dtype: str) -> float | None:
    """The dense peak of ``dtype`` on the GPU called ``device_name``, or None if not in the table."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    row = _device(device_name)
    return row[1].get(dtype) if row else None


def memory_tbps(device_name: str) -> float | None:
    """The datasheet memory bandwidth (TB/s) of the GPU called ``device_name``, or None if not in the table."""
    row = _device(device_name)
    return row[2] if row else None
