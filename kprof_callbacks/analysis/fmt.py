"""Human-readable numbers for tables and diagnostics."""

from __future__ import annotations

from collections.abc import Iterable


def duration(us: float) -> str:
    """Microseconds as `812 us`, `12.3 ms` or `1.24 s`."""
    if abs(us) >= 1e6:
        return f"{us / 1e6:.2f} s"
    if abs(us) >= 1e3:
        return f"{us / 1e3:.1f} ms" if abs(us) >= 1e4 else f"{us / 1e3:.2f} ms"
    return f"{us:.1f} us" if abs(us) < 100 else f"{us:.0f} us"


def size(nbytes: float) -> str:
    """Bytes as `512 B`, `3.1 KB`, `1.2 GB` (binary multiples, sign kept)."""
    value, unit = abs(nbytes), "B"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1024 or unit == "TB":
            break
        value /= 1024
    sign = "-" if nbytes < 0 else ""
    return f"{sign}{value:.0f} {unit}" if unit == "B" else f"{sign}{value:.1f} {unit}"


def share(fraction: float) -> str:
    """A fraction as a percentage."""
    return f"{100 * fraction:.0f}%" if fraction >= 0.1 else f"{100 * fraction:.1f}%"


def percent(fraction: float) -> str:
    """A level or a limit as a percentage, as every report prints one: 0.95 -> `95%`, 0.999 -> `99.9%` (never
    rounded up to `100%`), -0.0 -> `0%`."""
    value = 100 * fraction + 0.0
    text = f"{value:.3g}"
    for digits in range(4, 12):
        if float(text) != 100 or fraction >= 1:
            break
        text = f"{value:.{digits}g}"
    return f"{text}%"


def clip(text: str, width: int) -> str:
    """`text`, cut to `width` characters with `...` when longer."""
    return text if len(text) <= width else text[: width - 3] + "..."


def row_name(kind: str, name: str) -> str:
    """A per-step table row's name as shown: kernel names shortened (see kernel_name)."""
    return kernel_name(name) if kind in ("kernel", "nccl") else name


def row_label(kind: str, name: str, width: int = 60) -> str:
    """`aten::mm`, `label 'forward'`, `kernel 'sgemm_largek_lds64<...>'`: a row, clipped, with its kind."""
    shown = clip(row_name(kind, name), width)
    return shown if kind == "op" else f"{kind} '{shown}'"


def ranges(numbers: Iterable[int]) -> str:
    """Step numbers as ranges: [2, 3, 4, 7] -> `2-4,7`."""
    out: list[list[int]] = []
    for n in sorted(set(numbers)):
        if out and n == out[-1][1] + 1:
            out[-1][1] = n
        else:
            out.append([n, n])
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in out)


def kernel_name(name: str) -> str:
    """A demangled kernel name, shorter: no `void`, no parameter list, no `at::native::`/anonymous namespaces.

    `void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(...)...>(int, ...)` becomes
    `vectorized_elementwise_kernel<4, GeluCUDAKernelImpl(...)...>`, so clipping keeps the part that tells
    kernels apart.
    """
    text = name.removeprefix("void ").replace("at::native::", "").replace("(anonymous namespace)::", "")
    depth = 0
    for i, ch in enumerate(text):
        depth += (ch == "<") - (ch == ">")
        if ch == "(" and depth == 0 and i > 0:
            return text[:i]
    return text
