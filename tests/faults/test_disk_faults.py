"""Faults 1-2: the disk fills up, the logdir disappears or turns read-only while training runs."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from conftest import fill_disk, leftovers

import kprof_callbacks as kprof


@pytest.mark.parametrize(
    "gzip, free", [(False, 0), (False, 24 * 1024), (True, 24 * 1024)], ids=["json-full", "json-fills", "gzip-fills"]
)
def test_full_disk_drops_captures_with_one_warning_and_recovers(tmpfs, train, told, check_traces, gzip, free):
    """A real tmpfs that is full or fills mid-write: captures dropped with one warning, no temp file left, writing resumes once space is freed."""
    disk = tmpfs("2m")
    with told() as messages:
        with kprof.session(disk, run="r", wait=10, warmup=1, active=2, repeat=0, gzip=gzip) as s:
            filler = fill_disk(disk, leave=free)
            train(s, 52)  # 4 windows on a full disk; step-time scalars are written at step 50
            s.flush()
            failed = [c for c in s.captures if c.error]
            filler.unlink()
            train(s, 13)  # 1 more window, with space again
    assert s.steps == 65
    assert len(failed) == 4 and len(s.trace_files) == 1
    assert check_traces(disk) == sorted(s.trace_files)
    assert leftovers(disk) == []
    assert len(messages) == 1 and "No space left on device" in messages[0], messages
