"""What the machine did while training ran: CPU contention and, on NVIDIA GPUs, clocks and throttling, per step.

A step that got slower may be the code or the machine. ``MachineProbe`` samples, every ``MACHINE_EVERY`` steps and
inside kprof's own time, what tells the two apart: the process's CPU time against wall time, how long the training
thread waited for a CPU (``/proc/thread-self/schedstat``), the load average and the runnable tasks
(``/proc/loadavg``), context switches (``getrusage``); on a GPU, through NVML when ``libnvidia-ml.so.1`` loads
(ctypes, no dependency; without it there is simply no GPU evidence): the SM clock against its maximum, the clock
throttle reasons, the temperature and the other processes on the GPU. The values go out with the step scalars
(``layout.MACHINE_TAGS``); ``analysis/machine.py`` reads them back.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import time
from collections import OrderedDict

from . import layout

MACHINE_EVERY = 10  # steps between samples: a sample costs ~10-50 us (benchmarks/after_window.py)
_KEEP = 1024  # samples held until the scalar writer takes them
THROTTLES = {  # NVML clock throttle (event) reasons that slow a GPU down, and their names
    0x4: "power cap",
    0x8: "hardware slowdown",
    0x20: "thermal slowdown (software)",
    0x40: "thermal slowdown (hardware)",
    0x80: "power brake",
}
_SM_CLOCK, _GPU_TEMPERATURE, _INSUFFICIENT_SIZE = 1, 0, 7  # NVML_CLOCK_SM, NVML_TEMPERATURE_GPU, an NVML return


class _Nvml:
    """The few NVML calls the probe makes, on one device; ``None`` from ``open`` where NVML is not there."""

    def __init__(self, lib: ctypes.CDLL, handle: ctypes.c_void_p) -> None:
        self.lib, self.handle = lib, handle
        self.reasons = getattr(lib, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            lib, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )

    @classmethod
    def open(cls, pci_bus_id: str) -> _Nvml | None:
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            if lib.nvmlInit_v2() != 0:
                return None
            handle = ctypes.c_void_p()
            found = lib.nvmlDeviceGetHandleByPciBusId_v2(pci_bus_id.encode(), ctypes.byref(handle))
        except (OSError, AttributeError):
            return None
        return cls(lib, handle) if found == 0 else None

    def _uint(self, fn: str, *args) -> float | None:
        value = ctypes.c_uint()
        return float(value.value) if getattr(self.lib, fn)(self.handle, *args, ctypes.byref(value)) == 0 else None

    def sample(self) -> dict[str, float]:
        """GPU tags (``layout.MACHINE_TAGS``) now; a call that fails leaves its tag out."""
        out = {
            "sm_clock": self._uint("nvmlDeviceGetClockInfo", ctypes.c_uint(_SM_CLOCK)),
            "max_sm_clock": self._uint("nvmlDeviceGetMaxClockInfo", ctypes.c_uint(_SM_CLOCK)),
            "temperature": self._uint("nvmlDeviceGetTemperature", ctypes.c_uint(_GPU_TEMPERATURE)),
        }
        reasons = ctypes.c_ulonglong()
        if self.reasons is not None and self.reasons(self.handle, ctypes.byref(reasons)) == 0:
            out["throttle"] = float(reasons.value & sum(THROTTLES))
        count, processes = ctypes.c_uint(0), getattr(self.lib, "nvmlDeviceGetComputeRunningProcesses_v3", None)
        # a count-only call (the process list's layout differs between drivers); this process is one of them
        if processes is not None and processes(self.handle, ctypes.byref(count), None) in (0, _INSUFFICIENT_SIZE):
            out["other_processes"] = float(max(count.value - 1, 0))
        return {layout.MACHINE_TAGS[k]: v for k, v in out.items() if v is not None}


def pci_bus_id(properties: object) -> str | None:
    """NVML's name of the GPU torch calls ``properties`` (``torch.cuda.get_device_properties``), or None where torch
    does not say: CUDA's device numbers differ from NVML's under ``CUDA_VISIBLE_DEVICES``, a PCI bus id does not."""
    parts = [getattr(properties, f"pci_{k}_id", None) for k in ("domain", "bus", "device")]
    return None if None in parts else f"{parts[0]:08x}:{parts[1]:02x}:{parts[2]:02x}.0"


class MachineProbe:
    """Samples the machine every ``every`` steps (on the training thread, which it was created on); ``metrics(step)``
    hands a sampled step's values to the scalar rows once."""

    def __init__(self, every: int = MACHINE_EVERY, pci_bus_id: str | None = None) -> None:
        self.every = every
        self._held: OrderedDict[int, dict[str, float]] = OrderedDict()
        self._files = {}
        for name, path in (("schedstat", "/proc/thread-self/schedstat"), ("loadavg", "/proc/loadavg")):
            with contextlib.suppress(OSError):
                self._files[name] = os.open(path, os.O_RDONLY)
        self._nvml = _Nvml.open(pci_bus_id) if pci_bus_id else None
        self._cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        self._last: tuple[int, float, tuple[float, ...]] | None = None  # step, wall, counters

    def _counters(self) -> tuple[float, ...]:
        """Process CPU seconds, the thread's run-queue wait (ns; NaN without schedstat), context switches."""
        use = resource.getrusage(resource.RUSAGE_SELF)
        wait = float("nan")
        if "schedstat" in self._files:
            wait = float(os.pread(self._files["schedstat"], 128, 0).split()[1])
        return use.ru_utime + use.ru_stime, wait, float(use.ru_nvcsw), float(use.ru_nivcsw)

    def on_step(self, step: int) -> None:
        """Sample at steps 0, ``every``, 2 ``every``, ...: rates over the steps since the previous sample. A source
        that fails (a /proc file gone, a driver call that errs) is dropped for the rest of the run; training never
        sees the error."""
        if step % self.every:
            return
        try:
            self._sample(step)
        except (OSError, ValueError, IndexError, AttributeError):
            self.close()
            self._nvml = None

    def _sample(self, step: int) -> None:
        now, counters = time.perf_counter(), self._counters()
        out: dict[str, float] = {}
        if self._last is not None:
            steps, wall = step - self._last[0], now - self._last[1]
            cpu, wait, voluntary, involuntary = (a - b for a, b in zip(counters, self._last[2]))
            out[layout.MACHINE_TAGS["cpu_per_wall"]] = cpu / wall if wall > 0 else 0.0
            if wait == wait and wall > 0:  # schedstat there
                out[layout.MACHINE_TAGS["cpu_wait"]] = wait / 1e9 / wall
            out[layout.MACHINE_TAGS["voluntary_switches"]] = voluntary / steps
            out[layout.MACHINE_TAGS["involuntary_switches"]] = involuntary / steps
        else:
            out[layout.MACHINE_TAGS["cpus"]] = float(self._cpus)
        if "loadavg" in self._files:
            fields = os.pread(self._files["loadavg"], 128, 0).split()
            out[layout.MACHINE_TAGS["load1"]] = float(fields[0])
            out[layout.MACHINE_TAGS["runnable"]] = float(fields[3].split(b"/")[0])
        if self._nvml is not None:
            out.update(self._nvml.sample())
        self._last = (step, now, counters)
        self._held[step] = out
        while len(self._held) > _KEEP:
            self._held.popitem(last=False)

    def metrics(self, step: int) -> dict[str, float]:
        """The values sampled at ``step`` (empty for a step not sampled), handed out once."""
        return self._held.pop(step, {})

    def close(self) -> None:
        for fd in self._files.values():
            os.close(fd)
        self._files = {}
