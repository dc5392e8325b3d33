"""The kprof tab serves files under the logdir only, and answers bad input with a 4xx and a message, never a 500.

A real TensorBoard serves a logdir holding links that lead out of it, malformed ``compare.json`` files and traces
that decode but cannot be analyzed; the routes are called over HTTP like the page calls them.
"""

from __future__ import annotations

import gzip
import json
import shutil
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

import kprof_callbacks as kprof
from kprof_callbacks.tensorboard.launch import TensorBoardServer

PLUGIN = "data/plugin/kprof/"
FIXTURE = Path(__file__).parent / "fixtures" / "gpu_small.pt.trace.json.gz"
SECRET = "kprof-test-secret-outside-the-logdir"
TRACE = "host_1.100.pt.trace.json.gz"
ZERO_STEPS = "other_2.400.pt.trace.json"


def _trace_with(mutate) -> bytes:
    doc = json.loads(gzip.decompress(FIXTURE.read_bytes()))
    for event in doc["traceEvents"]:
        mutate(event)
    return json.dumps(doc).encode()


@pytest.fixture(scope="module")
def tb(tmp_path_factory, group_leftovers):
    root = tmp_path_factory.mktemp("security")
    outside, logdir = root / "outside", root / "log"
    outside.mkdir()
    (outside / "secret.pt.trace.json").write_text(SECRET)
    (outside / "compare.json").write_text(json.dumps({"variants": [], "device": SECRET}))
    run = logdir / "run"
    run.mkdir(parents=True)
    shutil.copy(FIXTURE, run / TRACE)
    (run / "host_1.200.pt.trace.json").symlink_to(outside / "secret.pt.trace.json")
    (run / "host_1.300.pt.trace.json.gz").symlink_to(run / TRACE)  # a link that stays inside: served
    (run / "host_1.memory_snapshot.pickle").symlink_to(outside / "secret.pt.trace.json")
    secret_ops = _trace_with(lambda e: e.update(name=SECRET) if e.get("cat") == "cpu_op" else None)
    (outside / "valid.pt.trace.json").write_bytes(secret_ops)  # a trace a link leads to: never read
    leaky = logdir / "leaky"
    leaky.mkdir()
    shutil.copy(FIXTURE, leaky / TRACE)
    (leaky / "host_1.500.pt.trace.json").symlink_to(outside / "valid.pt.trace.json")
    linked = logdir / "linked"
    linked.mkdir()
    (linked / "compare.json").symlink_to(outside / "compare.json")
    (logdir / "loop").mkdir()
    (logdir / "loop" / "compare.json").symlink_to(logdir / "loop" / "compare.json")  # a link to itself
    (run / "host_1.400.pt.trace.json").symlink_to(run / "host_1.400.pt.trace.json")
    for name, text in {
        "list": "[]",
        "number": '{"variants": 5}',
        "unnamed": '{"variants": [{"name": 1}]}',
        "trace_dir": '{"variants": [{"name": "a", "trace_dir": 7}]}',
        "json": "{not json",
        "nul": '{"variants": [{"name": "a", "trace_dir": "x\\u0000y"}]}',
    }.items():
        (logdir / f"bad-{name}").mkdir()
        (logdir / f"bad-{name}" / "compare.json").write_text(text)
    crash = logdir / "crash"
    crash.mkdir()
    shutil.copy(FIXTURE, crash / TRACE)
    (crash / "host_1.200.pt.trace.json").write_bytes(
        _trace_with(lambda e: e.setdefault("args", {}).update(correlation=2**70))
    )
    (crash / "host_1.300.pt.trace.json").write_bytes(_trace_with(lambda e: e.update(ts=1e300) if "ts" in e else None))
    (crash / ZERO_STEPS).write_text(
        json.dumps(
            {
                "traceEvents": [  # a median step of 0 us once divided by zero
                    {
                        "ph": "X",
                        "cat": "user_annotation",
                        "name": f"ProfilerStep#{n}",
                        "pid": 1,
                        "tid": 1,
                        "ts": 10 * n,
                        "dur": 5 * (n == 2),
                    }
                    for n in range(3)
                ]
            }
        )
    )
    with TensorBoardServer(logdir) as server:
        yield server
    assert not group_leftovers(server.pid), "TensorBoard left processes behind"


def _status(tb: TensorBoardServer, route: str, **params: str) -> tuple[int, str]:
    url = tb.url + PLUGIN + route + "?" + urllib.parse.urlencode(params)
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


def test_trace_link_leading_out_of_the_logdir_is_not_served(tb):
    code, body = _status(tb, "trace", run="run", file="host_1.200.pt.trace.json")
    assert code in (403, 404) and SECRET not in body
    listing = {r["run"]: r for r in tb.get_json(PLUGIN + "runs")["runs"]}
    assert sorted(f["name"] for f in listing["run"]["traces"]) == [TRACE, "host_1.300.pt.trace.json.gz"]


def test_trace_link_that_stays_inside_is_served(tb):
    code, body = _status(tb, "trace", run="run", file="host_1.300.pt.trace.json.gz")
    assert code == 200


def test_summary_names_links_out_of_the_logdir_and_reads_nothing_there(tb):
    data = tb.get_json(PLUGIN + "summary", run="run")
    problems = {p["file"]: p["problem"] for p in data["problems"]}
    assert "outside the logdir" in problems["host_1.200.pt.trace.json"]
    assert "outside the logdir" in problems["host_1.memory_snapshot.pickle"]
    assert [Path(f).name for f in data["summary"]["files"]] == [TRACE, "host_1.300.pt.trace.json.gz"]
    assert data["summary"]["memory_snapshots"] == []
    assert SECRET not in json.dumps(data)


def test_memory_reads_no_snapshot_outside_the_logdir(tb):
    code, body = _status(tb, "memory", run="run")
    memory = json.loads(body)["memory"]
    assert code == 200 and SECRET not in body and (memory is None or memory["snapshots"] == [])


def test_diff_reads_no_trace_outside_the_logdir(tb):
    code, body = _status(tb, "diff", a="run", b="leaky")
    assert code == 200 and SECRET not in body
    assert json.loads(body)["diff"]["b"]["samples"] == len(kprof.summarize(FIXTURE).per_step.steps)  # the inside file
    read_all = kprof.diff(Path(tb.logdir) / "run", Path(tb.logdir) / "leaky").to_dict()  # what following it shows
    assert SECRET in json.dumps(read_all)


def test_compare_json_link_leading_out_of_the_logdir_is_refused(tb):
    code, body = _status(tb, "compare", dir="linked")
    assert code in (403, 404) and SECRET not in body
    assert "linked" not in [c["dir"] for c in tb.get_json(PLUGIN + "runs")["comparisons"]]


def test_links_that_loop_are_left_out_of_the_listing(tb):
    listing = tb.get_json(PLUGIN + "runs")
    assert "loop" not in [c["dir"] for c in listing["comparisons"]]
    code, body = _status(tb, "compare", dir="loop")
    assert 400 <= code < 500 and "compare.json" in body


@pytest.mark.parametrize("name", ["list", "number", "unnamed", "trace_dir", "json", "nul"])
def test_malformed_compare_json_is_a_4xx_with_a_message(tb, name):
    code, body = _status(tb, "compare", dir=f"bad-{name}")
    assert 400 <= code < 500, (code, body)
    assert "compare.json" in body


@pytest.mark.parametrize(
    "route, params",
    [
        ("summary", {"run": "ru\0n"}),
        ("steptime", {"run": "ru\0n"}),
        ("compare", {"dir": "bad-\0list"}),
        ("trace", {"run": "run", "file": f"{TRACE}\0"}),
        ("timeline", {"run": "run", "file": f"{TRACE}\0"}),
        ("summary", {"run": "r" * 5000}),
        ("summary", {"run": "/".join(["r" * 200] * 40)}),
        ("compare", {"dir": "d" * 300}),
        ("trace", {"run": "run", "file": "f" * 300}),
        ("timeline", {"run": "run", "file": TRACE, "step": "x"}),
        ("timeline", {"run": "run", "file": TRACE, "step": "9" * 40}),
        ("diff", {"a": "run", "b": "ru\0n"}),
        ("diff", {"a": "r" * 5000, "b": "run"}),
        ("diff", {"a": "run", "b": "run", "a_steps": "9" * 5000}),
        ("diff", {"a": "run", "b": "run", "b_steps": "1-" + "9" * 40}),
        ("diff", {"a": "run", "b": "linked"}),
        ("memory", {"run": "ru\0n"}),
        ("memory", {"run": "r" * 5000}),
        ("modules", {"run": "ru\0n"}),
        ("modules", {"run": "r" * 5000}),
    ],
)
def test_nul_bytes_long_names_and_bad_numbers_are_4xx_with_a_message(tb, route, params):
    code, body = _status(tb, route, **params)
    assert 400 <= code < 500, (code, body)
    assert body.strip()


@pytest.mark.parametrize("a, b", [("crash", "run"), ("run", "crash")])
def test_diff_of_traces_that_cannot_be_analyzed_is_not_500(tb, a, b):
    """The files that can be read are diffed; `crash` also holds steps of 0 us (a speedup of 0 or infinity)."""
    code, body = _status(tb, "diff", a=a, b=b)
    assert code == 200, body
    assert json.loads(body)["diff"]["step_time"]["verdict"]


def test_traces_that_cannot_be_analyzed_are_problems_not_500(tb):
    code, body = _status(tb, "summary", run="crash")
    assert code == 200, body
    data = json.loads(body)
    problems = {p["file"]: p["problem"] for p in data["problems"]}
    assert set(problems) == {"host_1.200.pt.trace.json", "host_1.300.pt.trace.json"}
    assert "args.correlation" in problems["host_1.200.pt.trace.json"]  # the reader names the field
    assert ".ts" in problems["host_1.300.pt.trace.json"]
    assert [Path(f).name for f in data["summary"]["files"]] == [TRACE, ZERO_STEPS]


@pytest.mark.parametrize("name", ["host_1.200.pt.trace.json", "host_1.300.pt.trace.json"])
def test_timeline_of_a_trace_that_cannot_be_analyzed_is_a_4xx_with_the_reason(tb, name):
    code, body = _status(tb, "timeline", run="crash", file=name)
    assert 400 <= code < 500, (code, body)
    assert name in body
