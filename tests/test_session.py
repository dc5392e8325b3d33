"""kprof.session on a real (tiny) training loop: schedule, files, labels, timing, bad input, faults."""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import threading
import time

import pytest
import torch
from torch import nn

import kprof_callbacks as kprof
from kprof_callbacks import config as kprof_config
from kprof_callbacks.layout import PARTIAL


def _train(s, steps: int, region: str | None = "forward", sleep_at: dict[int, float] | None = None) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(steps):
        x = torch.randn(8, 16)
        with s.region(region) if region else _null():
            loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if sleep_at and i in sleep_at:
            time.sleep(sleep_at[i])
        s.step(samples=8)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _events(path):
    return json.loads(path.read_text())["traceEvents"]


def _profiler_steps(path) -> list[int]:
    return sorted(
        int(m.group(1)) for e in _events(path) if (m := re.fullmatch(r"ProfilerStep#(\d+)", e.get("name", "")))
    )


def test_schedule_writes_one_trace_per_cycle_with_absolute_step_numbers(tmp_path):
    with kprof.session(tmp_path, run="r", skip_first=1, wait=1, warmup=1, active=2, repeat=2) as s:
        _train(s, 12)
    files = s.trace_files
    assert len(files) == 2
    assert all(f.parent == tmp_path / "r" and f.name.endswith(".pt.trace.json") for f in files)
    # skip_first=1, wait=1, warmup=1 -> steps 3,4 recorded; next cycle wait 5, warmup 6 -> 7,8
    assert [_profiler_steps(f) for f in files] == [[3, 4], [7, 8]]
    assert [(c.first_step, c.last_step) for c in s.captures] == [(3, 4), (7, 8)]
    assert not list((tmp_path / "r").glob("*" + PARTIAL))


@pytest.mark.skipif(kprof_config._TRACE_ONLY is None, reason="this torch has no trace_only mode")
@pytest.mark.parametrize("needs_events", [None, "with_stack", "with_modules"])
def test_trace_only_mode_unless_an_option_needs_the_python_events(tmp_path, needs_events):
    """torch skips building Python event objects at a window's end (kprof reads the file, not them)."""
    options = {needs_events: True} if needs_events else {}
    with kprof.session(tmp_path, run="r", wait=0, warmup=1, active=2, repeat=1, **options) as s:
        _train(s, 4, region="my-forward")
        if needs_events:
            assert len(s._recorder.prof.events()) > 0
        else:
            with pytest.raises(RuntimeError, match="trace_only"):
                s._recorder.prof.events()
    assert "my-forward" in {e.get("name") for e in _events(s.trace_files[0])}
    assert kprof.summarize(s.trace_files[0]).steps


def test_region_labels_appear_in_trace(tmp_path):
    with kprof.session(tmp_path, run="r", wait=0, warmup=1, active=2) as s:
        _train(s, 4, region="my-forward")
    names = {e.get("name") for e in _events(s.trace_files[0])}
    assert "my-forward" in names


def test_region_is_free_outside_windows(tmp_path):
    with kprof.session(tmp_path, run="r", wait=5, warmup=1, active=1) as s:
        assert not s.recording
        assert isinstance(s.region("x"), type(_nullcontext()))


@pytest.mark.parametrize("trigger", ["schedule", "on_demand"])
def test_torch_opens_its_step_range_only_for_steps_a_window_may_record(tmp_path, monkeypatch, trigger):
    """Outside windows torch's ProfilerStep#N record_function is most of prof.step()'s cost: kprof skips it."""
    opened = []
    real = torch.autograd.profiler.record_function

    class Counting(real):
        def __enter__(self):
            if self.name.startswith("ProfilerStep#"):
                opened.append(int(self.name.split("#")[1]))
            return super().__enter__()

    monkeypatch.setattr(torch.autograd.profiler, "record_function", Counting)
    window = dict(wait=3, warmup=1, active=2, repeat=2) if trigger == "schedule" else dict(warmup=1, active=2)
    with kprof.session(tmp_path, run="r", trigger=trigger, **window) as s:
        _train(s, 6)
        if trigger == "on_demand":
            s.arm("test")  # 6 steps done (0-5): the window starts at step 7, warm-up 7, recorded 8 and 9
        _train(s, 8)
    # steps count from 0: wait 0-2, warm-up 3, recorded 4-5; again wait 6-8, warm-up 9, recorded 10-11
    expected = [3, 4, 5, 9, 10, 11] if trigger == "schedule" else [7, 8, 9]
    assert opened == expected
    assert [_profiler_steps(f) for f in s.trace_files] == [expected[i : i + 2] for i in range(1, len(expected), 3)]


def _nullcontext():
    import contextlib

    return contextlib.nullcontext()


def test_step_times_cover_every_step(tmp_path):
    with kprof.session(tmp_path, run="r", wait=1, warmup=1, active=1) as s:
        _train(s, 7, sleep_at={4: 0.3})  # far above a step's noise on a loaded 2-core machine
    times = s.step_times
    assert len(times) == 7
    # step 0 is the loop's first (lazy initialization of the model's ops) and steps 1-2 are the window, whose start
    # initializes the profiler (~1-2 s the first time in a process)
    assert times[4] > 0.3 and max(times[3], times[5], times[6]) < times[4]


def test_gzip_traces_are_valid(tmp_path):
    import gzip

    with kprof.session(tmp_path, run="r", wait=0, warmup=1, active=2, gzip=True) as s:
        _train(s, 4)
    (path,) = s.trace_files
    assert path.name.endswith(".pt.trace.json.gz")
    assert json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]


def test_scalars_written_for_every_step(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with kprof.session(tmp_path, run="r", wait=0, warmup=1, active=1) as s:
        _train(s, 9)
    acc = EventAccumulator(str(tmp_path / "r"))
    acc.Reload()
    steps = [e.step for e in acc.Scalars("kprof/step_time_ms")]
    assert steps == list(range(9))  # the same numbering as ProfilerStep#N
    assert len(acc.Scalars("kprof/throughput_samples_per_s")) == 9


def test_default_run_names_are_unique(tmp_path):
    runs = []
    for _ in range(2):
        with kprof.session(tmp_path, wait=0, warmup=0, active=1) as s:
            _train(s, 2)
        runs.append(s.run_dir)
    assert runs[0] != runs[1] and all(r.parent == tmp_path for r in runs)
    assert re.fullmatch(r"\d{8}-\d{6}(-\d+)?", runs[0].name)


def test_disabled_session_creates_no_profiler_and_no_files(tmp_path, monkeypatch):
    monkeypatch.setenv("KPROF", "0")
    with kprof.session(tmp_path / "log", run="r") as s:
        _train(s, 5)
    assert s.trace_files == [] and s.run_dir is None and not (tmp_path / "log").exists()
    assert s._recorder.prof is None


def test_env_overrides_schedule(tmp_path, monkeypatch):
    monkeypatch.setenv("KPROF_ACTIVE", "4")
    monkeypatch.setenv("KPROF_WAIT", "0")
    with kprof.session(tmp_path, run="r", wait=3, warmup=1, active=1) as s:
        _train(s, 6)
    assert _profiler_steps(s.trace_files[0]) == [1, 2, 3, 4]


@pytest.mark.parametrize(
    "kwargs, error, name",
    [
        (dict(active=0), ValueError, "active"),
        (dict(wait=-1), ValueError, "wait"),
        (dict(warmup=1.5), TypeError, "warmup"),
        (dict(repeat="2"), TypeError, "repeat"),
        (dict(record_shapes=1), TypeError, "record_shapes"),
        (dict(bogus=True), TypeError, "bogus"),
        (dict(activities=["cpu"]), ValueError, "activities"),
        (dict(run="../x"), ValueError, "run"),
        (dict(trigger="sometimes"), ValueError, "trigger"),
        (dict(slow_factor=1.0), ValueError, "slow_factor"),
        (dict(max_trace_mb=-1.0), ValueError, "max_trace_mb"),
        (dict(signal=12345), ValueError, "signal"),
    ],
)
def test_bad_options_fail_at_creation_naming_the_argument(tmp_path, kwargs, error, name):
    with pytest.raises(error, match=name):
        kprof.session(tmp_path, **kwargs)
    assert not any(tmp_path.iterdir())


def test_bad_env_override_names_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("KPROF_ACTIVE", "lots")
    with pytest.raises(ValueError, match="KPROF_ACTIVE"):
        kprof.session(tmp_path)


def test_a_variable_set_to_nothing_counts_as_unset(tmp_path, monkeypatch):
    """``KPROF= python train.py`` (or an empty KPROF_ACTIVE) profiles with the defaults; it was a ValueError."""
    for name in ("KPROF", "KPROF_ACTIVE", "KPROF_TRIGGER"):
        monkeypatch.setenv(name, "")
    s = kprof.session(tmp_path, run="r")
    assert s.config.enabled and s.config.active == 3 and s.config.trigger == "schedule"


def test_unwritable_logdir_fails_at_start(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(PermissionError, match=f"cannot write traces.*: {blocker} is a file, not a folder"):
        kprof.session(blocker / "log")


def test_a_run_path_that_is_a_file_is_named(tmp_path):
    """run= naming a regular file: the error says so (it said "File exists")."""
    (tmp_path / "r").write_text("notes")
    with pytest.raises(PermissionError, match=f"{tmp_path / 'r'} is a file, not a folder; pass another logdir or run="):
        kprof.session(tmp_path, run="r")


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write to read-only folders")
def test_read_only_logdir_fails_at_start(tmp_path):
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(PermissionError):
            kprof.session(tmp_path / "log")
    finally:
        tmp_path.chmod(0o700)


@pytest.mark.parametrize("exc_type", [RuntimeError, KeyboardInterrupt])
def test_exception_stops_profiler_keeps_traces_and_propagates(tmp_path, exc_type):
    with pytest.raises(exc_type, match="boom"):
        with kprof.session(tmp_path, run="r", wait=0, warmup=1, active=2, repeat=0) as s:
            _train(s, 5)  # one full window (steps 1-2) plus a window cut short by the exception
            raise exc_type("boom")
    assert not torch.autograd.profiler._is_profiler_enabled
    assert len(s.trace_files) >= 1
    for path in s.trace_files:
        assert _events(path)
    with kprof.session(tmp_path, run="again", wait=0, warmup=0, active=1) as s2:  # the process can profile again
        _train(s2, 2)
    assert s2.trace_files


def test_misuse_gives_clear_errors(tmp_path):
    s = kprof.session(tmp_path, run="a")
    with pytest.raises(RuntimeError, match="inside `with`"):
        s.step()
    with s:
        with pytest.raises(RuntimeError, match="another profiler"):
            with kprof.session(tmp_path, run="b"):
                pass
        _train(s, 2)
    with pytest.raises(RuntimeError, match="closed"):
        s.step()
    with pytest.raises(RuntimeError, match="only once"):
        with s:
            pass


def test_raw_torch_profiler_running_is_detected(tmp_path):
    with torch.profiler.profile():
        with pytest.raises(RuntimeError, match="another profiler"):
            with kprof.session(tmp_path, run="r"):
                pass


def test_write_failure_drops_capture_with_one_warning_and_training_continues(tmp_path, monkeypatch):
    import errno

    from torch.autograd import profiler as autograd_profiler

    def disk_full(self, path, *args, **kwargs):
        with open(path, "w") as f:
            f.write('{"traceEvents": [')  # a half-written file, as a full disk leaves it
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(autograd_profiler.profile, "export_chrome_trace", disk_full)
    with pytest.warns(RuntimeWarning, match="No space left") as record:
        with kprof.session(tmp_path, run="r", wait=0, warmup=0, active=1, repeat=3) as s:
            _train(s, 6)
    assert len([w for w in record if "No space" in str(w.message)]) == 1
    assert s.trace_files == [] and len(s.captures) == 3 and all(c.error for c in s.captures)
    assert list((tmp_path / "r").glob("*.json*")) == []


def test_user_on_trace_callback_error_does_not_stop_training(tmp_path):
    from kprof_callbacks.config import ProfileConfig
    from kprof_callbacks.session import Session

    seen = []

    def on_trace(path):
        seen.append(path)
        raise ValueError("user bug")

    cfg = ProfileConfig(logdir=tmp_path, run="r", wait=0, warmup=0, active=1, repeat=2)
    with pytest.warns(RuntimeWarning, match="user bug"):
        with Session(cfg, on_trace=on_trace) as s:
            _train(s, 4)
    assert seen == s.trace_files and len(seen) == 2


def test_max_captures_and_disk_budget_stop_captures(tmp_path):
    with kprof.session(tmp_path, run="a", wait=0, warmup=0, active=1, repeat=0, max_captures=2) as s:
        _train(s, 10)
    assert len(s.trace_files) == 2
    with kprof.session(tmp_path, run="b", wait=0, warmup=0, active=1, repeat=0, max_trace_mb=1e-3) as s:
        _train(s, 10)
        s.flush()
        _train(s, 5)
    assert 1 <= len(s.trace_files) < 10


def test_on_demand_file_triggers_exactly_one_capture(tmp_path):
    with kprof.session(tmp_path, run="r", trigger="on_demand", warmup=1, active=2, poll_every=1) as s:
        _train(s, 5)
        (s.run_dir / "PROFILE").touch()
        _train(s, 8)
    assert not (s.run_dir / "PROFILE").exists()
    assert len(s.trace_files) == 1
    assert len(_profiler_steps(s.trace_files[0])) == 2
    assert "PROFILE file" in s.captures[0].reason


def test_on_demand_signal_triggers_one_capture_and_chains_the_previous_handler(tmp_path):
    got = []
    previous = signal.signal(signal.SIGUSR1, lambda *a: got.append(a[0]))
    try:
        with kprof.session(tmp_path, run="r", trigger="on_demand", warmup=0, active=3) as s:
            _train(s, 3)
            os.kill(os.getpid(), signal.SIGUSR1)
            _train(s, 6)
        assert got == [signal.SIGUSR1]
        assert signal.getsignal(signal.SIGUSR1) is not s._recorder.trigger._on_signal  # restored
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert len(s.trace_files) == 1 and len(_profiler_steps(s.trace_files[0])) == 3
    assert "SIGUSR1" in s.captures[0].reason


def test_on_demand_off_main_thread_falls_back_to_file_with_warning(tmp_path):
    result = {}

    def body():
        with pytest.warns(RuntimeWarning, match="main thread"):
            with kprof.session(tmp_path, run="r", trigger="on_demand", warmup=0, active=1, poll_every=1) as s:
                (s.run_dir / "PROFILE").touch()
                _train(s, 3)
        result["files"] = s.trace_files

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert len(result["files"]) == 1


def test_slow_step_triggers_capture_and_records_the_slow_step(tmp_path):
    # a factor far above scheduling noise on a busy CI machine, steps of at least 5 ms (a 45 ms hiccup of a 0.5 ms
    # step fired the trigger under load), and a step far above that: 200x the median step this machine has shown
    with kprof.session(
        tmp_path, run="r", trigger="slow_step", slow_factor=50.0, slow_min_steps=10, warmup=0, active=2
    ) as s:
        _train(s, 20, sleep_at={i: 0.005 for i in range(20)})
        _train(s, 1, sleep_at={0: max(0.3, 200 * statistics.median(s.step_times))})
        _train(s, 9)
    assert len(s.trace_files) == 1
    assert s.captures[0].reason.startswith("slow step 21:")
    assert s.captures[0].first_step >= 21


def test_paused_code_is_left_out_of_the_trace(tmp_path):
    with kprof.session(tmp_path, run="r", wait=0, warmup=0, active=2) as s:
        for _ in range(2):
            with s.paused():
                torch.mm(torch.randn(32, 32), torch.randn(32, 32))
            torch.relu(torch.randn(32))
            s.step()
    names = {e.get("name") for e in _events(s.trace_files[0])}
    assert "aten::relu" in names and "aten::mm" not in names


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_nvtx_without_cuda_warns_and_emits_nothing(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda *a: calls.append(a))
    with pytest.warns(RuntimeWarning, match="nvtx=True needs a CUDA device"):
        s = kprof.session(tmp_path, run="r", nvtx=True)
    with s:
        _train(s, 3)
    assert calls == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_nvtx_ranges_on_cuda(tmp_path, monkeypatch):
    pushed = []
    real = torch.cuda.nvtx.range_push
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda msg: (pushed.append(msg), real(msg))[1])
    with kprof.session(tmp_path, run="r", nvtx=True, wait=0, warmup=0, active=1) as s:
        _train(s, 3)
    assert [m for m in pushed if m.startswith("step")] == ["step 0", "step 1", "step 2", "step 3"]
    assert "forward" in pushed
