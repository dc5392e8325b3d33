"""Random schema-valid traces never raise out of ``summarize``: a file it cannot use is a listed problem, and one bad
file never takes down the summary of the others (docs/summary.md's promise, in the CLI and the kprof tab alike)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from kprof_callbacks import summarize
from kprof_callbacks.cli import main

HUGE = [2**63, 2**64 + 5, -(2**63) - 1, 10**30]
CATEGORIES = [
    "cpu_op",
    "user_annotation",
    "python_function",
    "cuda_runtime",
    "kernel",
    "gpu_memcpy",
    "gpu_memset",
    "gpu_user_annotation",
    "[memory]",
    "Trace",
    "ac2g",
    "nonsense",
]


def _number(rng: random.Random, big: bool) -> float | int:
    choices = [rng.uniform(0, 1e4), 0, -rng.uniform(0, 1e3), rng.randint(0, 10**6)]
    return rng.choice(choices + (HUGE + [1e300, -1e300] if big else []))


def _event(rng: random.Random, big: bool) -> dict:
    step = rng.choice([rng.randint(0, 20), *(HUGE if big else [])])
    name = rng.choice(
        [
            f"ProfilerStep#{step}",
            "aten::mm",
            "aten::add_",
            "cudaLaunchKernel",
            "sgemm",
            "forward",
            "nccl:all_reduce",
            "ProfilerStep#",
            "ProfilerStep#x",
            "",
        ]
    )
    event = {
        "ph": rng.choice(["X", "X", "X", "i", "s", "f"]),
        "name": name,
        "cat": rng.choice(CATEGORIES),
        "pid": rng.choice([0, 1, 12345, "Spans", -1]),
        "tid": rng.choice([0, 1, 7, "stream 7", -1]),
        "ts": _number(rng, big),
        "dur": _number(rng, big),
    }
    args = {}
    for key in ("External id", "correlation", "Bytes", "Total Allocated", "Device Type", "bytes"):
        if rng.random() < 0.3:
            args[key] = rng.choice([rng.randint(-2, 50), *(HUGE if big else [])])
    if rng.random() < 0.2:
        args["Input Dims"] = rng.choice([[[2, 3], []], [[10**30]], "x", [[-1]]])
    if args:
        event["args"] = args
    return event


def _trace(rng: random.Random, big: bool) -> dict:
    events = [_event(rng, big) for _ in range(rng.randint(0, 40))]
    if rng.random() < 0.7:  # most traces have steps and a timed op inside them
        start = rng.uniform(0, 100)
        events.append(
            {
                "ph": "X",
                "name": "ProfilerStep#3",
                "cat": "user_annotation",
                "pid": 1,
                "tid": 1,
                "ts": start,
                "dur": rng.choice([0, 50.0, 1e3]),
            }
        )
        events.append(
            {
                "ph": "X",
                "name": "aten::mm",
                "cat": "cpu_op",
                "pid": 1,
                "tid": 1,
                "ts": start + 1,
                "dur": rng.choice([0, 5.0]),
            }
        )
    return {"traceEvents": events}


@pytest.mark.parametrize("seed", range(60))
def test_random_traces_never_raise_out_of_summarize(tmp_path, seed):
    rng = random.Random(seed)
    run = tmp_path / "run"
    run.mkdir()
    for i in range(3):
        (run / f"w_{i}.{i}.pt.trace.json").write_text(json.dumps(_trace(rng, big=seed % 2 == 1)))
    try:
        summary = summarize(run)
    except ValueError as exc:  # nothing readable at all: the message names every file
        assert all(f"w_{i}" in str(exc) for i in range(3)), exc
        return
    summary.render()
    json.dumps(summary.to_dict(), allow_nan=False)
    assert len(summary.files) + len(summary.problems) == 3
    assert not [p for p in summary.problems if "please report it" in p.reason]  # every case has a reason of its own


BAD = {
    "external id of 2**63": {
        "ph": "X",
        "name": "aten::mm",
        "cat": "cpu_op",
        "pid": 1,
        "tid": 1,
        "ts": 1,
        "dur": 2,
        "args": {"External id": 2**63},
    },
    "bytes of 2**64": {
        "ph": "i",
        "name": "[memory]",
        "cat": "cpu_instant_event",
        "pid": 1,
        "tid": 1,
        "ts": 1,
        "args": {"Bytes": 2**64, "Total Allocated": 2**64, "Device Type": 0},
    },
    "30-digit step": {
        "ph": "X",
        "name": f"ProfilerStep#{10**29}",
        "cat": "user_annotation",
        "pid": 1,
        "tid": 1,
        "ts": 1,
        "dur": 5,
    },
    "device events only": {
        "ph": "X",
        "name": "sgemm",
        "cat": "kernel",
        "pid": 0,
        "tid": 7,
        "ts": 1,
        "dur": 5,
        "args": {"correlation": 3},
    },
    "a step of zero length": {
        "ph": "X",
        "name": "ProfilerStep#1",
        "cat": "user_annotation",
        "pid": 1,
        "tid": 1,
        "ts": 5,
        "dur": 0,
    },
    "a negative duration": {
        "ph": "X",
        "name": "aten::mm",
        "cat": "cpu_op",
        "pid": 1,
        "tid": 1,
        "ts": 1,
        "dur": -9223372036854775,
    },
}


def _good_events() -> list[dict]:
    return [
        {"ph": "X", "name": "ProfilerStep#2", "cat": "user_annotation", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
        {"ph": "X", "name": "aten::mm", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 10, "dur": 20},
    ]


@pytest.mark.parametrize("case", list(BAD))
def test_one_bad_file_is_listed_and_the_rest_summarized(tmp_path, case, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "good.1.pt.trace.json").write_text(json.dumps({"traceEvents": _good_events()}))
    bad = run / "bad.2.pt.trace.json"
    events = [BAD[case]] if case == "device events only" else [*_good_events(), BAD[case]]
    bad.write_text(json.dumps({"traceEvents": events}))
    summary = summarize(run)
    assert run / "good.1.pt.trace.json" in summary.files
    if bad not in summary.files:
        assert [p.path for p in summary.problems] == [bad]
    assert "-9223372036" not in summary.render()  # a negative duration is never summed into the tables
    assert main(["summary", str(run)]) == 0
    assert "Traceback" not in capsys.readouterr().err


def test_a_name_that_is_not_utf8_is_a_problem_naming_the_file(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "good.1.pt.trace.json").write_text(json.dumps({"traceEvents": _good_events()}))
    text = json.dumps({"traceEvents": [*_good_events(), {**_good_events()[1], "name": "NAME"}]})
    (run / "bad.2.pt.trace.json").write_bytes(text.encode().replace(b"NAME", b"caf\xe9"))
    summary = summarize(run)
    (problem,) = summary.problems
    assert problem.path == Path(run / "bad.2.pt.trace.json") and "UTF-8" in problem.reason
