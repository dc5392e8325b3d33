"""The kprof tab's memory view: the /memory route against kprof.summarize of the same files, and the page in headless
Chromium drawing the step's memory curve, what was alive at its peak by kind and module, and a CUDA allocator
snapshot's summary (read by kprof's reader, never sent to the page)."""

from __future__ import annotations

import json
import re
import sys
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


def test_a_big_snapshot_is_shown_by_its_end_state_until_its_history_is_read(logdir, tmp_path, monkeypatch):
    """A snapshot over the threshold, its read held: /memory answers at once with its end state marked partial (what
    the full read says of the end, no peak); once the read ends, the full summary takes its place."""
    import shutil
    import threading

    from tensorboard.plugins import base_plugin
    from werkzeug.test import Client
    from werkzeug.wrappers import Response

    from kprof_callbacks.analysis import snapshot
    from kprof_callbacks.tensorboard import plugin, snapshots

    run = tmp_path / "log" / "mem"
    shutil.copytree(logdir / "mem", run, ignore=shutil.ignore_patterns("*" + snapshot.SUMMARY_SUFFIX))
    monkeypatch.setattr(snapshots, "PROGRESS_BYTES", 0)
    release, real = threading.Event(), snapshot.summarize
    monkeypatch.setattr(snapshot, "summarize", lambda path, progress=None: release.wait(60) and real(path, progress))
    route = plugin.KprofPlugin(base_plugin.TBContext(logdir=str(run.parent), data_provider=None)).get_plugin_apps()

    def memory() -> dict:
        return json.loads(Client(route["/memory"], Response).get("/memory", query_string={"run": "mem"}).data)

    (first,) = memory()["memory"]["snapshots"]
    assert first["partial"] and first["reading"] == {"done": 0, "total": first["bytes"]}
    assert "peak" not in first["devices"][0] and first["devices"][0]["end_sites"]
    release.set()
    for thread in [t for t in threading.enumerate() if t.name.startswith("kprof w.memory_snapshot")]:
        thread.join(60)
    (full,) = memory()["memory"]["snapshots"]
    assert "reading" not in full and "partial" not in full and full["devices"][0]["peak"] > 0
    end = {k: v for k, v in full["devices"][0].items() if k in first["devices"][0]}
    assert first["devices"][0] == end  # the end state drawn first is what the full read says of the end
