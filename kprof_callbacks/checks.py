"""Argument checks shared by the front doors, so that every bad value is named the same way before any work."""

from __future__ import annotations

import numbers


def check_int(name: str, value: object, low: int) -> int:
    """``value`` if it is an int >= ``low`` (a bool is not an int here), else a ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return int(value)


def check_bool(name: str, value: object) -> bool:
    """``value`` if it is True or False, else a TypeError naming ``name``."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


class UsageError(ValueError):
    """A bad argument of a ``kprof`` subcommand, found once its work started: said in one line, exit status 2."""
