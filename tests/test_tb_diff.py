"""The kprof tab's diff view: the /diff route is `kprof.diff` of two runs of the logdir (or steps of them), cached
until either run changes, 4xx for what it cannot diff; the page renders a known change in headless Chromium."""

from __future__ import annotations

import copy
import functools
import html
import http.server
import json
import re
import shutil
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
from test_diff import OPS, noisy_run, write_trace
from torch import nn

import kprof_callbacks as kprof
from kprof_callbacks.analysis import diff_report, fmt
from kprof_callbacks.analysis.breakdown import CHANGE_COLORS
from kprof_callbacks.tensorboard.launch import TensorBoardServer
from kprof_callbacks.tensorboard.plugin import STATIC

PLUGIN = "data/plugin/kprof/"
FIXTURES = Path(__file__).parent / "fixtures"
RECORDED = {"gelu": "gpu_small.pt.trace.json.gz", "relu": "gpu_mlp_h100.pt.trace.json.gz"}  # H100 MLPs


def _runs(logdir: Path) -> None:
    """`base` and `slow`: test_diff's known change (aten::op25 1.5x, a new kernel); `steps`: one run whose
    aten::op10 is 3x slower from step 14; `gelu`/`relu`: recorded H100 traces; `c1`/`c2`: for the cache test;
    `broken`: nothing readable."""
    rng = np.random.default_rng(0)
    for name, options in (("base", {}), ("slow", {"slower": {"aten::op25": 1.5}, "extra_kernel": "my_new_kernel"})):
        (logdir / name).mkdir()
        noisy_run(logdir / name / "w.1.pt.trace.json", rng, 8, **options)
    steps = [
        {k: v * rng.lognormal(0, 0.05) * (3.0 if k == "aten::op10" and i >= 4 else 1.0) for k, v in OPS.items()}
        for i in range(8)
    ]
    (logdir / "steps").mkdir()
    write_trace(logdir / "steps" / "w.1.pt.trace.json", steps[:4], first=10)
    write_trace(logdir / "steps" / "w.2.pt.trace.json", steps[4:], first=14)
    for name, fixture in RECORDED.items():
        (logdir / name).mkdir()
        shutil.copy(FIXTURES / fixture, logdir / name / fixture)
    for name in ("c1", "c2"):
        (logdir / name).mkdir()
        noisy_run(logdir / name / "w.1.pt.trace.json", rng, 4)
    (logdir / "broken").mkdir()
    (logdir / "broken" / "w.1.pt.trace.json").write_text('{"traceEvents": [')


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))


@pytest.fixture(scope="module")
def logdir(tmp_path_factory) -> Path:
    logdir = tmp_path_factory.mktemp("diff-log").resolve()
    _runs(logdir)
    model = _model()
    kprof.compare(
        {"torch": model, "copy": copy.deepcopy(model)},
        lambda m, b: m(b).pow(2).mean(),
        [torch.randn(8, 16) for _ in range(3)],
        steps=4,
        warmup=1,
        block=2,
        logdir=logdir / "ab",
    )
    return logdir


@pytest.fixture(scope="module")
def tb(logdir: Path, group_leftovers):
    with TensorBoardServer(logdir) as server:
        yield server
    assert not group_leftovers(server.pid), "TensorBoard left processes behind"


def _diff(tb: TensorBoardServer, **params: str) -> dict:
    return tb.get_json(PLUGIN + "diff", **params)


def _error(tb: TensorBoardServer, **params: str) -> tuple[int, str]:
    with pytest.raises(urllib.error.HTTPError) as err:
        _diff(tb, **params)
    return err.value.code, err.value.read().decode()


def _side(logdir: Path, run: str, steps: str | None) -> str:
    return f"{logdir / run}@steps={steps}" if steps else str(logdir / run)


def _without_sources(data: dict) -> dict:
    return {**data, "a": {**data["a"], "source": None}, "b": {**data["b"], "source": None}}


# -- the route ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "a, b, a_steps, b_steps",
    [
        ("base", "slow", None, None),
        ("steps", "steps", "10-13", "14-17"),
        ("gelu", "relu", None, "2,4"),
    ],
)
def test_route_is_kprof_diff_of_the_runs(tb, logdir, a, b, a_steps, b_steps):
    steps = {key: value for key, value in (("a_steps", a_steps), ("b_steps", b_steps)) if value}
    data = _diff(tb, a=a, b=b, **steps)
    expected = kprof.diff(_side(logdir, a, a_steps), _side(logdir, b, b_steps))
    assert _without_sources(data["diff"]) == _without_sources(json.loads(json.dumps(expected.to_dict())))
    assert (data["diff"]["a"]["source"], data["diff"]["b"]["source"]) == (
        f"{a}@steps={a_steps}" if a_steps else a,
        f"{b}@steps={b_steps}" if b_steps else b,
    )
    assert data["headline"] == expected.headline()
    assert data["names"] == [fmt.row_name(c.kind, c.name) for c in expected.changes]
    assert [g["title"] for g in data["groups"]] == [title for title, _, _ in diff_report.GROUPS]


def test_route_finds_the_known_changes(tb):
    rows = {(c["kind"], c["name"]): c for c in _diff(tb, a="base", b="slow")["diff"]["changes"]}
    assert rows[("op", "aten::op25")]["status"] == "increased" and rows[("op", "aten::op25")]["significant"]
    assert rows[("kernel", "my_new_kernel")]["verdict"].startswith("new: 1 calls/step, +")
    picked = _diff(tb, a="steps", b="steps", a_steps="10-13", b_steps="14-17")["diff"]
    assert [(c["name"], c["status"]) for c in picked["changes"] if c["significant"]] == [("aten::op10", "increased")]
    recorded = {(c["kind"], c["name"]): c["status"] for c in _diff(tb, a="gelu", b="relu")["diff"]["changes"]}
    assert recorded[("op", "aten::gelu")] == "gone" and recorded[("op", "aten::relu")] == "new"


def test_diff_is_kept_until_either_run_changes(tb, logdir):
    first = _diff(tb, a="c1", b="c2")
    assert _diff(tb, a="c1", b="c2")["computed_at"] == first["computed_at"]  # served from the cache
    assert _diff(tb, a="c2", b="c1")["computed_at"] != first["computed_at"]  # another diff
    noisy_run(logdir / "c2" / "w.2.pt.trace.json", np.random.default_rng(9), 4, slower={"aten::op29": 3.0})
    fresh = _diff(tb, a="c1", b="c2")
    assert fresh["computed_at"] > first["computed_at"]
    assert fresh["diff"]["b"]["samples"] == 2 * first["diff"]["b"]["samples"]
    assert _without_sources(fresh["diff"]) == _without_sources(
        json.loads(json.dumps(kprof.diff(logdir / "c1", logdir / "c2").to_dict()))
    )


@pytest.mark.parametrize(
    "params, code, said",
    [
        ({"a": "base"}, 400, "missing ?b="),
        ({"a": "nope", "b": "base"}, 404, "no folder 'nope'"),
        ({"a": "base", "b": "../.."}, 404, "no folder"),
        ({"a": "base", "b": "ab"}, 404, "no trace files in run 'ab'"),
        ({"a": "base", "b": "slow", "a_steps": "2-x"}, 400, "a_steps: bad step selection"),
        ({"a": "base", "b": "slow", "b_steps": "0-99999999999"}, 400, "b_steps: bad step selection"),
        ({"a": "base", "b": "ba\0se"}, 400, "NUL byte"),
        ({"a": "broken", "b": "base"}, 422, "run 'broken': nothing readable in broken"),
        ({"a": "steps", "b": "base", "a_steps": "3"}, 422, "a: step 3 not in steps (profiled steps: 10-17)"),
        ({"a": "steps", "b": "steps", "a_steps": "10-12", "b_steps": "12-14"}, 422, "overlap (steps 12)"),
    ],
)
def test_what_cannot_be_diffed_is_a_4xx_with_a_message(tb, params, code, said):
    started = time.monotonic()
    got, body = _error(tb, **params)
    assert (got, said in body) == (code, True), body
    assert time.monotonic() - started < 10  # a huge step range is refused, not expanded


# -- the page -------------------------------------------------------------------------------------------------------
def _view(**params: str) -> str:
    """The page's #hash for a diff view, as index.js encodes it."""
    return urllib.parse.quote("diff=" + urllib.parse.urlencode(params), safe="")


def _text(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def _row(dom: str, name: str) -> str:
    """The table row of `name`, as HTML."""
    rows = [r for r in re.findall(r'<tr class="change [^"]*">.*?</tr>', dom) if f"{name}</td>" in r]
    assert len(rows) == 1, f"{len(rows)} rows named {name}"
    return rows[0]


def test_diff_view_renders_the_known_change(tb, logdir, chromium, tmp_path):
    url = f"{tb.url}data/plugin_entry.html?name=kprof#{_view(a='base', b='slow')}"
    dom = chromium(url, "--dump-dom")
    d = kprof.diff(logdir / "base", logdir / "slow")
    assert 'data-view="diff=a=base&amp;b=slow"' in dom
    assert _text(re.search(r'<p class="headline" id="diff-headline">(.*?)</p>', dom)[1]) == d.headline()
    step_time = _text(re.search(r'<p id="diff-step-time">(.*?)</p>', dom)[1])
    assert step_time.endswith(": B is slower.") and f"speedup {d.step_time.speedup:.3f}x" in step_time
    new = _row(dom, "my_new_kernel")
    assert 'class="change new"' in new and '<span class="badge new">new</span>' in new and ">new: 1 calls/step" in new
    slower = _row(dom, "aten::op25")
    assert f'<span style="color:{CHANGE_COLORS["increased"]}">increased</span>' in slower
    for title, kinds, _ in diff_report.GROUPS:
        rows = [c for c in d.changes if c.kind in kinds]
        assert (f"{title}: " in dom) == bool(rows)  # no labels in these traces: no table
        assert not rows or f"{title}: {sum(c.significant for c in rows)} of {len(rows)} significant" in dom
    timed = [c for c in d.significant() if c.kind != "count"]
    chart = dom[dom.index('id="diff-chart"') :]
    assert chart.count(f'fill="{CHANGE_COLORS["increased"]}"') == sum(c.change > 0 for c in timed) > 0
    assert chart.count(f'fill="{CHANGE_COLORS["decreased"]}"') == sum(c.change < 0 for c in timed)
    shot = tmp_path / "diff-view.png"
    chromium(url, f"--screenshot={shot}", "--window-size=1280,2200")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000


def test_findings_that_came_or_went_are_listed(tb, logdir, chromium):
    dom = chromium(f"{tb.url}data/plugin_entry.html?name=kprof#{_view(a='gelu', b='relu')}", "--dump-dom")
    d = kprof.diff(logdir / "gelu", logdir / "relu")
    assert d.diagnostics  # matmul_flops went away
    for x in d.diagnostics:
        assert f'data-kind="{x.kind}"><span class="badge">{x.change}</span>' in dom
    assert '<span class="badge gone">gone</span>' in _row(dom, "aten::gelu")


def test_comparison_links_to_the_diff_of_its_variants(tb, logdir, chromium):
    dom = chromium(f"{tb.url}data/plugin_entry.html?name=kprof#compare=ab", "--dump-dom")
    view = _view(a="ab/torch", b="ab/copy")
    assert re.search(rf'<p id="diff-links">The whole diff of each against torch: <a href="#{view}">copy</a>', dom)
    shown = chromium(f"{tb.url}data/plugin_entry.html?name=kprof#{view}", "--dump-dom")
    headline = kprof.diff(logdir / "ab" / "torch", logdir / "ab" / "copy").headline()
    assert _text(re.search(r'<p class="headline" id="diff-headline">(.*?)</p>', shown)[1]) == headline


HARNESS = """<!doctype html><meta charset="utf-8"><body><script type="module">
import {render} from './index.js';
const until = async (find) => {
  for (let i = 0; i < 600 && !find(); i++) await new Promise((done) => setTimeout(done, 50));
  return find();
};
await render();
const $ = (id) => document.getElementById(id);
const out = {before: [$('diff-a').value, $('diff-b').value, !!$('diff-headline')]};
$('diff-b').value = 'steps';
$('diff-a-steps').value = '14-17';
$('diff-b-steps').value = '10-13';
[...$('diff-form').querySelectorAll('button')].find((b) => b.textContent === 'Swap').click();
$('diff-form').requestSubmit();
out.headline = (await until(() => $('diff-headline'))).textContent;
out.view = document.querySelector('main').dataset.view;
out.hash = decodeURIComponent(location.hash.slice(1));
document.body.dataset.result = JSON.stringify(out);
</script>
"""


@pytest.fixture
def harness(tb, tmp_path):
    """The tab's page on a local server of its own, its plugin requests answered by the real TensorBoard: a page
    script can then drive the form."""
    for path in STATIC.iterdir():
        shutil.copy(path, tmp_path / path.name)
    (tmp_path / "harness.html").write_text(HARNESS)

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            if (tmp_path / self.path.lstrip("/").split("?")[0]).is_file():
                return super().do_GET()
            try:
                with urllib.request.urlopen(tb.url + PLUGIN + self.path.lstrip("/"), timeout=60) as response:
                    body = response.read()
            except urllib.error.HTTPError as err:  # the browser's favicon.ico
                return self.send_error(err.code)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(tmp_path)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/harness.html"
    server.shutdown()
    thread.join()


def test_the_form_picks_runs_and_steps_and_swaps_them(tb, harness, logdir, chromium):
    dom = chromium(f"{harness}#{_view(a='steps')}", "--dump-dom")
    out = json.loads(html.unescape(re.search(r'data-result="([^"]*)"', dom)[1]))
    other = next(r["run"] for r in tb.get_json(PLUGIN + "runs")["runs"] if r["run"] != "steps")
    assert out["before"] == ["steps", other, False]  # A from the view, B the first other run, nothing diffed yet
    assert out["view"] == out["hash"] == "diff=a=steps&b=steps&a_steps=10-13&b_steps=14-17"
    run = logdir / "steps"
    assert out["headline"] == kprof.diff(f"{run}@steps=10-13", f"{run}@steps=14-17").headline()
