"""Human-readable numbers for tables and diagnostics.

The kprof tab formats the same numbers in JavaScript (``tensorboard/static/fmt.js``) with the same rules and the
same rounding, so a duration or a confidence level reads alike in the terminal, the HTML report and the tab.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from decimal import ROUND_HALF_UP, Decimal


def fixed(x: float, digits: int) -> str:
    """``x`` with ``digits`` decimals, rounded as JavaScript's ``toFixed`` rounds: the float's exact value, a tie
    away from zero (Python's format rounds a tie to even: 32.25 gives 32.2 here and 32.3 in the tab)."""
    if x == 0:
        x = 0.0  # no "-0.0"
    return str(Decimal(x).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP))


def duration(us: float) -> str:
    """Microseconds as `812 us`, `12.3 ms` or `1.24 s` (``fmt.js``'s ``duration`` writes the same)."""
    if abs(us) >= 1e6:
        return f"{fixed(us / 1e6, 2)} s"
    if abs(us) >= 1e3:
        return f"{fixed(us / 1e3, 1)} ms" if abs(us) >= 1e4 else f"{fixed(us / 1e3, 2)} ms"
    return f"{fixed(us, 1)} us" if abs(us) < 100 else f"{fixed(us, 0)} us"


def level(confidence: float) -> str:
    """A confidence level as a percentage with the decimals it needs to show its miss rate to two significant
    digits: `95%`, `99.89%`, `99.9975%`; never `100%` (``fmt.js``'s ``level`` writes the same)."""
    miss = 100.0 * (1.0 - confidence)
    if not 0.0 < miss < 100.0:
        raise ValueError(f"a confidence level is between 0 and 1, got {confidence!r}")
    digits = max(0, 1 - math.floor(math.log10(miss)))
    text = fixed(100.0 - miss, digits)
    return (text.rstrip("0").rstrip(".") if "." in text else text) + "%"


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


def limit(pct: float) -> str:
    """A gate's limit, given in percent, as every report prints it: 5 -> `+5%`, -0.0 -> `+0%`."""
    return f"+{pct + 0.0:g}%"


def clip(text: str, width: int) -> str:
    """`text`, cut to `width` characters with `...` when longer."""
    return text if len(text) <= width else text[: width - 3] + "..."


def row_name(kind: str, name: str) -> str:
    """A per-step table row's name as shown: kernel names shortened (see kernel_name)."""
    return kernel_name(name) if kind in ("kernel", "nccl") else name


def row_label(kind: str, name: str, width: int = 60) -> str:
    """`aten::mm`, `label 'forward'`, `kernel 'sgemm_largek_lds64<...>'`: a row, clipped, with its kind (operators
    and the step's own rows, `GPU idle`, go by their names)."""
    shown = clip(row_name(kind, name), width)
    return shown if kind in ("op", "step") else f"{kind} '{shown}'"


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
