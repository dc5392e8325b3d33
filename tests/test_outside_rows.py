"""Time outside operators is a row of every diff: the host time between operators, GPU idle and data loading per
step, named by the gate (with its share of the change) when it is what grew."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kprof_callbacks.analysis import diff, summarize
from kprof_callbacks.analysis.outside import BETWEEN_OPS, DATA_LOADING, GPU_IDLE
from kprof_callbacks.cli import main

FIXTURES = Path(__file__).parent / "fixtures"
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def host_trace(path: Path, steps: list[list[tuple[str | None, float]]], *, label: str | None = None) -> Path:
    """Step i runs ``steps[i]`` back to back in ``ProfilerStep#i``: (operator name, us), or (None, us) for time in no
    operator (a sleep); with ``label``, one label around each step's work."""
    events, t = [], 0.0
    for i, items in enumerate(steps):
        start = t
        for name, dur in items:
            if name is not None:
                events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": t, "dur": dur})
            t += dur
        if label:
            events.append({"ph": "X", "cat": "user_annotation", "name": label, "pid": 1, "tid": 1, "ts": start,
                           "dur": t - start})  # fmt: skip
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "pid": 1, "tid": 1,
                       "ts": start, "dur": t - start})  # fmt: skip
        t += 10.0
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def _row(summary, name: str) -> np.ndarray:
    table = summary.per_step
    (i,) = [k for k, (kind, n) in enumerate(zip(table.kind, table.name)) if kind == "step" and n == name]
    return table.time_us[i]


def test_time_between_operators_is_the_step_less_its_operators_and_labels(tmp_path):
    steps = [[("aten::mm", 100.0), (None, 40.0 + 10 * i), ("aten::add", 50.0), (None, 5.0)] for i in range(4)]
    s = summarize(host_trace(tmp_path / "t.pt.trace.json", steps))
    assert _row(s, BETWEEN_OPS).tolist() == [45.0, 55.0, 65.0, 75.0]
    assert GPU_IDLE not in s.per_step.name and DATA_LOADING not in s.per_step.name  # no GPU, no data loading
    labelled = summarize(host_trace(tmp_path / "l.pt.trace.json", steps, label="forward"))
    assert _row(labelled, BETWEEN_OPS).tolist() == [0.0] * 4  # a label covers the gaps: time inside a label


def test_gpu_idle_and_data_loading_are_rows_of_a_gpu_trace(tmp_path):
    s = summarize(FIXTURES / "gpu_small.pt.trace.json.gz")
    assert _row(s, GPU_IDLE).tolist() == pytest.approx([r.gpu_idle_us for r in s.steps], abs=1e-3)
    assert (_row(s, BETWEEN_OPS) > 0).all()
    steps = [[("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 30.0 * (i + 1)), ("aten::mm", 100.0)]
             for i in range(3)]  # fmt: skip
    loaded = summarize(host_trace(tmp_path / "d.pt.trace.json", steps))
    assert _row(loaded, DATA_LOADING).tolist() == [30.0, 60.0, 90.0]


def _sleepy(path: Path, rng: np.random.Generator, sleep_us: float, n: int = 10) -> Path:
    ops = {f"aten::op{k}": us for k, us in enumerate(np.geomspace(50, 3000, 12))}
    steps = []
    for _ in range(n):
        items: list[tuple[str | None, float]] = [(name, us * rng.lognormal(0, 0.1)) for name, us in ops.items()]
        items.insert(6, (None, (200.0 + sleep_us) * rng.lognormal(0, 0.02)))  # Python between the operators
        steps.append(items)
    return host_trace(path, steps)


def test_the_gate_names_time_outside_operators_with_its_share(tmp_path, capsys):
    """A step body that sleeps 100 ms outside any operator: the gate fails and names the time between operators
    first, with at least 90% of the change in mean step time explained (not a 10 us operator at 0.0%)."""
    rng = np.random.default_rng(1)
    a, b = _sleepy(tmp_path / "a.pt.trace.json", rng, 0.0), _sleepy(tmp_path / "b.pt.trace.json", rng, 100_000.0)
    assert main(["diff", str(a), str(b), "--fail-if-slower", "5"]) == 3
    gate = capsys.readouterr().out.split("\n\n")[-1]
    grew = gate.split("What grew, largest share of the change in mean step time first: ")[1]
    first = re.match(r"(.+?) \+\S+ (?:us|ms|s) per step \(increased, (\d+)%\)", grew)
    assert first[1] == BETWEEN_OPS and int(first[2]) >= 90
    assert int(re.search(r"the rows that grew explain (\d+)% of it together", grew)[1]) >= 90
    d = diff(a, b)
    row = next(c for c in d.significant() if c.name == BETWEEN_OPS)
    assert row.kind == "step" and d.share_of_step_change(row) >= 0.9
    assert BETWEEN_OPS in d.headline().split("Accounting for it")[1].split(";")[0]


def test_a_summary_saved_without_step_rows_is_diffed_without_them(tmp_path):
    rng = np.random.default_rng(2)
    a, b = _sleepy(tmp_path / "a.pt.trace.json", rng, 0.0), _sleepy(tmp_path / "b.pt.trace.json", rng, 0.0)
    doc = summarize(a).to_dict()
    table = doc["per_step"]
    keep = [i for i, kind in enumerate(table["kind"]) if kind != "step"]
    for key in ("kind", "name", "time_us", "calls"):
        table[key] = [table[key][i] for i in keep]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(doc))
    kinds = {c.kind for c in diff(old, b).changes}
    assert "step" not in kinds and "step" in {c.kind for c in diff(a, b).changes}  # never "new" for want of a row


@pytest.mark.slow
def test_a_sleep_in_the_plain_loop_is_named_by_the_gate(tmp_path):
    """examples/plain_loop.py, and a copy whose step sleeps 100 ms after the optimizer: `kprof diff base slow
    --fail-if-slower 5` fails and names the time between operators first, with >= 90% of the change explained."""
    source = (EXAMPLES / "plain_loop.py").read_text()
    body = "            s.step(samples=BATCH, flops=flops)"
    assert body in source
    slow = tmp_path / "slow_loop.py"
    slow.write_text(
        source.replace(body, "            time.sleep(0.1)\n" + body).replace(
            "import torch\n", "import time\n\nimport torch\n", 1
        )
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    for name, script in (("base", EXAMPLES / "plain_loop.py"), ("slow", slow)):
        done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
        shutil.move(tmp_path / "log" / "plain-loop", tmp_path / name)
    done = subprocess.run(
        [sys.executable, "-m", "kprof_callbacks", "diff", "base", "slow", "--fail-if-slower", "5"],
        cwd=tmp_path, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 3, done.stdout[-3000:] + done.stderr[-3000:]
    grew = done.stdout.split("What grew, largest share of the change in mean step time first: ")[1]
    first = re.match(r"(.+?) \+\S+ (?:us|ms|s) per step \(increased, (\d+)%\)", grew)
    assert first[1] == BETWEEN_OPS, grew  # the largest share (93% on a quiet machine; the rest: cold caches)
    assert int(re.search(r"the rows that grew explain (\d+)% of it together", grew)[1]) >= 90


def test_gpu_idle_is_named_right_after_the_host_time_that_made_the_gpu_wait():
    """On a GPU a sleep in the step grows GPU idle as much as the time between operators (more: cold caches after
    it): the host's row, the cause, is named first, GPU idle after it, other rows by their share."""
    from types import SimpleNamespace

    from kprof_callbacks.analysis.explain import explain

    def rows(shares: dict[str, float]) -> SimpleNamespace:
        changes = [SimpleNamespace(kind="op" if n.startswith("aten") else "step", name=n) for n in shares]
        return SimpleNamespace(significant=lambda: changes, share_of_step_change=lambda c: shares[c.name])

    gpu = {GPU_IDLE: 0.98, "aten::mm": 0.30, BETWEEN_OPS: 0.85, "aten::add": 0.9}
    assert [c.name for c in explain(rows(gpu), top=4).rows] == ["aten::add", BETWEEN_OPS, GPU_IDLE, "aten::mm"]
    alone = {GPU_IDLE: 0.98, "aten::mm": 0.30}  # no host time grew: GPU idle by its own share
    assert [c.name for c in explain(rows(alone), top=4).rows] == [GPU_IDLE, "aten::mm"]
