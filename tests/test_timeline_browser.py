"""The tab's timeline (static/timeline.js) in headless Chromium, driven like a user drives it.

A page served from 127.0.0.1 loads timeline.js with one step of the recorded H100 trace (as the plugin's /timeline
route serves it), then dispatches wheel, drag, hover, click and double-click events on the canvas and writes what
the view did into the DOM, which the test reads from Chromium's --dump-dom. A screenshot shows the hovered kernel
with its launch arrow and tooltip.
"""

from __future__ import annotations

import functools
import http.server
import json
import re
import shutil
import threading
from html import unescape
from pathlib import Path

import pytest

from kprof_callbacks.analysis import breakdown
from kprof_callbacks.analysis.slices import TraceSlices
from kprof_callbacks.tensorboard.plugin import STATIC

H100 = Path(__file__).parent / "fixtures" / "gpu_mlp_h100.pt.trace.json.gz"

HARNESS = """<!doctype html><meta charset="utf-8"><link rel="stylesheet" href="style.css">
<body style="margin:0;width:1200px"><script type="module">
import {timelineView} from './timeline.js';
const data = await (await fetch('slice.json')).json();
const root = timelineView(data, await (await fetch('colors.json')).json());
document.body.append(root);
root.view.draw(); // headless Chromium's --dump-dom runs no rendering step, so no ResizeObserver callback
const view = root.view, canvas = root.querySelector('canvas'), box = canvas.getBoundingClientRect();
const at = ([x, y]) => ({clientX: box.left + x, clientY: box.top + y, bubbles: true, cancelable: true});
const click = (pos) => ['mousedown', 'mouseup', 'click']
  .forEach((t) => canvas.dispatchEvent(new MouseEvent(t, at(pos))));
const out = {width: canvas.clientWidth, drawn: view.drawn, whole: [view.t0, view.t1]};
canvas.dispatchEvent(new WheelEvent('wheel', {...at([700, 60]), deltaY: -400}));
out.zoomed = [view.t0, view.t1];
canvas.dispatchEvent(new MouseEvent('mousedown', at([700, 60])));
canvas.dispatchEvent(new MouseEvent('mousemove', at([600, 60])));
canvas.dispatchEvent(new MouseEvent('mouseup', at([600, 60])));
canvas.dispatchEvent(new MouseEvent('click', at([600, 60])));
out.panned = [view.t0, view.t1, view.selected];
view.show(0, data.span_ns);
const kernel = KERNEL;
canvas.dispatchEvent(new MouseEvent('mousemove', at(view.position(kernel))));
const tip = root.querySelector('.timeline-tip');
out.hover = [view.hover, tip.hidden, tip.textContent];
click(view.position(kernel));
out.details = root.querySelector('.timeline-details').textContent;
canvas.dispatchEvent(new MouseEvent('dblclick', at(view.position(kernel))));
out.dblclick = [view.t0, view.t1];
view.show(0, data.span_ns);
canvas.dispatchEvent(new MouseEvent('mousemove', at(view.position(kernel))));
document.body.dataset.result = JSON.stringify(out);
</script>
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The static files, the harness and one step of the H100 trace, on a local HTTP server; yields (url, slice)."""
    root = tmp_path_factory.mktemp("timeline-page")
    for name in ("timeline.js", "charts.js", "style.css"):
        shutil.copy(STATIC / name, root / name)
    piece = TraceSlices.read(H100).step(3).to_dict()
    events = piece["events"]
    kernels = [i for i, k in enumerate(events["kind"]) if piece["kinds"][k] == "kernel" and events["link"][i] >= 0]
    kernel = max(kernels, key=lambda i: events["dur"][i])  # the longest launched kernel: easy to point at
    (root / "slice.json").write_text(json.dumps(piece))
    (root / "colors.json").write_text(json.dumps(breakdown.KIND_COLORS))
    (root / "index.html").write_text(HARNESS.replace("KERNEL", str(kernel)))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/index.html", piece, kernel
    server.shutdown()
    thread.join()


def _result(dom: str) -> dict:
    match = re.search(r'data-result="([^"]*)"', dom)
    assert match, "the harness did not finish: " + dom[-2000:]
    return json.loads(unescape(match[1]))


def test_wheel_drag_hover_click_and_double_click(served, chromium):
    url, piece, kernel = served
    out = _result(chromium(url, "--dump-dom"))
    events = piece["events"]
    assert out["drawn"] > 50 and out["whole"] == [0, piece["span_ns"]]
    t0, t1 = out["zoomed"]
    assert 0 < t1 - t0 < piece["span_ns"] / 2  # zoomed in, around the pointer
    plot = out["width"] - 200
    pointer_time = out["whole"][0] + (700 - 200) / plot * piece["span_ns"]
    assert t0 < pointer_time < t1 and abs((pointer_time - t0) / (t1 - t0) - (700 - 200) / plot) < 1e-6
    p0, p1, selected = out["panned"]
    assert p1 - p0 == pytest.approx(t1 - t0) and p0 == pytest.approx(t0 + 100 / plot * (t1 - t0))  # dragged left
    assert selected == -1  # the click that ends a drag selects nothing
    hovered, hidden, tip = out["hover"]
    name = piece["names"][events["name"][kernel]]
    launch = piece["names"][events["name"][events["link"][kernel]]]
    assert hovered == kernel and not hidden
    assert tip.startswith(name) and "kernel on GPU 0 stream 7" in tip and f"launched by {launch}" in tip
    assert name in out["details"] and f"launched by {launch}" in out["details"]
    start, dur = events["start"][kernel], events["dur"][kernel]
    assert out["dblclick"] == pytest.approx([start - 0.1 * dur, start + 1.1 * dur], abs=1001)


def test_screenshot_of_a_hovered_kernel(served, chromium, tmp_path):
    url, piece, kernel = served
    shot = tmp_path / "timeline.png"
    chromium(url, f"--screenshot={shot}", "--window-size=1200,700")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
