"""The kprof tab's memory view: the /memory route against kprof.summarize of the same files, and the page in headless
Chromium drawing the step's memory curve, what was alive at its peak by kind and module, and a CUDA allocator
snapshot's summary (read by kprof's reader, never sent to the page)."""

from __future__ import annotations

import json
import mimetypes
import re
import shutil
import sys
import threading
from html import unescape
from pathlib import Path

import pytest

import kprof_callbacks as kprof
from kprof_callbacks.tensorboard.launch import TensorBoardServer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from memory_view import synthetic_snapshot  # noqa: E402
from test_memory import _train  # noqa: E402

PLUGIN = "data/plugin/kprof/"


@pytest.fixture(scope="module")
def logdir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tb-memory").resolve()
    _train(root, "mem")
    synthetic_snapshot(root / "mem" / "w.memory_snapshot.pickle", 2_000_000)
    return root


@pytest.fixture(scope="module")
def tb(logdir, group_leftovers):
    with TensorBoardServer(logdir) as server:
        yield server
    assert not group_leftovers(server.pid), "TensorBoard left processes behind"


def test_the_memory_route_is_the_runs_summarized_memory(tb, logdir):
    data = tb.get_json(PLUGIN + "memory", run="mem")
    expected = json.loads(json.dumps(kprof.summarize(logdir / "mem").memory.to_dict()))
    assert data == {"run": "mem", "memory": expected}
    (snapshot,) = data["memory"]["snapshots"]
    assert snapshot["devices"][0]["entries"] > 1000 and snapshot["bytes"] < 4_000_000  # a summary, not the pickle


def test_a_run_without_memory_events_has_none(tb, logdir):
    with kprof.session(logdir, run="plain", wait=0, warmup=0, active=1, scalars=False) as s:
        s.step()
    assert tb.get_json(PLUGIN + "memory", run="plain") == {"run": "plain", "memory": None}


def test_the_page_draws_the_peak_and_the_snapshot(tb, chromium):
    dom = chromium(f"{tb.url}data/plugin_entry.html?name=kprof#run=mem", "--dump-dom")
    section = dom[dom.index('<div id="memory">') :]
    text = re.sub(r"<[^>]+>", " ", unescape(section))
    assert 'id="memory-curve"' in section and "<polyline" in section and 'id="memory-kinds"' in section
    assert re.search(r"Step \d+ \(the median of 3 by peak\): [\d.]+ MB allocated at [\d.]+ ms, in backward", text)
    assert "activations" in text and "blocks.0" in text and "Largest blocks at the peak" in text
    assert "CUDA allocator snapshot w.memory_snapshot.pickle" in text
    assert re.search(r"Device 0: [\d,]+ events; peak [\d.]+ MB allocated", text)
    assert 'class="snapshot-curve"' in section and "train.py:" in text  # the program's own lines hold the peak


def test_screenshot_of_the_memory_view(tb, chromium, tmp_path):
    shot = tmp_path / "memory.png"
    chromium(f"{tb.url}data/plugin_entry.html?name=kprof#run=mem", f"--screenshot={shot}", "--window-size=1280,2600")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


class Held:
    """The plugin on a copy of the run ``mem`` without its snapshot's summary, the snapshot counted as big and its
    read held until ``release()``, which returns once the read ended."""

    def __init__(self, logdir: Path, tmp_path: Path, monkeypatch) -> None:
        from tensorboard.plugins import base_plugin

        from kprof_callbacks.analysis import snapshot
        from kprof_callbacks.tensorboard import plugin, snapshots

        run = tmp_path / "log" / "mem"
        shutil.copytree(logdir / "mem", run, ignore=shutil.ignore_patterns("*" + snapshot.SUMMARY_SUFFIX))
        monkeypatch.setattr(snapshots, "PROGRESS_BYTES", 0)
        self._event, real = threading.Event(), snapshots.summarize_apart
        monkeypatch.setattr(
            snapshots, "summarize_apart", lambda p, progress: self._event.wait(60) and real(p, progress)
        )
        self.routes = plugin.KprofPlugin(base_plugin.TBContext(logdir=str(run.parent), data_provider=None))
        self.routes = self.routes.get_plugin_apps()

    def memory(self) -> dict:
        from werkzeug.test import Client
        from werkzeug.wrappers import Response

        return json.loads(Client(self.routes["/memory"], Response).get("/memory", query_string={"run": "mem"}).data)

    def release(self) -> None:
        self._event.set()
        for thread in [t for t in threading.enumerate() if t.name.startswith("kprof w.memory_snapshot")]:
            thread.join(60)


def test_a_big_snapshot_is_shown_by_its_end_state_until_its_history_is_read(logdir, tmp_path, monkeypatch):
    """A snapshot over the threshold, its read held: /memory answers at once with its end state marked partial (what
    the full read says of the end, no peak); once the read ends, the full summary takes its place."""
    held = Held(logdir, tmp_path, monkeypatch)
    (first,) = held.memory()["memory"]["snapshots"]
    assert first["partial"] and first["reading"] == {"done": 0, "total": first["bytes"]}
    assert "peak" not in first["devices"][0] and first["devices"][0]["end_sites"]
    held.release()
    (full,) = held.memory()["memory"]["snapshots"]
    assert "reading" not in full and "partial" not in full and full["devices"][0]["peak"] > 0
    end = {k: v for k, v in full["devices"][0].items() if k in first["devices"][0]}
    assert first["devices"][0] == end  # the end state drawn first is what the full read says of the end


def test_the_tab_reads_a_snapshot_in_a_process_of_its_own(logdir, tmp_path, monkeypatch):
    """summarize_apart: the summary this process would make, read by another (this one's reader fails if called),
    its progress told as it goes, kept here where it cannot be saved beside; the reader's reason where it fails."""
    from kprof_callbacks.analysis import pickles, snapshot

    path = tmp_path / "w.memory_snapshot.pickle"
    shutil.copy(logdir / "mem" / path.name, path)
    expected = {**snapshot.summarize(shutil.copy(path, tmp_path / "copy.pickle")), "path": str(path)}
    (tmp_path / f"{path.name}{snapshot.SUMMARY_SUFFIX}").mkdir()  # where the summary would be saved: not writable
    monkeypatch.setattr(pickles, "read", lambda *a: pytest.fail("read in the tab's own process"))
    done: list[int] = []
    assert snapshot.summarize_apart(path, done.append) == expected
    assert done == sorted(done) and 0.9 * path.stat().st_size < done[-1] <= path.stat().st_size
    assert snapshot.snapshot_known(path) and snapshot.summarize(path) == expected  # kept by this process
    (tmp_path / "not.pickle").write_bytes(b"no pickle")
    with pytest.raises(ValueError, match=r"^PickleError: not a pickle \(no PROTO opcode at its start\)$"):
        snapshot.summarize_apart(tmp_path / "not.pickle", done.append)


HARNESS = """<!doctype html><meta charset="utf-8"><body><script type="module">
import {getJSON} from './dom.js';
import {memorySection} from './memory.js';
const until = async (find) => {
  for (let i = 0; i < 600 && !find(); i++) await new Promise((done) => setTimeout(done, 50));
  return find();
};
document.body.append(memorySection('mem', (await getJSON('runs')).legend));
const text = () => document.getElementById('memory').textContent;
const partial = await until(() => document.querySelector('.snapshot-partial'));
const out = {partial: partial && text(), curve_while_partial: !!document.querySelector('.snapshot-curve')};
await fetch('release');
out.full = !!(await until(() => document.querySelector('.snapshot-curve')));
out.then = text();
document.body.dataset.result = JSON.stringify(out);
</script>
"""


def test_the_page_draws_the_end_state_while_the_history_is_read_then_the_full_view(
    logdir, tmp_path, chromium, monkeypatch
):
    """memory.js in Chromium against the plugin with the snapshot's read held: the end state marked partial first;
    the page asks again, and once the read ends (the page's /release) draws the full view in its place."""
    from werkzeug.serving import make_server
    from werkzeug.wrappers import Request, Response

    from kprof_callbacks.tensorboard.plugin import STATIC

    held = Held(logdir, tmp_path, monkeypatch)

    @Request.application
    def app(request: Request):
        name = request.path.strip("/")
        if name == "release":
            held.release()
            return Response("{}", mimetype="application/json")
        if name == "harness.html":
            return Response(HARNESS, mimetype="text/html")
        if (STATIC / name).is_file():
            return Response((STATIC / name).read_bytes(), mimetype=mimetypes.guess_type(name)[0])
        return held.routes["/" + name]

    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        dom = chromium(f"http://127.0.0.1:{server.port}/harness.html", "--dump-dom")
    finally:
        server.shutdown()
        thread.join()
    out = json.loads(unescape(re.search(r'data-result="([^"]*)"', dom)[1]))
    assert re.search(r"History still being read: 0\.0%\. Shown meanwhile: the end state", out["partial"])
    assert "Device 0 at the end: " in out["partial"] and "train.py:" in out["partial"]
    assert not out["curve_while_partial"] and out["full"]
    assert "still being read" not in out["then"] and re.search(r"Device 0: [\d,]+ events; peak [\d.]+ MB", out["then"])
