"""The machine as evidence: a session samples what the machine did every few steps (CPU wait, load, context switches;
GPU clocks, throttling, other processes through NVML), a summary says when a run was starved or throttled and which
steps, and a diff or gate tells a busier machine's uniform slowdown from a code regression (exit status 4)."""

from __future__ import annotations

import ctypes
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import kprof_callbacks as kprof
from kprof_callbacks import exits, layout, machine
from kprof_callbacks.analysis import Summary, diff
from kprof_callbacks.analysis import machine as evidence
from kprof_callbacks.analysis.perstep import PerStep
from kprof_callbacks.analysis.series import Series, read_series
from kprof_callbacks.analysis.tables import StepStats
from kprof_callbacks.cli import main

TAGS = layout.MACHINE_TAGS


def test_a_session_samples_the_machine_every_few_steps(tmp_path):
    with kprof.session(tmp_path, run="m", wait=1, warmup=1, active=2) as s:
        for _ in range(3 * machine.MACHINE_EVERY + 1):
            torch.ones(64).sum()
            s.step()
    (tags,) = read_series(s.run_dir).values()
    every = machine.MACHINE_EVERY
    assert tags[TAGS["cpus"]].steps.tolist() == [0]
    assert tags[TAGS["cpu_per_wall"]].steps.tolist() == [every, 2 * every, 3 * every]  # rates since the last sample
    assert tags[TAGS["load1"]].steps.tolist() == [0, every, 2 * every, 3 * every]
    assert (tags[TAGS["cpu_wait"]].values >= 0).all() and (tags[TAGS["involuntary_switches"]].values >= 0).all()
    if not torch.cuda.is_available():  # no GPU evidence, and no error (a GPU's: the test marked gpu)
        assert not any(tag.startswith("kprof/gpu/") for tag in tags)


class _FakeNvml:
    """NVML's calls as the probe makes them, answering like a GPU held at 1410 of 1980 MHz by a thermal slowdown with
    one other process on it."""

    def _set(self, ref, value) -> int:
        ref._obj.value = value
        return 0

    def nvmlDeviceGetClockInfo(self, handle, kind, ref):  # noqa: N802 (NVML's names)
        return self._set(ref, 1410)

    def nvmlDeviceGetMaxClockInfo(self, handle, kind, ref):  # noqa: N802
        return self._set(ref, 1980)

    def nvmlDeviceGetTemperature(self, handle, kind, ref):  # noqa: N802
        return self._set(ref, 87)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle, ref):  # noqa: N802
        return self._set(ref, 0x1 | 0x40)  # idle (not a slowdown) and hardware thermal slowdown

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle, count, infos):  # noqa: N802
        count._obj.value = 2
        return 7  # NVML_ERROR_INSUFFICIENT_SIZE: the count-only call's answer


def test_gpu_evidence_from_nvml():
    nvml = machine._Nvml(_FakeNvml(), ctypes.c_void_p())
    assert nvml.sample() == {
        TAGS["sm_clock"]: 1410.0,
        TAGS["max_sm_clock"]: 1980.0,
        TAGS["temperature"]: 87.0,
        TAGS["throttle"]: 0x40,
        TAGS["other_processes"]: 1.0,
    }
    assert machine.pci_bus_id(type("Props", (), {"pci_domain_id": 0, "pci_bus_id": 0x3B, "pci_device_id": 0})) == (
        "00000000:3b:00.0"
    )
    assert machine.pci_bus_id(object()) is None  # torch does not say: no NVML, rather than another GPU's numbers


def _series(n_samples: int, **tags: list[float]) -> dict[str, dict[str, Series]]:
    every = machine.MACHINE_EVERY
    at = np.arange(1, n_samples + 1) * every
    out = {TAGS["cpus"]: Series(np.array([0]), np.array([2.0]))}
    for key, values in {"cpu_per_wall": [1.0] * n_samples, **tags}.items():
        out[TAGS[key]] = Series(at, np.array(values, np.float64))
    return {"w": out}


def test_the_summary_says_when_the_run_was_starved_or_its_gpu_slowed():
    starved = _series(4, cpu_wait=[0.01, 0.3, 0.02, 0.4], runnable=[1, 3, 1, 3], load1=[1, 2, 2, 2.5])
    (found,) = evidence.findings(starved)
    assert found.kind == "machine_starved"
    assert found.message.startswith("Starved of CPU in steps 10-19,30-39 (2 of 4 samples): the training thread")
    assert "waited for a CPU 35% of the time (runnable tasks 3, load average 2.25 on 2 CPUs)" in found.message
    gpu = _series(3, sm_clock=[1980, 1410, 1400], max_sm_clock=[1980] * 3, throttle=[0, 0x40, 0x40],
                  temperature=[70, 86, 87], other_processes=[0, 0, 1])  # fmt: skip
    kinds = {d.kind: d.message for d in evidence.findings(gpu)}
    assert kinds["machine_throttled"] == (
        "The GPU slowed in steps 10-29 (thermal slowdown (hardware)): SM clock 1405 MHz of 1980, 87 °C."
    )
    assert kinds["machine_shared_gpu"].startswith("Other processes computed on the GPU in steps 20-29 (up to 1")
    quiet = _series(4, cpu_wait=[0.01] * 4, sm_clock=[1980] * 4, max_sm_clock=[1980] * 4, throttle=[0] * 4)
    assert evidence.findings(quiet) == []


OPS = np.geomspace(50, 3000, 25)


def _run(rng: np.random.Generator, scale: np.ndarray, series: dict, n: int = 10) -> Summary:
    """A run of ``n`` steps of 25 operators (``scale``: each one's factor) and the machine's samples ``series``."""
    time_us = (OPS * scale)[:, None] * rng.lognormal(0.0, 0.03, (OPS.size, n))
    steps = [
        StepStats(i, None, "w", float(w), 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, float(w), 0.0, 0)
        for i, w in enumerate(time_us.sum(axis=0))
    ]
    table = PerStep(["op"] * OPS.size, [f"aten::op{k}" for k in range(OPS.size)], time_us, np.ones_like(time_us), steps)
    empty = Summary.empty("run", "test")
    return dataclasses.replace(empty, diagnostics=[], steps=steps, per_step=table, series=series)


QUIET = dict(cpu_wait=[0.002] * 3, runnable=[1, 1, 2], load1=[0.9] * 3, involuntary_switches=[0.2] * 3)


def _sides(tmp_path: Path, scale: np.ndarray, b_machine: dict, quiet: dict = QUIET) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    paths = []
    for name, run in (
        ("a", _run(rng, np.ones(OPS.size), _series(3, **quiet))),
        ("b", _run(rng, scale, b_machine)),
    ):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(run.to_dict()))
        paths.append(path)
    return paths[0], paths[1]


BUSY = dict(cpu_wait=[0.16, 0.2, 0.18], runnable=[4, 4, 5], load1=[2.1] * 3, involuntary_switches=[12.0] * 3)


def test_a_uniform_slowdown_on_a_busier_machine_is_inconclusive(tmp_path, capsys):
    """Every operator 30% slower and B's machine busier: its thread waited for a CPU 16% of the time (a step of the
    same work 19% longer), 63% of its slowdown. The gate says the machine changed, exit status 4, with both sides'
    numbers; saved summaries keep the samples."""
    a, b = _sides(tmp_path, np.full(OPS.size, 1.3), _series(3, **BUSY))
    d = diff(a, b)
    assert d.regressed(5) and d.machine_changed and d.machine.busier == "B" and d.machine.uniform > 0.8
    assert main(["diff", str(a), str(b), "--fail-if-slower", "5"]) == exits.INCONCLUSIVE == 4
    gate = capsys.readouterr().out.split("\n\n")[-1]
    assert gate.startswith("Inconclusive, the machine changed (limit +5%): B's typical step is ")
    assert (
        "but B ran on a busier or slower machine: the training thread waited for a CPU 0.2% -> 16% of the time" in gate
    )
    assert "runnable tasks 1 -> 4 on 2 CPUs (load average 0.9 -> 2.1)" in gate
    assert "Its training thread's wait for a CPU accounts for 63% of the slowdown, and every part of the step" in gate
    assert "B ran on a busier or slower machine" in d.headline()


def test_a_regression_on_a_busier_machine_is_still_a_regression(tmp_path, capsys):
    """One operator 4x slower (not every part alike; the wait accounts for 44% of it), on a busier machine: a
    regression, exit 3, and it says the machine was busier too. A uniform 30% slowdown on a machine only a little
    busier (a wait share of 6% accounts for 20% of it) is a regression too, and so is one without evidence."""
    scale = np.ones(OPS.size)
    scale[-1] = 4.0
    a, b = _sides(tmp_path, scale, _series(3, **BUSY))
    assert not diff(a, b).machine_changed and diff(a, b).machine.busier == "B"
    assert main(["diff", str(a), str(b), "--fail-if-slower", "5"]) == exits.REGRESSION
    gate = capsys.readouterr().out.split("\n\n")[-1]
    assert gate.startswith("Regression (limit +5%)") and "aten::op24" in gate and "B ran on a busier" in gate
    little = dict(cpu_wait=[0.06, 0.07, 0.06], runnable=[1, 1, 2], load1=[0.9] * 3, involuntary_switches=[0.2] * 3)
    a, b = _sides(tmp_path, np.full(OPS.size, 1.3), _series(3, **little))
    assert diff(a, b).machine.busier == "B" and diff(a, b).machine.accounted < 0.25
    assert main(["diff", str(a), str(b), "--fail-if-slower", "5"]) == 3
    quiet_b = dict(cpu_wait=[0.002] * 3, runnable=[1, 1, 2], load1=[0.9] * 3, involuntary_switches=[0.2] * 3)
    a, b = _sides(tmp_path, np.full(OPS.size, 1.3), _series(3, **quiet_b))
    assert diff(a, b).machine is None and main(["diff", str(a), str(b), "--fail-if-slower", "5"]) == 3


def test_a_pass_that_a_busier_a_could_hide_is_inconclusive(tmp_path, capsys):
    """A ran on the busier machine (its thread waited for a CPU 16% of the time: steps 19% longer for it), and B is
    as fast as A: a regression of B of up to that much could hide behind A's load, so the gate says so, exit 4."""
    a, b = _sides(tmp_path, np.ones(OPS.size), _series(3, **QUIET), quiet=BUSY)
    d = diff(a, b)
    assert not d.regressed(5) and d.machine.busier == "A" and d.masked(5) and not d.masked(25)
    assert main(["diff", str(a), str(b), "--fail-if-slower", "5"]) == exits.INCONCLUSIVE
    gate = capsys.readouterr().out.split("\n\n")[-1]
    assert gate.startswith("Inconclusive, the machine changed (limit +5%): B's typical step is ")
    assert "That made A's steps 19% longer: a regression of B past the limit could hide behind it" in gate
    assert main(["diff", str(a), str(b), "--fail-if-slower", "25"]) == exits.OK


def test_without_a_measured_loss_a_uniform_slowdown_decides(tmp_path):
    """B shared its GPU with another process (no CPU wait or clock measured to weigh): the machine explains B's
    slowdown only when every part of the step slowed alike."""
    shared = dict(other_processes=[1, 1, 1])
    a, b = _sides(tmp_path, np.full(OPS.size, 1.3), _series(3, **shared), quiet=dict(other_processes=[0, 0, 0]))
    d = diff(a, b)
    assert d.machine.busier == "B" and d.machine.accounted is None and d.machine_changed
    assert "Every part of the step slowed alike (" in d.machine.sentence()
    scale = np.ones(OPS.size)
    scale[-1] = 4.0
    a, b = _sides(tmp_path, scale, _series(3, **shared), quiet=dict(other_processes=[0, 0, 0]))
    assert diff(a, b).machine.busier == "B" and not diff(a, b).machine_changed


def test_runs_without_samples_have_no_machine_to_compare(tmp_path):
    rng = np.random.default_rng(1)
    run = _run(rng, np.ones(OPS.size), {})
    assert diff(run, _run(rng, np.full(OPS.size, 1.3), {})).machine is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
def test_a_gpu_session_records_what_nvml_says(tmp_path):
    """On a GPU host with NVML: the SM clock against its maximum, the temperature and the other processes, at each
    sample, for the GPU the session runs on (found by its PCI bus id)."""
    if machine._Nvml.open(machine.pci_bus_id(torch.cuda.get_device_properties(0)) or "") is None:
        pytest.skip("NVML (libnvidia-ml.so.1) does not load here, or torch does not give the GPU's PCI bus id")
    x = torch.randn(1024, 1024, device="cuda")
    with kprof.session(tmp_path, run="gpu", wait=1, warmup=1, active=2) as s:
        for _ in range(2 * machine.MACHINE_EVERY + 1):
            (x @ x).sum()
            s.step()
    (tags,) = read_series(s.run_dir).values()
    clock, top = tags[TAGS["sm_clock"]].values, tags[TAGS["max_sm_clock"]].values
    assert clock.size == 3 and (clock > 0).all() and (clock <= top).all()
    assert (tags[TAGS["temperature"]].values > 0).all() and (tags[TAGS["other_processes"]].values >= 0).all()
