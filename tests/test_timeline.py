"""Timeline slices (analysis/slices.py), their SVG form in the HTML report, and the reports' shared vocabulary,
checked against the raw JSON of recorded GPU traces and of synthetic ones built here."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kprof_callbacks.analysis import breakdown, summarize
from kprof_callbacks.analysis.events import build
from kprof_callbacks.analysis.reader import read_trace
from kprof_callbacks.analysis.slices import KINDS, TraceSlices, find_steps, median_step
from kprof_callbacks.analysis.steps import windows
from kprof_callbacks.analysis.svgtimeline import render
from kprof_callbacks.cli import main
from kprof_callbacks.tensorboard.cache import FileCache

FIXTURES = Path(__file__).parent / "fixtures"
H100 = FIXTURES / "gpu_mlp_h100.pt.trace.json.gz"
SMALL = FIXTURES / "gpu_small.pt.trace.json.gz"  # its runtime calls carry another pid than the ops around them
BENCHMARK = Path(__file__).parent.parent / "benchmarks" / "timeline.py"


def _raw(path: Path) -> list[dict]:
    return json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]


def _ns(us: float) -> int:
    return round(us * 1000)


@pytest.mark.parametrize("path", [H100, SMALL])
def test_each_step_holds_exactly_the_events_of_its_window(path):
    slices = TraceSlices.read(path)
    win = windows(build(read_trace(path)))
    assert [s.step for s in slices.steps()] == win.number.tolist()
    timed = [
        e
        for e in _raw(path)
        if e.get("ph") == "X"
        and e.get("cat")
        in ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "kernel", "gpu_memcpy", "gpu_memset")
    ]
    for number, lo, hi in zip(win.number.tolist(), win.lo.tolist(), win.hi.tolist()):
        piece = slices.step(number)
        inside = [e for e in timed if _ns(e["ts"]) < hi and max(_ns(e["ts"]) + _ns(e["dur"]), _ns(e["ts"]) + 1) > lo]
        assert len(piece) == len(inside)
        assert piece.start_ns == lo and piece.span_ns == hi - lo
        assert sorted(piece.names[k] for k in piece.name.tolist()) == sorted(e["name"] for e in inside)
        kernels = [e for e in inside if e["cat"] == "kernel"]
        assert int((piece.kind == KINDS.index("kernel")).sum()) == len(kernels) > 0


def test_launch_links_follow_correlation_ids():
    piece = TraceSlices.read(H100).step(3)
    raw = {(e["name"], _ns(e["ts"])): e for e in _raw(H100) if e.get("ph") == "X"}
    origin = piece.start_ns
    linked = np.flatnonzero(piece.link >= 0)
    assert linked.size and (piece.kind[linked] >= KINDS.index("kernel")).all()
    for i in linked.tolist():
        j = int(piece.link[i])
        gpu = raw[(piece.names[piece.name[i]], origin + int(piece.start[i]))]
        launch = raw[(piece.names[piece.name[j]], origin + int(piece.start[j]))]
        assert launch["cat"] in ("cuda_runtime", "cuda_driver")
        assert launch["args"]["correlation"] == gpu["args"]["correlation"]


def test_threads_come_first_with_names_and_nesting_then_streams():
    piece = TraceSlices.read(SMALL).step(3)
    assert [(lane.name, lane.kind) for lane in piece.lanes] == [
        ("thread 610 (python3)", "thread"),
        ("thread 637 (pt_autograd_0)", "thread"),
        ("GPU 0 stream 7", "stream"),
    ]
    host = np.flatnonzero(piece.kind < KINDS.index("kernel"))
    nested = host[piece.parent[host] >= 0]
    parents = piece.parent[nested]
    assert (piece.lane[parents] == piece.lane[nested]).all() and (piece.row[nested] == piece.row[parents] + 1).all()
    assert (piece.start[parents] <= piece.start[nested]).all()
    assert (piece.start[parents] + piece.dur[parents] >= piece.start[nested] + piece.dur[nested]).all()
    # runtime calls recorded under another pid still sit inside the op that made them, on its thread
    launches = [i for i in host.tolist() if piece.names[piece.name[i]] == "cudaLaunchKernel"]
    assert launches and all(piece.names[piece.name[piece.parent[i]]].startswith("aten::") for i in launches)
    step_rows = np.flatnonzero(piece.kind == KINDS.index("step"))
    assert [piece.names[piece.name[i]] for i in step_rows.tolist()] == ["ProfilerStep#3"]


def _trace(events: list[dict], tmp_path: Path, name: str = "host_1.1.pt.trace.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def _x(name: str, cat: str, ts: float, dur: float, tid: int = 1, pid: int = 1, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def test_overlapping_gpu_work_on_one_stream_gets_rows_and_a_missing_step_is_a_key_error(tmp_path):
    path = _trace(
        [
            _x("ProfilerStep#0", "user_annotation", 0, 100),
            _x("a", "kernel", 10, 50, tid=7, pid=0),
            _x("b", "kernel", 20, 10, tid=7, pid=0),
            _x("c", "kernel", 40, 30, tid=7, pid=0),
            _x("d", "kernel", 15, 5, tid=8, pid=0),
        ],
        tmp_path,
    )
    piece = TraceSlices.read(path).step(0)
    rows = {piece.names[piece.name[i]]: int(piece.row[i]) for i in range(len(piece))}
    assert rows == {"ProfilerStep#0": 0, "a": 0, "b": 1, "c": 1, "d": 0}
    assert [(lane.name, lane.rows) for lane in piece.lanes] == [
        ("thread 1", 1),
        ("GPU 0 stream 7", 2),
        ("GPU 0 stream 8", 1),
    ]
    with pytest.raises(KeyError, match="no step 5"):
        TraceSlices.read(path).step(5)


def test_median_step_and_find_steps(tmp_path):
    assert median_step([(1, 5.0), (2, 1.0), (3, 9.0)]) == 1
    assert median_step([(1, 5.0), (2, 1.0), (3, 9.0), (4, 7.0)]) == 1  # the lower middle
    other = tmp_path / "other_2.1.pt.trace.json"
    other.write_bytes(b"not read: another worker")
    copy = tmp_path / "h100_1.1.pt.trace.json.gz"
    copy.write_bytes(H100.read_bytes())
    found = find_steps([other, copy], "h100_1", [2, 4, 99])
    assert sorted(found) == [2, 4] and found[4].step == 4


def test_svg_has_a_rectangle_per_visible_event_and_merges_the_rest(tmp_path):
    piece = TraceSlices.read(H100).step(3)
    svg = render(piece, 'median step: <step 3> & "more"')
    assert svg.count("<rect") < len(piece)  # sub-pixel events were merged
    wide = int(((piece.dur * 880 / piece.span_ns) >= 1).sum())
    merged = svg.count("events under a pixel wide")
    assert svg.count("<rect") == wide + merged and merged > 0
    assert "&lt;step 3&gt; &amp; &quot;more&quot;" in svg and "<step 3>" not in svg
    assert svg.count('class="ln"') == sum(
        1 for i in np.flatnonzero(piece.link >= 0).tolist() if piece.dur[i] * 880 / piece.span_ns >= 1
    )
    assert "ProfilerStep#3" in svg and "GPU 0 stream 7" in svg and "launched by cudaLaunchKernel" in svg


def _lightning_like_trace(tmp_path: Path) -> Path:
    """Two steps in which Optimizer.step#SGD.step holds forward and backward, as under Lightning's closure."""
    events = []
    for n, t in enumerate((0, 1000)):
        events += [
            _x(f"ProfilerStep#{n}", "user_annotation", t, 900),
            _x("Optimizer.step#SGD.step", "user_annotation", t + 10, 800),
            _x("forward", "user_annotation", t + 20, 300),
            _x("aten::mm", "cpu_op", t + 30, 200),
            _x("backward", "user_annotation", t + 400, 300),
            _x("aten::mm", "cpu_op", t + 410, 200),
            _x("optimizer_step", "user_annotation", t + 720, 50),
            _x("zero_grad", "user_annotation", t + 850, 20),
        ]
    return _trace(events, tmp_path)


def test_labels_that_contain_labels_name_them_in_every_report(tmp_path, capsys):
    path = _lightning_like_trace(tmp_path)
    labels = {lb.name: lb.contains for lb in summarize(path).labels}
    assert labels == {
        "Optimizer.step#SGD.step": ("backward", "forward", "optimizer_step"),
        "forward": (),
        "backward": (),
        "optimizer_step": (),
        "zero_grad": (),
    }
    html = tmp_path / "report.html"
    assert main(["summary", str(path), "--html", str(html)]) == 0
    out = capsys.readouterr().out
    assert "a label's time includes the labels it contains" in out
    row = next(line for line in out.splitlines() if line.startswith("Optimizer.step#SGD.step"))
    assert row.endswith("backward, forward, optimizer_step")
    assert "<td>backward, forward, optimizer_step</td>" in html.read_text()


def _tables(text: str) -> list[tuple[str, list[str]]]:
    """(title, header cells) of each table in the terminal report."""
    lines = text.splitlines()
    return [(lines[i - 2], lines[i - 1].split("  ")) for i, line in enumerate(lines) if re.fullmatch(r"[- ]+", line)]


@pytest.mark.parametrize("args", [[], ["--top", "3", "--sort", "cpu"], ["--top", "2", "--sort", "memory"]])
def test_html_report_holds_the_terminals_tables_and_two_timelines(tmp_path, capsys, args):
    html = tmp_path / "report.html"
    assert main(["summary", str(H100), "--html", str(html), *args]) == 0
    text, page = capsys.readouterr().out, html.read_text()
    titles = [title for title, _ in _tables(text)]
    assert [t for t in titles if t.startswith("Top")] == re.findall(r"<h2>(Top [^<]*)</h2>", page)
    for title in titles:
        assert f"<h2>{title}</h2>" in page
    top, sort = (int(args[1]), args[3]) if args else (10, "cuda")
    ops = next(t for t in titles if t.startswith("Top") and "operators by self" in t)
    by = {"cuda": "CUDA time", "cpu": "CPU time", "memory": "CUDA memory"}[sort]
    assert ops.startswith(f"Top {top} operators by self {by} (")
    assert page.count('<svg class="tl"') == 2
    assert "median step: step 3" in page and "slowest step: step 2" in page


def test_sort_by_memory_without_memory_data_says_so_in_both_reports(tmp_path, capsys):
    path = _lightning_like_trace(tmp_path)
    html = tmp_path / "report.html"
    assert main(["summary", str(path), "--sort", "memory", "--html", str(html)]) == 0
    said = "operators by self CPU time (no memory recorded: profile with profile_memory=True)"
    assert said in capsys.readouterr().out and said in html.read_text()


def test_every_report_names_the_breakdown_alike(tmp_path, capsys):
    assert main(["summary", str(SMALL)]) == 0
    steps = next(headers for title, headers in _tables(capsys.readouterr().out) if title.startswith("Steps"))
    names = [cell.strip() for cell in steps if cell.strip()]
    assert names[1:] == [
        breakdown.COLUMNS[k]
        for k in (
            "wall_us",
            "gpu_busy_us",
            "gpu_idle_us",
            "kernel_us",
            "memcpy_us",
            "memset_us",
            "cpu_only_us",
            "other_us",
            "peak_memory",
        )
    ]
    assert [p.name for p in breakdown.PARTS] == [breakdown.COLUMNS[p.key] for p in breakdown.PARTS]
    assert breakdown.KIND_COLORS["kernel"] == breakdown.PARTS[0].color
    assert set(breakdown.KIND_COLORS) == set(KINDS)


def test_file_cache_recomputes_only_when_the_fingerprint_changes():
    cache: FileCache[int] = FileCache(max_entries=2)
    calls = []

    def compute(value: int):
        return lambda: calls.append(value) or value

    assert cache.get("a", 1, compute(10)) == 10
    assert cache.get("a", 1, compute(11)) == 10  # same files: the stored value
    assert cache.get("a", 2, compute(12)) == 12  # a file changed
    cache.get("b", 1, compute(20))
    cache.get("c", 1, compute(30))  # evicts "a", the least recently used
    assert cache.get("a", 2, compute(13)) == 13
    assert calls == [10, 12, 20, 30, 13]


@pytest.mark.serial
def test_benchmark_quick_prints_its_table():
    done = subprocess.run([sys.executable, str(BENCHMARK), "--quick"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    header, rule, row = [line for line in done.stdout.splitlines() if line.startswith("|")]
    cells = dict(zip(header.strip("|").split("|"), row.strip("|").split("|")))
    assert float(cells[" cold s "]) > float(cells[" warm s "]) > 0
    assert int(cells[" events in the step "].replace(",", "")) > 500
