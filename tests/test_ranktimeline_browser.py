"""The timeline of all ranks in headless Chromium: timeline.js drawing the plugin's /ranktimeline answer, and the kprof
tab's section around it, on a recorded 4-rank run.

The fixture (tests/fixtures/ddp4_cpu) is examples/ddp_loop.py on 4 gloo processes with rank 2 computing 40 ms more
each step, recorded with

    torchrun --standalone --nproc_per_node=4 examples/ddp_loop.py --steps 12 --width 64 --straggler 2:40

(OMP_NUM_THREADS=1, CUDA_VISIBLE_DEVICES=""; traces renamed rank<R>_hosta_<100+R> and gzipped). The tests move ranks 2
and 3 to another host whose clock reads 3.7 s more: drawn on one clock, each collective must still overlap on every
rank.
"""

from __future__ import annotations

import functools
import gzip
import http.server
import json
import re
import shutil
import threading
from html import unescape
from pathlib import Path

import pytest

import kprof_callbacks as kprof
from kprof_callbacks.analysis import breakdown
from kprof_callbacks.analysis.ranktimeline import RunSlices
from kprof_callbacks.analysis.svgtimeline import STRAGGLER
from kprof_callbacks.tensorboard.plugin import STATIC

FIXTURE = Path(__file__).parent / "fixtures" / "ddp4_cpu"
SHIFT_US = 3.7e6

HARNESS = """<!doctype html><meta charset="utf-8"><link rel="stylesheet" href="style.css">
<body style="margin:0;width:1200px"><script type="module">
import {timelineView} from './timeline.js';
const data = await (await fetch('ranks.json')).json();
const root = timelineView(data, await (await fetch('colors.json')).json());
document.body.append(root);
const view = root.view, canvas = root.querySelector('canvas');
view.scroll = 0;
view.draw();
const ctx = canvas.getContext('2d'), ratio = window.devicePixelRatio || 1;
const pixel = (x, y) => Array.from(ctx.getImageData(Math.round(x * ratio), Math.round(y * ratio), 1, 1).data);
const ev = data.events, out = {width: canvas.clientWidth, ranks: {}, collectives: {}, margin: {}};
for (const r of data.ranks) {
  const lanes = new Set(Array.from({length: r.lanes}, (_, k) => r.first_lane + k));
  const mine = ev.lane.map((lane, i) => [lane, i]).filter(([lane]) => lanes.has(lane)).map(([, i]) => i);
  out.ranks[r.rank] = mine.filter((i) => view.eventAt(...view.position(i)) >= 0).length;
  out.margin[r.rank] = pixel(1, view.position(mine[0])[1]);
}
const X = (t) => 200 + ((t - view.t0) / (view.t1 - view.t0)) * (canvas.clientWidth - 200); // GUTTER: 200 px
ev.coll.forEach((c, i) => {
  if (c < 0) return;
  const x0 = X(ev.start[i]), x1 = X(ev.start[i] + ev.dur[i]), y = view.position(i)[1];
  (out.collectives[c] ||= []).push({x0, x1, waited: X(ev.start[i] + ev.wait[i]) - x0, start: pixel(x0 + 1, y)});
});
const some = ev.coll.findIndex((c) => c >= 0);
canvas.dispatchEvent(new MouseEvent('mousemove', {clientX: canvas.getBoundingClientRect().left + view.position(some)[0],
  clientY: canvas.getBoundingClientRect().top + view.position(some)[1], bubbles: true}));
out.tip = root.querySelector('.timeline-tip').textContent;
document.body.dataset.result = JSON.stringify(out);
</script>
"""


def _two_hosts(folder: Path) -> Path:
    """The fixture with ranks 2 and 3 on another host, whose clock reads SHIFT_US more."""
    folder.mkdir()
    for trace in FIXTURE.glob("*.pt.trace.json.gz"):
        doc = json.loads(gzip.decompress(trace.read_bytes()))
        name = trace.name
        if name.startswith(("rank2_", "rank3_")):
            for e in doc["traceEvents"]:
                if "ts" in e:
                    e["ts"] += SHIFT_US
            name = name.replace("_hosta_", "_hostb_")
        (folder / name.removesuffix(".gz")).write_text(json.dumps(doc))
    return folder


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory) -> Path:
    return _two_hosts(tmp_path_factory.mktemp("ranks") / "ddp4")


@pytest.fixture(scope="module")
def served(tmp_path_factory, two_hosts):
    """The static files, the harness and the median step of the 4 ranks on a local HTTP server."""
    root = tmp_path_factory.mktemp("ranks-page")
    for name in ("timeline.js", "charts.js", "style.css"):
        shutil.copy(STATIC / name, root / name)
    s = kprof.summarize(two_hosts)
    run = RunSlices(s.files)
    data = run.step(run.default_step(), skew=s.step_skew).to_dict()
    (root / "ranks.json").write_text(json.dumps(data))
    (root / "colors.json").write_text(json.dumps(breakdown.KIND_COLORS))
    (root / "index.html").write_text(HARNESS)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/index.html", data
    server.shutdown()
    thread.join()


def _result(dom: str) -> dict:
    match = re.search(r'data-result="([^"]*)"', dom)
    assert match, "the harness did not finish: " + dom[-2000:]
    return json.loads(unescape(match[1]))


def _rgb(hex_color: str) -> list[int]:
    return [int(hex_color[k : k + 2], 16) for k in (1, 3, 5)]


def test_every_rank_drawn_collectives_aligned_and_the_straggler_marked(served, chromium):
    url, data = served
    out = _result(chromium(url, "--dump-dom", "--window-size=1200,900"))
    assert data["straggler"]["rank"] == 2 and data["late"]["rank"] == 2
    assert sorted(out["ranks"]) == ["0", "1", "2", "3"] and all(n > 0 for n in out["ranks"].values())
    assert data["collectives"] and set(out["collectives"]) == {str(k) for k in range(len(data["collectives"]))}
    for k, spans in out["collectives"].items():
        color = _rgb(data["collectives"][int(k)]["color"])
        assert len(spans) == 4  # every rank ran it
        assert max(s["x0"] for s in spans) < min(s["x1"] for s in spans)  # one clock: all four overlap
        for s in spans:  # in the collective's colour, darker where its rank waited for the last one
            if s["waited"] > 3:
                assert sum(s["start"][:3]) < sum(color) - 60
            elif s["waited"] == 0:
                assert s["start"][:3] == color
    assert any(s["waited"] > 3 for spans in out["collectives"].values() for s in spans)
    assert out["margin"]["2"][:3] == _rgb(STRAGGLER)
    assert all(out["margin"][r][:3] != _rgb(STRAGGLER) for r in ("0", "1", "3"))
    assert "all_reduce #1 of step" in out["tip"] and ("waited" in out["tip"] or "arrived last" in out["tip"])


def test_screenshot_of_four_ranks(served, chromium, tmp_path):
    url, _ = served
    shot = tmp_path / "ranks.png"
    chromium(url, f"--screenshot={shot}", "--window-size=1200,420")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000


@pytest.fixture(scope="module")
def tb(tmp_path_factory, two_hosts, group_leftovers):
    from kprof_callbacks.tensorboard.launch import TensorBoardServer

    logdir = tmp_path_factory.mktemp("ranks-logdir")
    shutil.copytree(two_hosts, logdir / "ddp4")
    with TensorBoardServer(logdir) as server:
        yield server, logdir
    assert not group_leftovers(server.pid)


def _get(server, **params) -> tuple[int, bytes]:
    import urllib.error
    import urllib.parse
    import urllib.request

    url = f"{server.url}data/plugin/kprof/ranktimeline?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_route_serves_the_merged_step_and_refuses_bad_input(tb):
    server, logdir = tb
    code, body = _get(server, run="ddp4")
    assert code == 200
    data = json.loads(body)
    s = kprof.summarize(logdir / "ddp4")
    run = RunSlices(s.files)
    want = json.loads(json.dumps(run.step(run.default_step(), skew=s.step_skew).to_dict()))
    assert {k: data[k] for k in want} == want and not data["collapsed"]
    assert [w["step"] for w in data["steps"]] == [n for n, _ in run.steps()]
    code, body = _get(server, run="ddp4", step=str(data["steps"][0]["step"]), cpu="1")
    assert code == 200 and json.loads(body)["step"] == data["steps"][0]["step"]
    assert _get(server, run="ddp4", cpu="yes")[0] == 400
    assert _get(server, run="ddp4", step="x")[0] == 400
    assert _get(server, run="ddp4", step="999")[0] == 404
    assert _get(server, run="nope")[0] == 404


def test_tab_shows_every_rank_on_one_clock(tb, chromium):
    server, _ = tb
    dom = chromium(f"{server.url}data/plugin_entry.html?name=kprof#run=ddp4", "--dump-dom")
    view = dom[dom.index("All ranks on one clock") :]
    assert 'id="rank-timeline"' in view and "<canvas" in view
    marks = re.search(r'id="rank-marks">([^<]*)<', view)
    assert marks and "straggler: rank 2" in marks[1]
    assert "2 hosts, their clocks aligned: hosta (ranks 0, 1), hostb (ranks 2, 3)" in marks[1]
