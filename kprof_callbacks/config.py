"""Profiling options shared by every front door (session, Lightning callback, CLI), validated up front.

The keywords and defaults mirror ``torch.profiler.schedule`` and ``torch.profiler.profile``; every check runs
when the object is built, so a typo or a bad number fails before the first training step.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
import os
import signal
import warnings
from collections.abc import Iterable

import torch
from torch.profiler import ProfilerActivity

from . import layout, peaks, torch_compat

SCHEDULE_FIELDS = ("skip_first", "wait", "warmup", "active", "repeat")
PEAK_TFLOPS = (1e-3, 1e5)  # a plausible dense peak of one device, TFLOP/s: a CPU core's to 20x the fastest GPU's
TRIGGERS = ("schedule", "on_demand", "slow_step")
# Environment overrides, e.g. ``KPROF_ACTIVE=5`` or ``KPROF_TRIGGER=on_demand``; ``KPROF=0`` disables profiling. A
# variable set to nothing (``KPROF=``) counts as unset.
_ENV_INTS = {name: f"KPROF_{name.upper()}" for name in SCHEDULE_FIELDS}
_TRACE_ONLY = torch_compat.trace_only_config()


@dataclasses.dataclass(frozen=True)
class ProfileConfig:
    """What to record and when. Numbers follow ``torch.profiler.schedule``; each option: docs/options.md."""

    logdir: str | os.PathLike = "log"
    run: str | None = None
    skip_first: int = 0
    wait: int = 1
    warmup: int = 1
    active: int = 3
    repeat: int = 1
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    activities: tuple[ProfilerActivity, ...] | None = None
    enabled: bool = True
    gzip: bool = False
    scalars: bool = True
    trigger: str = "schedule"
    slow_factor: float = 3.0
    slow_min_steps: int = 20
    cooldown: int = 50
    poll_every: int = 10
    signal: int | None = None
    max_captures: int | None = None
    max_trace_mb: float | None = None
    max_pending_mb: float = 512.0
    nvtx: bool = False
    memory_snapshot: bool = False
    oom_report: bool = True
    oom_snapshot: bool = False
    memory_every: int = 5
    mfu_dtype: str = "bf16"
    peak_tflops: float | None = None
    write_timeout: float = 60.0

    def __post_init__(self) -> None:
        _check_types(self)
        for name in (
            "slow_factor",
            "max_trace_mb",
            "max_pending_mb",
            "write_timeout",
            "peak_tflops",
        ):  # nan passes every comparison below
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value}")
        for name in SCHEDULE_FIELDS:
            value = getattr(self, name)
            low = 1 if name == "active" else 0
            if value < low:
                raise ValueError(f"{name} must be >= {low}, got {value}")
        if self.trigger not in TRIGGERS:
            raise ValueError(f"trigger must be one of {TRIGGERS}, got {self.trigger!r}")
        if self.slow_factor <= 1.0:
            raise ValueError(f"slow_factor must be > 1.0, got {self.slow_factor}")
        for name in ("slow_min_steps", "poll_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.cooldown < 0:
            raise ValueError(f"cooldown must be >= 0, got {self.cooldown}")
        if self.max_captures is not None and self.max_captures < 1:
            raise ValueError(f"max_captures must be >= 1 or None, got {self.max_captures}")
        if self.max_trace_mb is not None and self.max_trace_mb <= 0:
            raise ValueError(f"max_trace_mb must be > 0 or None, got {self.max_trace_mb}")
        if self.memory_every < 0:
            raise ValueError(f"memory_every must be >= 0 (0: no memory scalars), got {self.memory_every}")
        if self.mfu_dtype not in peaks.DTYPES:
            raise ValueError(f"mfu_dtype must be one of {peaks.DTYPES}, got {self.mfu_dtype!r}")
        if self.peak_tflops is not None and not PEAK_TFLOPS[0] <= self.peak_tflops <= PEAK_TFLOPS[1]:
            raise ValueError(
                f"peak_tflops is one device's dense peak in TFLOP/s (an H100's in bf16: 989), between "
                f"{PEAK_TFLOPS[0]:g} and {PEAK_TFLOPS[1]:g}, or None; got {self.peak_tflops}"
            )
        if self.max_pending_mb <= 0:
            raise ValueError(f"max_pending_mb must be > 0, got {self.max_pending_mb}")
        if self.write_timeout <= 0:
            raise ValueError(f"write_timeout must be > 0, got {self.write_timeout}")
        if self.signal is not None:
            try:
                signal.Signals(self.signal)
            except ValueError:
                raise ValueError(f"signal must be a valid signal number, got {self.signal}") from None
            if self.signal in (signal.SIGKILL, signal.SIGSTOP):
                raise ValueError(f"signal must be one a program can catch, got {signal.Signals(self.signal).name}")
        if self.run is not None:
            layout.check_name("run", self.run)
        if self.activities is not None:
            object.__setattr__(self, "activities", check_activities(self.activities))
        for name in ("memory_snapshot", "oom_snapshot"):
            if getattr(self, name) and not torch.cuda.is_available():
                warnings.warn(
                    f"kprof: {name}=True needs a CUDA device; no snapshot will be saved", RuntimeWarning, stacklevel=4
                )

    @classmethod
    def from_kwargs(cls, **kwargs) -> ProfileConfig:
        """Build from user keywords, letting ``KPROF``/``KPROF_<NAME>`` environment variables win."""
        cls._check_names(kwargs)
        _warn_unknown_variables()
        for name, var in _ENV_INTS.items():
            if _env(var) is not None:
                kwargs[name] = _env_int(var, low=1 if name == "active" else 0)
        trigger = _env("KPROF_TRIGGER")
        if trigger is not None:
            if trigger not in TRIGGERS:
                raise ValueError(f"environment variable KPROF_TRIGGER must be one of {TRIGGERS}, got {trigger!r}")
            kwargs["trigger"] = trigger
        return cls.own_schedule(**kwargs)

    @classmethod
    def own_schedule(cls, **kwargs) -> ProfileConfig:
        """Build from the keywords given, the schedule included; of the environment only ``KPROF=0`` counts (it still
        turns profiling off). For a caller whose schedule is its own: ``compare`` profiles a few steps per variant."""
        cls._check_names(kwargs)
        if not _env_switch("KPROF"):
            kwargs["enabled"] = False
        return cls(**kwargs)

    @classmethod
    def _check_names(cls, kwargs: dict) -> None:
        unknown = set(kwargs) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise TypeError(f"unknown profiling option(s): {', '.join(sorted(unknown))}")

    def resolved_activities(self) -> list[ProfilerActivity]:
        """Activities to record: the user's, else CPU plus CUDA when a CUDA device is usable."""
        if self.activities is not None:
            return list(self.activities)
        acts = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            acts.append(ProfilerActivity.CUDA)
        return acts

    def profiler_kwargs(self) -> dict:
        """The keywords passed straight to ``torch.profiler.profile``."""
        kwargs = dict(
            record_shapes=self.record_shapes,
            profile_memory=self.profile_memory,
            with_stack=self.with_stack,
            with_flops=self.with_flops,
            with_modules=self.with_modules,
        )
        # torch turns trace_only off itself for with_stack (stacks need the Python event objects); the module
        # hierarchy of with_modules comes from the same pass
        if not (self.with_stack or self.with_modules) and _TRACE_ONLY is not None:
            kwargs["experimental_config"] = _TRACE_ONLY
        return kwargs


def _env(var: str) -> str | None:
    """``$var``, None when unset or set to nothing but spaces."""
    raw = os.environ.get(var, "")
    return raw if raw.strip() else None


def _env_int(var: str, low: int) -> int:
    raw = os.environ[var]
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or value < low:
        raise ValueError(f"environment variable {var} must be an integer >= {low}, got {raw!r}")
    return value


_OTHER_VARIABLES = ("KPROF", "KPROF_TRIGGER", "KPROF_TORCH", "KPROF_VERBOSE_BUILD")  # the set-up's and builds' too
_WARNED: set[str] = set()


def _warn_unknown_variables() -> None:
    """One warning per ``KPROF_*`` variable of the environment that kprof does not read (a typo is otherwise a
    setting silently ignored), naming the closest known one."""
    known = (*_ENV_INTS.values(), *_OTHER_VARIABLES)
    for var in sorted(v for v in os.environ if v.startswith("KPROF_") and v not in known and v not in _WARNED):
        _WARNED.add(var)
        close = difflib.get_close_matches(var, known, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        warnings.warn(
            f"kprof: the environment variable {var} is not one kprof reads{hint}; it is ignored",
            RuntimeWarning,
            stacklevel=4,
        )


_SWITCH = {"1": True, "true": True, "on": True, "yes": True, "0": False, "false": False, "off": False, "no": False}


def _env_switch(var: str) -> bool:
    """``$var`` read as on/off (unset or empty: on); anything else is a ValueError naming the variable."""
    raw = _env(var) or "1"
    try:
        return _SWITCH[raw.strip().lower()]
    except KeyError:
        raise ValueError(f"environment variable {var} must be 1/true/on/yes or 0/false/off/no, got {raw!r}") from None


_KINDS = {"int": (numbers.Integral,), "float": (numbers.Real,), "bool": (bool,), "str": (str,)}


def _check_types(cfg: ProfileConfig) -> None:
    """Reject wrong types by name; a bool is not accepted where a number is meant."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        optional = f.type.endswith(" | None")
        kinds = _KINDS.get(f.type.removesuffix(" | None"))
        if kinds is None or (value is None and optional):
            continue
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise TypeError(f"{f.name} must be {f.type}, got {type(value).__name__} {value!r}")
        if type(value) not in (int, float, bool, str):  # numpy's numbers: kept as Python's
            object.__setattr__(cfg, f.name, int(value) if f.type.startswith("int") else float(value))
    if not isinstance(cfg.logdir, (str, os.PathLike)):
        raise TypeError(f"logdir must be a str or path, got {type(cfg.logdir).__name__}")


def check_activities(activities: Iterable) -> tuple[ProfilerActivity, ...]:
    if isinstance(activities, (str, bytes)) or not isinstance(activities, Iterable):
        raise TypeError(f"activities must be a list of torch.profiler.ProfilerActivity, got {activities!r}")
    acts = tuple(activities)
    bad = [a for a in acts if not isinstance(a, ProfilerActivity)]
    if bad or not acts:
        raise ValueError(f"activities must be a non-empty list of torch.profiler.ProfilerActivity, got {acts!r}")
    return acts
