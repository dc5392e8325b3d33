"""torch's own exporter writes a broken trace: no final-named file may be invalid JSON.

Seen for real (torch 2.13, ``with_stack=True``, the first ``record_function`` of a process inside a recorded
step): a python_function name read from stray memory, written without escaping, e.g.
``"name": "torch/profiler/_cupti_monitor.py(0):     \"\"\"",``. It happens in about half of such runs
(test_interrupt_faults' last test hits it), so these tests wrap the real exporter to break its output the
same way every time.
"""

from __future__ import annotations

import gzip as gzip_module
import json
import re
from pathlib import Path

import pytest
from torch.autograd import profiler as autograd_profiler

import kprof_callbacks as kprof
from kprof_callbacks import exporter

from faultkit import leftovers

STRAY_NAME = 'torch/profiler/_cupti_monitor.py(0):     """'
FIXTURES = Path(__file__).parents[1] / "fixtures"


@pytest.fixture
def broken_exporter(monkeypatch):
    """``broken_exporter(edit)``: torch's exporter runs, then ``edit(text) -> text`` damages what it wrote."""

    def install(edit):
        export = autograd_profiler.profile.export_chrome_trace

        def export_then_damage(self, path):
            export(self, path)
            with open(path, encoding="utf-8", errors="surrogateescape") as f:  # GPU traces may hold other bytes
                text = f.read()
            with open(path, "w", encoding="utf-8", errors="surrogateescape") as f:
                f.write(edit(text))

        monkeypatch.setattr(autograd_profiler.profile, "export_chrome_trace", export_then_damage)

    return install


def _stray_name(text: str) -> str:
    return re.sub(r'"name": "aten::addmm",', f'"name": "{STRAY_NAME}",', text, count=1)


@pytest.mark.parametrize("gzip", [False, True], ids=["json", "gzip"])
@pytest.mark.parametrize("validator", ["msgspec", "json-module"])
def test_unescaped_name_from_torch_is_escaped_and_the_trace_kept(
    tmp_path, train, told, check_traces, broken_exporter, monkeypatch, gzip, validator
):
    """The exporter writes a name with raw quotes: the trace is still written, as valid JSON holding that name."""
    if validator == "json-module":  # msgspec is optional (absent on the GPU machine): the json module checks
        monkeypatch.setattr(exporter, "msgspec", None)
    broken_exporter(_stray_name)
    with told() as messages:
        with kprof.session(tmp_path, run="r", wait=0, warmup=1, active=2, gzip=gzip) as s:
            train(s, 3)
    (path,) = check_traces(tmp_path)
    assert messages == [] and leftovers(tmp_path) == []
    text = path.read_bytes()
    names = {e["name"] for e in json.loads(gzip_module.decompress(text) if gzip else text)["traceEvents"]}
    assert STRAY_NAME in names


def test_trace_torch_broke_beyond_repair_is_dropped_with_one_warning(
    tmp_path, train, told, check_traces, broken_exporter
):
    """The exporter's JSON is broken outside any name: the capture is dropped with one warning, no file left behind."""
    broken_exporter(lambda text: text.replace('"ph": "X"', '"ph" "X"', 1))
    with told() as messages:
        with kprof.session(tmp_path, run="r", wait=0, warmup=1, active=1, repeat=2) as s:
            train(s, 4, after_step=lambda s: s.flush())
    assert s.steps == 4 and len(s.captures) == 2 and all(c.error for c in s.captures)
    assert check_traces(tmp_path) == [] and leftovers(tmp_path) == []
    assert len(messages) == 1 and "torch's exporter wrote invalid JSON" in messages[0], messages


def test_bytes_that_are_not_utf8_are_replaced_and_the_trace_kept(tmp_path, train, told, check_traces, broken_exporter):
    """A name with a byte that is not UTF-8 (a kernel name from stray memory): kept, readable, summarized."""
    broken_exporter(lambda text: text.replace('"name": "aten::addmm"', '"name": "addmm\udce9"', 1))
    with told() as messages:
        with kprof.session(tmp_path, run="r", wait=0, warmup=1, active=2) as s:
            train(s, 3)
    (path,) = check_traces(tmp_path)
    assert messages == [] and b"\xe9" not in path.read_bytes()
    assert "addmm\ufffd" in {e["name"] for e in json.loads(path.read_bytes())["traceEvents"]}
    assert s.summary().files == [path]


@pytest.mark.parametrize("fixture", ["gpu_small.pt.trace.json.gz", "gpu_mlp_h100.pt.trace.json.gz"])
def test_a_stray_name_is_repaired_in_both_layouts_torch_writes(tmp_path, fixture):
    """torch 2.11's kineto writes `"ph": "X", "cat": ..., "name": "...", "pid": ...` on one line (the GPU machine):
    the repair that only knew one-field-per-line lines dropped every such capture there."""
    text = gzip_module.decompress((FIXTURES / fixture).read_bytes()).decode()
    broken = re.sub(r'"name": "aten::[a-z_]+"', f'"name": "{STRAY_NAME}"', text, count=1)
    assert broken != text
    path = tmp_path / "t.pt.trace.json"
    path.write_text(broken)
    exporter.check_json(path)
    names = {e.get("name") for e in json.loads(path.read_text())["traceEvents"]}
    assert STRAY_NAME in names
