"""Fault 8: wrong types and values at every public entry point fail at once, naming the argument.

The session's cases are generated from ``ProfileConfig``'s fields and their declared types, so a new option
is fuzzed as soon as it exists. Every case also checks that nothing ran or was written before the error.
"""

from __future__ import annotations

import dataclasses
import math
import signal

import pytest
import torch
from torch import nn

import kprof_callbacks as kprof
from kprof_callbacks import cli
from kprof_callbacks.config import ProfileConfig
from kprof_callbacks.session import Session

NAN, INF = math.nan, math.inf
WRONG = {  # wrong values for each declared field type (None is added for fields that are not optional)
    "int": ["3", 2.5, True, [1], NAN],
    "float": ["1.5", True, [1.0], NAN, INF, -INF],
    "bool": [1, "yes", 0.0],
    "str": [5, b"r", ["r"]],
}
EXTRA = [  # right type, wrong value
    ("signal", signal.SIGKILL),
    ("signal", signal.SIGSTOP),
    ("signal", 0),
    ("run", ".."),
    ("run", "."),
    ("run", "a/b"),
    ("run", 'say "hi"'),  # torch writes the run folder's path into the trace unescaped
    ("run", "back\\slash"),
    ("run", "new\nline"),
    ("run", "tab\there"),
    ("run", "bell\x07"),
    ("run", "surrogate\udc80"),
    ("max_pending_mb", 0.0),
    ("logdir", 5),
    ("logdir", None),
    ("activities", "cpu"),
    ("activities", []),
    ("activities", [torch.profiler.ProfilerActivity.CPU, "cuda"]),
    ("poll_every", 0),
    ("cooldown", -1),
    ("max_captures", 0),
    ("write_timeout", 0.0),
]


def _session_cases() -> list[tuple[str, object]]:
    cases = []
    for field in dataclasses.fields(ProfileConfig):
        kind, optional = field.type.removesuffix(" | None"), field.type.endswith(" | None")
        for value in WRONG.get(kind, []) + ([] if optional or kind not in WRONG else [None]):
            cases.append((field.name, value))
    return cases + EXTRA


@pytest.mark.parametrize("name, value", _session_cases(), ids=lambda v: repr(v)[:30])
def test_bad_session_option_fails_before_anything_runs(tmp_path, name, value):
    """Every wrong type/value of every kprof.session option: TypeError/ValueError naming it, no folder created."""
    options = {"logdir": tmp_path / "log", name: value}
    with pytest.raises((TypeError, ValueError), match=rf"\b{name}\b"):
        kprof.session(**options)
    assert not (tmp_path / "log").exists()


@pytest.mark.parametrize(
    "name, value", [(n, v) for n, v in _session_cases() if (n, v) != ("logdir", None)], ids=lambda v: repr(v)[:30]
)
def test_bad_callback_option_fails_at_construction(tmp_path, name, value):
    """The same fuzz through kprof.ProfilerCallback(**options): TypeError/ValueError naming it, before any fit."""
    with pytest.raises((TypeError, ValueError), match=rf"\b{name}\b"):
        kprof.ProfilerCallback(**{"logdir": tmp_path / "log", name: value})
    assert not (tmp_path / "log").exists()


@pytest.mark.parametrize(
    "args, kwargs, name",
    [
        ((5,), {}, "config"),
        ((ProfileConfig(enabled=False),), {"on_trace": "print"}, "on_trace"),
        ((ProfileConfig(enabled=False),), {"continues": "log/r"}, "continues"),
    ],
)
def test_bad_session_object_arguments(args, kwargs, name):
    """Session(config, on_trace=..., continues=...) with a wrong config, a non-callable on_trace or a continues= that
    is not a Session fails at construction."""
    with pytest.raises(TypeError, match=name):
        Session(*args, **kwargs)


@pytest.mark.parametrize("samples", ["8", -1, 2.5, True, torch.tensor(8.0)])
def test_bad_samples_at_step_fails_naming_it_and_counts_no_step(tmp_path, samples):
    """s.step(samples=...) with a non-count: ValueError naming samples, in the training thread, step not counted."""
    with kprof.session(tmp_path, run="r", wait=5, scalars=False) as s:
        s.step(samples=8)
        with pytest.raises(ValueError, match="samples"):
            s.step(samples=samples)
        s.step(samples=8)
    assert s.steps == 2 and len(s.step_times) == 2


_CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a CUDA device")


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"fn": 5}, "fn"),
        ({"warmup": -1}, "warmup"),
        ({"warmup": "5"}, "warmup"),
        ({"iters": 0}, "iters"),
        ({"iters": 2.0}, "iters"),
        ({"flush_l2": "yes"}, "flush_l2"),
        ({"device": 5}, "device"),
        ({"device": "tpu"}, "device"),
        pytest.param({"device": "cuda"}, "device", marks=_CPU_ONLY),
    ],
)
def test_bad_time_cuda_arguments_fail_before_calling_fn(kwargs, name):
    """time_cuda with a wrong argument: TypeError/ValueError naming it, fn never called (no crash inside torch.cuda)."""
    calls = []
    kwargs = {"fn": lambda: calls.append(1), **kwargs}
    with pytest.raises((TypeError, ValueError), match=name):
        kprof.time_cuda(kwargs.pop("fn"), **kwargs)
    assert calls == []


def _tiny() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), nn.GELU())


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"variants": 5}, "variants"),
        ({"variants": {}}, "variants"),
        ({"variants": {"a/b": _tiny()}}, "variant"),
        ({"variants": {"a": 5}}, "variants"),
        ({"step_fn": 5}, "step_fn"),
        ({"batches": 5}, "batches"),
        ({"batches": []}, "batches"),
        ({"steps": 0}, "steps"),
        ({"steps": "3"}, "steps"),
        ({"warmup": -1}, "warmup"),
        ({"block": 0}, "block"),
        ({"seed": -1}, "seed"),
        ({"check": "yes"}, "check"),
        ({"tol": -1.0}, "tol"),
        ({"tol": NAN}, "tol"),
        ({"confidence": 1.5}, "confidence"),
        ({"noise_threshold": -1}, "noise_threshold"),
        ({"noise_threshold": NAN}, "noise_threshold"),
        ({"optimizer": 5}, "optimizer"),
        ({"logdir": 5}, "logdir"),
    ],
    ids=lambda v: repr(v)[:40],
)
def test_bad_compare_arguments_fail_before_any_step(kwargs, name):
    """kprof.compare with a wrong argument: TypeError/ValueError naming it, step_fn never called."""
    calls = []

    def step_fn(model, batch):
        calls.append(1)
        return model(batch).sum()

    arguments = {"variants": {"a": _tiny()}, "step_fn": step_fn, "batches": [torch.randn(2, 4)], "steps": 3, **kwargs}
    with pytest.raises((TypeError, ValueError), match=name):
        kprof.compare(**arguments)
    assert calls == []


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"model": 5}, "model"),
        ({"mapping": 5}, "mapping"),
        ({"mapping": {5: "GELU"}}, "mapping"),
        ({"mapping": {nn.GELU: 5}}, "mapping"),
        ({"inplace": "yes"}, "inplace"),
        ({"fallback": "yes"}, "fallback"),
    ],
    ids=lambda v: repr(v)[:40],
)
def test_bad_swap_arguments_fail_before_building(kwargs, name):
    """kprof.swap with a wrong argument: TypeError/ValueError naming it, before any kernel is built."""
    with pytest.raises((TypeError, ValueError), match=name):
        kprof.swap(**{"model": _tiny(), **kwargs})


@pytest.mark.parametrize("path", [5, None])
def test_bad_summarize_path_names_the_argument(path):
    """kprof.summarize(path) with a non-path: TypeError naming path."""
    with pytest.raises(TypeError, match="path"):
        kprof.summarize(path)


def test_summarize_missing_path_is_a_clear_file_not_found(tmp_path):
    """kprof.summarize on a path that does not exist: FileNotFoundError naming it (not an empty Summary)."""
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nope")):
        kprof.summarize(tmp_path / "nope")


@pytest.mark.parametrize(
    "env, value, match",
    [
        ("KPROF", "maybe", "KPROF must be 1/true/on/yes or 0/false/off/no, got 'maybe'"),
        ("KPROF_ACTIVE", "-1", "KPROF_ACTIVE must be an integer >= 1, got '-1'"),
        ("KPROF_WAIT", "soon", "KPROF_WAIT must be an integer >= 0, got 'soon'"),
        ("KPROF_TRIGGER", "sometimes", "KPROF_TRIGGER must be one of"),
    ],
)
def test_bad_environment_variable_is_named_before_anything_runs(tmp_path, monkeypatch, env, value, match):
    monkeypatch.setenv(env, value)
    with pytest.raises(ValueError, match=match):
        kprof.session(tmp_path / "log")
    assert not (tmp_path / "log").exists()


def test_a_disabled_session_is_a_no_op_whose_summary_says_so(tmp_path, monkeypatch, train):
    """KPROF=0 and the README's snippet: it runs, and print(s.summary()) says profiling was off (it raised before)."""
    monkeypatch.setenv("KPROF", "off")
    with kprof.session(tmp_path / "log", run="r") as s:
        train(s, 3)
    summary = s.summary()
    assert "profiling was disabled" in str(summary) and summary.files == [] and summary.steps == []
    assert not (tmp_path / "log").exists()


def test_a_home_relative_logdir_is_expanded(tmp_path, monkeypatch, train):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    with kprof.session("~/log", run="r", wait=0, warmup=1, active=1) as s:
        train(s, 2)
    assert s.run_dir == tmp_path / "home" / "log" / "r" and len(s.trace_files) == 1
    assert not (tmp_path / "~").exists()


@pytest.mark.parametrize("label", ["surrogate\udc80", "\ud800"])
def test_a_region_label_utf8_cannot_encode_fails_at_the_call_in_and_outside_windows(tmp_path, train, label):
    """A surrogate-escaped file name as a label crashed training at the first profiled step; now the call says so."""
    with kprof.session(tmp_path, run="r", wait=1, warmup=1, active=1) as s:
        for _ in range(4):
            with pytest.raises(ValueError, match="UTF-8"):
                s.region(label)
            with s.region("ok"):
                pass
            s.step()
    assert len(s.trace_files) == 1


@pytest.mark.parametrize(
    "steps, env, message",
    [
        (
            12,
            {"KPROF": "0"},
            "profiling is switched off (KPROF=0), and the demo shows what profiling finds: unset KPROF",
        ),  # TypeError: s.run_dir was None
        (5, {}, "--steps must be at least 12, where the first profiling window ends (got 5)"),  # "no trace files"
        (0, {}, "--steps must be at least 12, where the first profiling window ends (got 0)"),  # IndexError
    ],
)
def test_bad_demo_input_is_one_line_before_training(tmp_path, monkeypatch, capsys, steps, env, message):
    """``kprof demo`` with too few steps for a window, or with profiling off: one line, exit 2, nothing written."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert cli.main(["demo", "--logdir", str(tmp_path / "log"), "--steps", str(steps)]) == 2
    out, err = capsys.readouterr()
    assert err.splitlines() == [f"kprof demo: {message}"] and out == ""
    assert not (tmp_path / "log").exists()
