"""The kprof TensorBoard tab, for real: TensorBoard on 127.0.0.1 over traces written by kprof.session and
kprof.compare, its HTTP routes checked against kprof.summarize of the same files, the page in headless Chromium."""

from __future__ import annotations

import copy
import html
import json
import re
import shutil
import struct
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch
from torch import nn

import kprof_callbacks as kprof
from kprof_callbacks import layout
from kprof_callbacks.analysis import breakdown
from kprof_callbacks.analysis.series import read_series
from kprof_callbacks.analysis.slices import TraceSlices, median_step
from kprof_callbacks.tensorboard.launch import TensorBoardServer
from kprof_callbacks.tensorboard.logdir import has_data, scan

PLUGIN = "data/plugin/kprof/"
BAD_TRACE = "otherhost_1.1795000000000000000.pt.trace.json"
NOISY_CI = (0.9, 1.12)
FIXTURES = Path(__file__).parent / "fixtures"  # a speedup interval far wider than the 2% noise threshold


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))


def _profile(logdir: Path, run: str, steps: int = 5, continues: kprof.Session | None = None) -> kprof.Session:
    """A real profiled loop: one capture of 2 steps (wait=1, warmup=1, active=2), step-time scalars for all; into the
    folder of the session it ``continues``, if any."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    config = kprof.ProfileConfig.from_kwargs(logdir=logdir, run=run, wait=1, warmup=1, active=2, repeat=1)
    with kprof.Session(config, continues=continues, model=model) as s:
        for _ in range(steps):
            with s.region("forward"):
                loss = model(torch.randn(8, 16)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            s.step()
    assert len(s.trace_files) == 1
    return s


def _lightning_like_trace(folder: Path) -> Path:
    """test_timeline's trace in which Optimizer.step#SGD.step holds forward and backward."""
    from test_timeline import _lightning_like_trace as make

    return make(folder)


def _roundtrip(data: dict) -> dict:
    return json.loads(json.dumps(data))


@pytest.fixture(scope="module")
def logdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("log").resolve()


@pytest.fixture(scope="module")
def comparison(logdir: Path):
    model = _model()
    batches = [torch.randn(8, 16) for _ in range(3)]
    return kprof.compare(
        {"torch": model, "copy": copy.deepcopy(model)},
        lambda m, b: m(b).pow(2).mean(),
        batches,
        steps=4,
        warmup=1,
        block=2,
        logdir=logdir / "ab",
    )


@pytest.fixture(scope="module")
def sessions(logdir: Path, comparison) -> dict[str, kprof.Session]:
    """Runs `live` and `baseline`; `baseline` also holds a truncated trace and a complete-looking `.partial`;
    `broken` holds nothing but a truncated trace; `nested` a trace whose labels hold labels (as under Lightning);
    `noisy` a comparison whose interval is far wider than its noise threshold."""
    live = _profile(logdir, "live")
    (logdir / "broken").mkdir()
    (logdir / "broken" / BAD_TRACE).write_text(live.trace_files[0].read_text()[:5000])
    (logdir / "nested").mkdir()
    _lightning_like_trace(logdir / "nested")
    (logdir / "noisy").mkdir()
    noisy = json.loads((logdir / "ab" / "compare.json").read_text())
    noisy["variants"][1].update(speedup=1.01, ci_low=NOISY_CI[0], ci_high=NOISY_CI[1])
    (logdir / "noisy" / "compare.json").write_text(json.dumps(noisy))
    runs = {"live": live, "baseline": _profile(logdir, "baseline", steps=6)}  # written last: the tab opens on it
    good = runs["baseline"].trace_files[0]
    text = good.read_text()
    (good.parent / BAD_TRACE).write_text(text[: len(text) // 2])  # a crash mid-write without the temp-file rename
    good.with_name(good.name + ".partial").write_text(text)  # would double every count if it were read
    return runs


@pytest.fixture(scope="module")
def tb(logdir: Path, sessions, group_leftovers):
    with TensorBoardServer(logdir) as server:
        yield server
    assert not group_leftovers(server.pid), "TensorBoard left processes behind"


def _get(tb: TensorBoardServer, route: str, **params):
    return tb.get_json(PLUGIN + route, **params)


def _http_error(tb: TensorBoardServer, route: str, **params) -> int:
    with pytest.raises(urllib.error.HTTPError) as err:
        _get(tb, route, **params)
    return err.value.code


# -- registration and routes -----------------------------------------------------------------------------------
def test_plugin_is_listed_and_serves_its_module(tb):
    listing = tb.get_json("data/plugins_listing")
    assert listing["kprof"]["enabled"] is True
    assert listing["kprof"]["loading_mechanism"] == {"type": "IFRAME", "module_path": "/data/plugin/kprof/index.js"}
    with urllib.request.urlopen(tb.url + PLUGIN + "index.js", timeout=30) as response:
        assert response.headers["Content-Type"].startswith("text/javascript")
        assert b"export async function render()" in response.read()


def test_runs_lists_finished_traces_and_comparisons(tb, logdir, sessions):
    listing = _get(tb, "runs")
    runs = {r["run"]: r for r in listing["runs"]}
    assert set(runs) == {"ab/copy", "ab/torch", "baseline", "broken", "live", "nested"}
    good = sessions["baseline"].trace_files[0].name
    assert sorted(f["name"] for f in runs["baseline"]["traces"]) == sorted([good, BAD_TRACE])
    assert runs["baseline"]["partial"] == [good + ".partial"]
    assert runs["baseline"]["bytes"] == sum((logdir / "baseline" / n).stat().st_size for n in (good, BAD_TRACE))
    assert [c["dir"] for c in listing["comparisons"]] == ["ab", "noisy"]
    assert runs["ab/torch"]["comparison"] == "ab" and runs["baseline"]["comparison"] is None
    assert listing["legend"] == _roundtrip(breakdown.legend())


@pytest.mark.parametrize("run", ["baseline", "ab/torch"])
def test_summary_equals_kprof_summarize(tb, logdir, run):
    data = _get(tb, "summary", run=run)
    assert data["error"] is None
    assert data["summary"] == _roundtrip(kprof.summarize(logdir / run).to_dict())
    assert data["summary"]["steps"] and data["summary"]["diagnostics"]


def test_bad_and_partial_files_are_named_and_the_rest_is_summarized(tb, logdir, sessions):
    data = _get(tb, "summary", run="baseline")
    good = sessions["baseline"].trace_files[0]
    problems = {p["file"]: p["problem"] for p in data["problems"]}
    assert set(problems) == {BAD_TRACE, good.name + ".partial"}
    assert "corrupt JSON" in problems[BAD_TRACE]
    assert "still being written" in problems[good.name + ".partial"]
    alone = _roundtrip(kprof.summarize(good).to_dict())  # the good file by itself: the .partial added nothing
    assert data["summary"]["files"] == [str(good)]
    for table in ("steps", "ops", "labels", "kernels", "diagnostics"):
        assert data["summary"][table] == alone[table]
    assert [s["step"] for s in data["summary"]["steps"]] == [2, 3]  # ProfilerStep#N of the active window


def test_run_without_a_readable_file_says_why(tb, logdir):
    data = _get(tb, "summary", run="broken")
    assert data["summary"] is None
    assert f"{logdir / 'broken' / BAD_TRACE}: truncated or corrupt JSON" in data["error"]
    with pytest.raises(ValueError, match="nothing readable"):
        kprof.summarize(logdir / "broken")


def test_step_time_covers_every_step(tb, sessions):
    times = sessions["baseline"].step_times
    points = tb.wait_for(lambda: _get(tb, "steptime", run="baseline")["points"], "kprof/step_time_ms scalars")
    assert [p[0] for p in points] == list(range(len(times)))  # numbered like ProfilerStep#N, from 0
    assert [p[1] for p in points] == pytest.approx([t * 1e3 for t in times], rel=1e-5)
    (tags,) = read_series(sessions["baseline"].run_dir).values()
    own, export = tags[layout.PROFILER_TAG], tags[layout.AFTER_WINDOW_TAG]
    charged = dict(zip(export.steps.tolist(), export.values.tolist()))  # what the steps after the window paid for it
    served = _get(tb, "steptime", run="baseline")["profiler"]  # kprof's own cost, step by step
    expected = [[int(s), pytest.approx(v + charged.get(s, 0.0), rel=1e-6)] for s, v in zip(own.steps, own.values)]
    assert served == expected and list(charged) == [4, 5]  # the window of steps 2-3 (its warm-up 1) ended at 3
    assert [s for s, _ in served] == list(range(len(times)))
    assert _get(tb, "steptime", run="baseline")["slow_step_trigger"] is None  # a fixed schedule: no trigger to name


def test_compare_route_serves_compare_json_with_run_links(tb, logdir, comparison):
    data = _get(tb, "compare", dir="ab")
    assert data["error"] is None
    assert data["data"] == json.loads((logdir / "ab" / "compare.json").read_text())
    assert data["runs"] == {"torch": "ab/torch", "copy": "ab/copy"}
    assert [v["speedup"] for v in data["data"]["variants"]] == [comparison[n].speedup for n in ("torch", "copy")]


def test_trace_download_is_the_file_on_disk(tb, sessions):
    path = sessions["baseline"].trace_files[0]
    url = f"{tb.url}{PLUGIN}trace?run=baseline&file={path.name}"
    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.headers["Content-Disposition"] == f"attachment; filename={path.name}"
        assert response.read() == path.read_bytes()


@pytest.mark.parametrize(
    "route, params",
    [
        ("summary", {"run": "../.."}),
        ("summary", {"run": "nope"}),
        ("summary", {"run": "ab"}),  # a folder, but no trace files in it
        ("trace", {"run": "baseline", "file": "../live/x.pt.trace.json"}),
        ("trace", {"run": "baseline", "file": "events.out.tfevents.0"}),
        ("compare", {"dir": "baseline"}),
        ("modules", {"run": "nope"}),
        ("modules", {"run": "../.."}),
    ],
)
def test_unknown_runs_and_files_are_404(tb, route, params):
    assert _http_error(tb, route, **params) == 404


# -- the timeline ---------------------------------------------------------------------------------------------
def test_timeline_serves_the_median_step_then_any_step_of_a_file(tb, sessions):
    path = sessions["baseline"].trace_files[0]
    slices = TraceSlices.read(path)
    first = _get(tb, "timeline", run="baseline", file=path.name)
    assert [w["step"] for w in first["steps"]] == [2, 3]  # the active window of the baseline run
    assert first["step"] == median_step([(w.step, w.wall_us) for w in slices.steps()])
    served = {k: v for k, v in first.items() if k not in ("run", "steps")}
    assert served == _roundtrip(slices.step(first["step"]).to_dict())
    for step in (2, 3):
        data = _get(tb, "timeline", run="baseline", file=path.name, step=str(step))
        names = [data["names"][k] for k in data["events"]["name"]]
        assert data["step"] == step and data["run"] == "baseline"
        assert f"ProfilerStep#{step}" in names and "forward" in names and "aten::addmm" in names
        assert data["lanes"][0]["kind"] == "thread"


@pytest.mark.parametrize(
    "params, code",
    [
        ({"step": "99"}, 404),
        ({"step": "two"}, 400),
        ({"step": "--5"}, 400),
        ({"step": "1e3"}, 400),
        ({"file": BAD_TRACE}, 422),
        ({"file": "nope.pt.trace.json"}, 404),
    ],
)
def test_timeline_refuses_unknown_steps_bad_numbers_and_broken_files(tb, sessions, params, code):
    good = sessions["baseline"].trace_files[0].name
    assert _http_error(tb, "timeline", **{"run": "baseline", "file": good, **params}) == code


def test_missing_run_parameter_is_400(tb):
    assert _http_error(tb, "summary") == 400
    assert _http_error(tb, "modules") == 400


def test_modules_route_is_the_module_tree_of_kprof_summarize(tb, logdir):
    data = _get(tb, "modules", run="baseline")
    summary = kprof.summarize(logdir / "baseline")
    (model, *others) = data["tree"]
    assert model["label"] == "(model)" and {c["name"] for c in model["children"]} == {"0", "1", "2"}
    assert {o["name"] for o in others} <= {"(optimizer)", "(outside modules)"}
    rows = {(r.name, r.direction): r for r in summary.modules}
    first = next(c for c in model["children"] if c["name"] == "0")
    assert first["forward_us"] == pytest.approx(rows[("0", "forward")].cpu_us)
    assert first["backward_us"] == pytest.approx(rows[("0", "backward")].cpu_us)
    assert data["gpu"] is False and data["lines"] == []  # no Python stacks were recorded


def test_tab_renders_the_module_tree(tb, chromium):
    dom = chromium(f"{tb.url}data/plugin_entry.html?name=kprof#run=baseline", "--dump-dom")
    view = dom[dom.index("Time by module") :]
    assert '<details open="" data-module="">' in view  # the model, open; its children closed
    assert all(f'data-module="{name}"' in view for name in ("0", "1", "2", "(optimizer)"))
    assert "No source lines: profile with with_stack=True" in view


# -- the page ------------------------------------------------------------------------------------------------
def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_tab_renders_diagnostics_and_bad_files(tb, logdir, chromium):
    dom = chromium(f"{tb.url}data/plugin_entry.html?name=kprof#run=baseline", "--dump-dom")
    summary = kprof.summarize(logdir / "baseline")
    assert 'id="diagnostics"' in dom
    for diagnostic in summary.diagnostics:
        assert f'data-kind="{diagnostic.kind}"' in dom
    assert 'id="problems"' in dom and f"<code>{BAD_TRACE}</code>" in dom
    assert "Per-step breakdown" in dom and "Step time over the run" in dom and "<svg" in dom


def test_tab_opens_on_the_run_written_last_and_draws_its_timeline(tb, chromium):
    dom = chromium(f"{tb.url}data/plugin_entry.html?name=kprof", "--dump-dom")
    assert 'data-view="run=baseline"' in dom  # no #hash: the newest run
    drawn = re.search(r'class="timeline-wrap" data-drawn="(\d+)"', dom)
    assert drawn and int(drawn[1]) > 20
    assert re.findall(r'<option value="(\d+)"', dom) == ["2", "3"]  # the steps of the file shown


def _svg_number(dom: str, pattern: str) -> list[float]:
    return [float(v) for v in re.findall(pattern, dom)]


def test_step_time_chart_marks_windows_and_labels_medians_beside_the_line(tb, chromium):
    dom = chromium(f"{tb.url}data/plugin_entry.html?name=kprof#run=baseline", "--dump-dom")
    chart = dom[dom.index("Step time over the run") : dom.index("Per-step breakdown")]
    assert chart.count('class="window"') == 1 and "profiled 2–3" in chart
    line_end = max(float(x) for x in re.findall(r"([\d.]+),[\d.]+", re.search(r'<polyline points="([^"]*)"', chart)[1]))
    labels = re.findall(r'<text x="([\d.]+)" y="[\d.]+" class="tick (median[\w-]*)-label">([^<]*)</text>', chart)
    assert [(cls, text.split(":")[0]) for _, cls, text in labels] == [
        ("median", "median, all 6 steps"),
        ("median-profiled", "median, 2 profiled"),
    ]
    assert all(float(x) > line_end for x, _, _ in labels)  # in the margin, never on the line
    band = re.search(
        r'<polygon points="[^"]*" fill="#9c755f" fill-opacity="0.55" class="profiler">'
        r"<title>([^<]*)",
        chart,
    )
    assert band and band[1].startswith("kprof's own cost: ") and "over 6 steps, most at step " in band[1]
    assert "kprof's own cost (kprof/profiler_ms: " in chart  # the legend


def test_tab_renders_the_comparison(tb, chromium, comparison):
    dom = chromium(f"{tb.url}data/plugin_entry.html?name=kprof#compare=ab", "--dump-dom")
    assert 'id="compare"' in dom
    assert ">torch</a>" in dom and ">copy</a>" in dom and "baseline" in dom
    assert dom.count('class="median-mark"') == 2 and 'class="axis"' in dom and dom.count('class="whisker"') == 6
    said = comparison["copy"].trace_diff
    assert said and f"<li><code>copy</code>: {html.escape(said, quote=False)}</li>" in dom  # what kprof diff found


def test_noisy_comparison_is_flagged(tb, chromium, comparison):
    dom = chromium(f"{tb.url}data/plugin_entry.html?name=kprof#compare=noisy", "--dump-dom")
    warning = re.search(r'<p class="diag warning" id="noise">(.*?)</p>', dom)
    assert warning and f"[{NOISY_CI[0]:.3f}, {NOISY_CI[1]:.3f}]" in warning[1] and "2%" in warning[1]
    measured = chromium(f"{tb.url}data/plugin_entry.html?name=kprof#compare=ab", "--dump-dom")
    noisy = any(v.ci and (v.ci[1] - v.ci[0]) / 2 / v.speedup > 0.02 for v in comparison.variants.values())
    assert ('id="noise"' in measured) == noisy


def test_compare_variant_run_says_compare_writes_no_step_time(tb, chromium):
    dom = chromium(f"{tb.url}data/plugin_entry.html?name=kprof#run=ab%2Ftorch", "--dump-dom")
    said = dom.split("Step time over the run")[1][:400]
    assert "kprof.compare writes no step-time scalars" in said and "yet" not in said


def test_labels_that_hold_labels_are_marked(tb, chromium):
    dom = chromium(f"{tb.url}data/plugin_entry.html?name=kprof#run=nested", "--dump-dom")
    assert '<td class="name contains">backward, forward, optimizer_step</td>' in dom
    assert "counts their time too" in dom


def test_screenshot_of_the_tab_inside_tensorboard(tb, chromium, tmp_path):
    shot = tmp_path / "kprof-tab.png"
    chromium(f"{tb.url}#kprof", f"--screenshot={shot}", "--window-size=1280,1600")
    assert _png_size(shot) == (1280, 1600)


def test_new_capture_appears_on_reload(tb, logdir, sessions):
    first = _get(tb, "summary", run="live")
    assert _get(tb, "summary", run="live")["summarized_at"] == first["summarized_at"]  # served from the cache
    _profile(logdir, "live", continues=sessions["live"])
    runs = {r["run"]: r for r in _get(tb, "runs")["runs"]}
    assert len(runs["live"]["traces"]) == 2
    fresh = _get(tb, "summary", run="live")
    assert fresh["summarized_at"] > first["summarized_at"]
    assert len(fresh["summary"]["steps"]) == 2 * len(first["summary"]["steps"])
    assert fresh["summary"] == _roundtrip(kprof.summarize(logdir / "live").to_dict())


# -- a logdir without kprof runs ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def empty_tb(tmp_path_factory, group_leftovers):
    logdir = tmp_path_factory.mktemp("empty")
    (logdir / "first_run").mkdir()
    (logdir / "first_run" / "host_1.1.pt.trace.json.partial").write_text("{}")  # its first capture, still being written
    with TensorBoardServer(logdir) as server:
        yield server
    assert not group_leftovers(server.pid), "TensorBoard left processes behind"


def test_empty_logdir_is_inactive_and_lists_nothing(empty_tb):
    assert empty_tb.get_json("data/plugins_listing")["kprof"]["enabled"] is False
    assert _get(empty_tb, "runs") == {
        "logdir": str(Path(empty_tb.logdir).resolve()),
        "runs": [],
        "comparisons": [],
        "legend": _roundtrip(breakdown.legend()),
    }


def test_empty_logdir_page_says_how_to_produce_a_run(empty_tb, chromium):
    dom = chromium(f"{empty_tb.url}data/plugin_entry.html?name=kprof", "--dump-dom")
    assert 'id="empty"' in dom and "kprof.session(" in dom
    assert re.search(r'<label hidden="">Run <select id="picker"', dom)  # no empty box to pick from


def test_listing_stats_files_without_reading_them(tmp_path):
    """100 runs of unreadable traces list fine: the listing never opens a trace."""
    for i in range(100):
        run = tmp_path / f"run{i:03d}"
        run.mkdir()
        (run / f"host_{i}.{i}.pt.trace.json").write_bytes(b"\0not json")
    runs, comparisons = scan(tmp_path)
    assert [r.name for r in runs] == [f"run{i:03d}" for i in range(100)]
    assert all(r.traces[0].bytes == 9 for r in runs)
    assert comparisons == []
    assert has_data(tmp_path)


def test_file_cache_keeps_no_lock_for_keys_that_failed_and_computes_a_key_once():
    """A lock per failing key was kept forever (100,000 bad requests: 100,000 locks); concurrent requests for one
    key still wait for one computation."""
    import threading

    from kprof_callbacks.tensorboard.cache import FileCache

    cache: FileCache[int] = FileCache(max_entries=4)

    def fail():
        raise ValueError("unreadable")

    for key in range(100_000):
        with pytest.raises(ValueError):
            cache.get(("run", key), 1, fail)
    assert not cache._locks
    calls, started = [], threading.Event()

    def slow():
        started.set()
        calls.append(1)
        threading.Event().wait(0.3)
        return 7

    first = threading.Thread(target=lambda: cache.get("k", 1, slow))
    first.start()
    started.wait(10)
    assert cache.get("k", 1, slow) == 7
    first.join()
    assert calls == [1] and not cache._locks


def test_a_big_run_is_summarized_in_the_background_with_progress_while_other_requests_go_on(tmp_path, monkeypatch):
    """/summary of a run over PROGRESS_BYTES answers at once with its progress (pending) while worker processes read
    it on a thread of its own; /runs and a small run's summary are served meanwhile; then the summary is the
    one kprof.summarize gives."""
    import threading

    from tensorboard.plugins import base_plugin
    from test_analysis import _scaled
    from werkzeug.test import Client
    from werkzeug.wrappers import Response

    from kprof_callbacks.analysis import reader, reading
    from kprof_callbacks.tensorboard import plugin as plugin_module

    (tmp_path / "log").mkdir()
    big = _scaled(tmp_path / "log", mb=1.0, name="big").parent
    small = tmp_path / "log" / "small"
    small.mkdir()
    shutil.copy(FIXTURES / "gpu_small.pt.trace.json.gz", small / "gpuhost_7.1.pt.trace.json.gz")
    monkeypatch.setattr(plugin_module, "PROGRESS_BYTES", 500_000)
    monkeypatch.setattr(reader, "CHUNK_BYTES", 100_000)
    monkeypatch.setattr(reading, "_POOL_BYTES", 0)
    release, real = threading.Event(), plugin_module.summarize_run

    def held_back(run, progress=None, unread=()):
        if run.name == "big":
            progress(123, sum(f.bytes for f in run.traces))
            release.wait(60)
        return real(run, progress, unread)

    monkeypatch.setattr(plugin_module, "summarize_run", held_back)
    routes = plugin_module.KprofPlugin(base_plugin.TBContext(logdir=str(tmp_path / "log"), data_provider=None))
    routes = routes.get_plugin_apps()

    def get(route: str, **params) -> dict:
        response = Client(routes[route], Response).get(route, query_string=params)
        assert response.status_code == 200, response.get_data()[:300]
        return response.get_json()

    pending = get("/summary", run="big")
    assert pending["pending"] is True and pending["total"] == sum(f.stat().st_size for f in big.iterdir())
    assert get("/summary", run="big")["done"] == 123  # the same background summary, not a second one
    assert {r["run"] for r in get("/runs")["runs"]} == {"big", "small"}
    assert get("/summary", run="small")["summary"]["name"] == "small"
    release.set()
    for _ in range(600):
        data = get("/summary", run="big")
        if not data.get("pending"):
            break
        threading.Event().wait(0.1)
    assert data["error"] is None
    assert data["summary"] == _roundtrip(kprof.summarize(big).to_dict())


def test_the_module_view_of_a_compiled_gpt_renders_its_tree_note_and_lines(tmp_path, chromium, group_leftovers):
    """The H100 fixture of a compiled GPT: the tree, the compiled note and the source lines are drawn as elements
    (a list among the view's parts once came out as "[object HTMLTableElement]" text)."""
    shutil.copytree(Path(__file__).parent / "fixtures" / "attribution" / "compiled", tmp_path / "log" / "gpt")
    with TensorBoardServer(tmp_path / "log") as server:
        dom = chromium(
            f"{server.url}data/plugin_entry.html?name=kprof#run=gpt", "--dump-dom", "--virtual-time-budget=20000"
        )
    assert not group_leftovers(server.pid)
    view = dom.split("<h2>Time by module</h2>")[1].split("<h2>")[0]
    assert 'data-module="lm_head"' in view and "Compiled: 1 graph(s) a step" in view
    assert "<h3>Top source lines</h3>" in view and "[object" not in view and ">null<" not in view
