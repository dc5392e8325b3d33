"""Faults 1-2: the disk fills up, the logdir disappears or turns read-only while training runs."""

from __future__ import annotations

import os
import shutil

import pytest

import kprof_callbacks as kprof

from faultkit import fill_disk, leftovers


def _drain(s: kprof.Session) -> None:
    """Wait for the writer after every step, so writes fail only for the disk's reason (never dropped as busy)."""
    s.flush()


@pytest.mark.parametrize(
    "gzip, free", [(False, 0), (False, 24 * 1024), (True, 24 * 1024)], ids=["json-full", "json-fills", "gzip-fills"]
)
def test_full_disk_drops_captures_with_one_warning_and_recovers(tmpfs, train, told, check_traces, capfd, gzip, free):
    """A real tmpfs, full or filling mid-write: one warning, no temp file left, writing resumes once space is freed."""
    disk = tmpfs("2m")
    with told() as messages:
        with kprof.session(disk, run="r", wait=10, warmup=1, active=2, repeat=0, gzip=gzip) as s:
            filler = fill_disk(disk, leave=free)
            train(s, 52, after_step=_drain)  # 4 windows on a full disk; step-time scalars are written at step 50
            s.flush()
            failed = [c for c in s.captures if c.error]
            filler.unlink()
            train(s, 13, after_step=_drain)  # 1 more window, with space again
    assert s.steps == 65
    assert len(failed) == 4 and len(s.trace_files) == 1
    assert check_traces(disk) == sorted(s.trace_files)
    assert leftovers(disk) == []
    assert len(messages) == 1 and "No space left on device" in messages[0], messages
    assert "Failed to write" not in capfd.readouterr().err  # torch's exporter logs each failure on stderr


def test_run_folder_removed_mid_run_drops_captures_with_one_warning(tmp_path, train, told, check_traces):
    """The run folder is deleted (rm -rf) mid-run: later captures dropped with one warning saying so, training ends."""
    with told() as messages:
        with kprof.session(tmp_path, run="r", wait=1, warmup=1, active=2, repeat=0) as s:
            train(s, 8, after_step=_drain)
            s.flush()
            shutil.rmtree(s.run_dir)
            train(s, 52, after_step=_drain)
    assert s.steps == 60
    assert [c.error is None for c in s.captures] == [True] * 2 + [False] * 13
    assert check_traces(tmp_path) == [] and not s.run_dir.exists()
    assert len(messages) == 1 and f"{s.run_dir} no longer exists" in messages[0], messages


def test_run_folder_turned_read_only_mid_run_keeps_earlier_traces(tmp_path, train, told, check_traces, read_only):
    """The run folder turns read-only mid-run: one warning naming the cause, training ends, earlier traces intact."""
    with told() as messages:
        with kprof.session(tmp_path, run="r", wait=1, warmup=1, active=2, repeat=0) as s:
            train(s, 8, after_step=_drain)
            s.flush()
            written = list(s.trace_files)
            read_only(s.run_dir)
            train(s, 52, after_step=_drain)
    assert s.steps == 60 and len(s.captures) == 15
    assert s.trace_files == written and check_traces(tmp_path) == sorted(written)
    assert leftovers(tmp_path) == []
    cause = "read-only file system" if os.geteuid() == 0 else "no permission to write"
    assert len(messages) == 1 and cause in messages[0], messages


def test_lightning_fit_on_a_full_disk_finishes_with_one_warning(tmpfs, fit, told, check_traces, capsys):
    """Trainer.fit with ProfilerCallback on a full disk: fit ends, one warning, a note instead of a summary."""
    disk = tmpfs("2m")
    # two windows: never more than the writer queues (max_pending=2), so none is dropped as "busy"
    callback = kprof.ProfilerCallback(logdir=disk, run="r", wait=1, warmup=1, active=2, repeat=2)
    with told() as messages:
        trainer = fit([callback], steps=16, at_start=lambda: fill_disk(disk, leave=0))
    assert trainer.global_step == 16
    assert check_traces(disk) == [] and leftovers(disk) == []
    assert len(messages) == 1 and "No space left on device" in messages[0], messages
    assert "kprof: no train traces in" in capsys.readouterr().out


def test_a_session_started_on_a_full_disk_trains_without_profiling(tmpfs, train, told):
    """The disk is full before the session starts: one warning, and training runs unprofiled (the claim of the run
    folder raised out of kprof.session and training never started); once there is room, the next session takes
    the run's own name."""
    disk = tmpfs("2m")
    filler = fill_disk(disk, leave=0)
    with told() as messages:
        with kprof.session(disk, run="r", wait=0, warmup=1, active=1) as s:
            train(s, 4)
    assert s.steps == 4 and s.trace_files == [] and s.run_dir is None
    assert messages == [
        f"kprof: {disk}: No space left on device when the session started; training continues without profiling"
    ]
    assert "the disk was full when the session started" in s.summary().render()
    filler.unlink()
    with kprof.session(disk, run="r", wait=0, warmup=1, active=1) as s:
        train(s, 2)
    assert s.run_dir == disk / "r" and len(s.trace_files) == 1
