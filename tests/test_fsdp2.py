"""examples/fsdp2_loop.py on the CPU: FSDP2 over gloo in 2 processes (and 16, simulating a multi-host job), launched by
torchrun as users launch it, then summarized: communication by collective, FSDP's phases and findings, clocks; and
examples/fsdp2_fit.py, its Lightning counterpart."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import kprof_callbacks as kprof
from kprof_callbacks.analysis import fsdp

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
EXAMPLE = EXAMPLES / "fsdp2_loop.py"
# The CPU path (gloo), also on a machine with GPUs: the examples take NCCL when every rank has a GPU of its own.
CPU_ENV = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
LAYERS = 3
SMALL = ["--layers", str(LAYERS), "--steps", "8"]


def _torchrun(logdir: Path, name: str, *flags: str, ranks: int = 2) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={ranks}",
            str(EXAMPLE),
            "--logdir",
            str(logdir),
            "--name",
            name,
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=logdir,
        env=CPU_ENV,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[kprof.Summary, str]]:
    """Three configurations: FSDP's defaults with rank 1 slow to load data, fully_shard on the root alone, and the
    blocks kept unsharded from forward to backward."""
    logdir = tmp_path_factory.mktemp("fsdp2")
    flags = {"good": ["--slow-data", "1:150"], "root": ["--wrap", "root"], "kept": ["--no-reshard-after-forward"]}
    out = {}
    for name, extra in flags.items():
        done = _torchrun(logdir, name, *SMALL, *extra)
        out[name] = (kprof.summarize(logdir / name), done.stdout)
    return out


def _calls(s: kprof.Summary) -> dict[tuple[str, str], set[int]]:
    found: dict[tuple[str, str], set[int]] = {}
    for c in s.comm:
        found.setdefault((c.collective, c.phase), set()).add(c.calls)
    return found


def test_every_rank_writes_its_trace_and_rank0_alone_prints_the_summary(runs):
    s, stdout = runs["good"]
    assert sorted(p.name.split("_")[0] for p in s.files) == ["rank0", "rank1"]
    assert stdout.count("kprof summary: good") == 1
    assert "Communication by collective" in stdout
    for f in s.files:
        names = {e["name"] for e in json.loads(f.read_text())["traceEvents"]}
        assert {"FSDP::all_gather (blocks.0)", "FSDP::post_backward_reduce (blocks.0)", "gloo:all_gather"} <= names


def test_collectives_by_phase_follow_the_sharding(runs):
    groups = LAYERS + 1  # each block and the root
    assert _calls(runs["good"][0]) == {
        ("all_gather", "forward"): {groups},
        ("all_gather", "backward"): {LAYERS},
        ("reduce_scatter", "backward"): {groups},
    }  # the root stays unsharded
    assert _calls(runs["root"][0]) == {("all_gather", "forward"): {1}, ("reduce_scatter", "backward"): {1}}
    assert _calls(runs["kept"][0]) == {("all_gather", "forward"): {groups}, ("reduce_scatter", "backward"): {groups}}
    for s, _ in runs.values():
        for c in s.comm:
            assert c.exposed_us == pytest.approx(c.total_us - c.overlap_us) and c.total_us > 0
        assert {(c.rank, c.step) for c in s.comm} == {(r.rank, r.step) for r in s.steps}


def test_unsharded_memory_at_the_peak(runs):
    good, root, kept = (runs[k][0].fsdp for k in ("good", "root", "kept"))
    for rows in (good, root, kept):
        assert len({r.unsharded_total for r in rows}) == 1 and rows[0].unsharded_total > 0
        assert all(r.world_size == 2 and r.peak_memory > 0 for r in rows)
    assert good[0].unsharded_total == root[0].unsharded_total == kept[0].unsharded_total  # the same model
    assert all(r.groups == LAYERS + 1 and r.groups_at_peak <= 2 for r in good)
    assert all(r.groups == r.groups_at_peak == 1 and r.unsharded_at_peak == r.unsharded_total for r in root)
    assert all(r.groups_at_peak == LAYERS + 1 and r.unsharded_at_peak == r.unsharded_total for r in kept)


def test_findings_fire_on_the_bad_configurations(runs):
    kinds = {name: {d.kind for d in s.diagnostics} for name, (s, _) in runs.items()}
    assert "fsdp_unsharded_memory" not in kinds["good"]
    assert "fsdp_unsharded_memory" in kinds["root"]
    # One group has nothing to hide its collectives behind. Whether they reach 5% of the step depends on how fast
    # this CPU computes (2-6% on a loaded 2-core runner), so the test holds the part of each that is exposed;
    # test_fsdp2_analysis holds the findings' thresholds.
    for collective, phase in (("all_gather", "forward"), ("reduce_scatter", "backward")):
        rows = [c for c in runs["root"][0].comm if (c.collective, c.phase) == (collective, phase)]
        exposed = sum(c.exposed_us for c in rows) / sum(c.total_us for c in rows)
        assert exposed >= 2 * fsdp.EXPOSED_PART, (collective, exposed)
    assert "fsdp_unsharded_memory" in kinds["kept"]
    assert not any("fsdp_one_communicator" in k for k in kinds.values())  # gloo: no NCCL communicator
    late = next(d for d in runs["good"][0].diagnostics if d.kind == "late_rank")
    assert late.message.startswith("Rank 1 ")
    memory = next(d.message for d in runs["kept"][0].diagnostics if d.kind == "fsdp_unsharded_memory")
    assert f"{LAYERS + 1} of {LAYERS + 1} FSDP groups" in memory and "reshard_after_forward" in memory


def _move_to_another_host(trace: Path, folder: Path, shift_us: float) -> None:
    """The trace as a rank on another host would write it: its clock `shift_us` ahead, its host renamed."""
    doc = json.loads(trace.read_text())
    for e in doc["traceEvents"]:
        if "ts" in e:
            e["ts"] += shift_us
    rank, _host, rest = trace.name.split("_", 2)
    (folder / f"{rank}_otherhost_{rest}").write_text(json.dumps(doc))


def _copy(trace: Path, folder: Path) -> None:
    (folder / trace.name).write_bytes(trace.read_bytes())


def test_sixteen_ranks_on_two_hosts(tmp_path):
    """16 gloo processes: rank 3 computes 150 ms more each step, rank 11 sleeps 400 ms loading data. Ranks 8-15 are
    then moved to a host whose clock reads 3.7 s more: aligned on collective ends, the summary is the same."""
    _torchrun(
        tmp_path,
        "sim",
        "--layers",
        "2",
        "--width",
        "32",
        "--batch",
        "2",
        "--steps",
        "8",
        "--straggler",
        "3:150",
        "--slow-data",
        "11:400",
        ranks=16,
    )
    one_host = kprof.summarize(tmp_path / "sim")
    for folder, shift in (("two", 3.7e6), ("unshifted", 0.0)):  # the same split with and without a clock shift
        (tmp_path / folder).mkdir()
        for trace in (tmp_path / "sim").glob("*.pt.trace.json"):
            if int(trace.name.split("_")[0][4:]) >= 8:
                _move_to_another_host(trace, tmp_path / folder, shift)
            else:
                _copy(trace, tmp_path / folder)
    two_hosts = kprof.summarize(tmp_path / "two")

    for s in (one_host, two_hosts):
        assert len(s.ranks) == 16
        found = {d.kind: d.message for d in s.diagnostics}
        assert found["straggler"].startswith("Rank 3 ")
        assert found["late_rank"].startswith("Rank 11 ")
        # gloo: FSDP's collectives block. Whether reduce-scatter reaches 5% of a step that rank 11's 400 ms sleep
        # stretches depends on the machine (it did not on 32 cores); the part of it that is exposed does not.
        assert "fsdp_all_gather" in found
        rows = [c for c in s.comm if c.collective == "reduce_scatter"]
        assert sum(c.exposed_us for c in rows) / sum(c.total_us for c in rows) >= 2 * fsdp.EXPOSED_PART
    offsets = {r.rank: r.clock_offset_us for r in two_hosts.ranks}
    unshifted = {r.rank: r.clock_offset_us for r in kprof.summarize(tmp_path / "unshifted").ranks}
    assert all(offsets[r] == 0 for r in range(8))
    # the shift is recovered exactly; what is left (the ranks' collective ends on a loaded CPU) is the same without it
    assert all(abs(offsets[r] - unshifted[r] - 3.7e6) < 1.0 for r in range(8, 16))
    assert "2 host clocks" in next(d.message for d in two_hosts.diagnostics if d.kind == "late_rank")
    late = {r.rank: r.late_us for r in one_host.ranks}, {r.rank: r.late_us for r in two_hosts.ranks}
    assert max(late[0], key=late[0].get) == max(late[1], key=late[1].get) == 11


def test_lightning_model_parallel_strategy_profiles_every_rank(tmp_path):
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "fsdp2_fit.py"), "--root", str(tmp_path), "--steps", "8"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env=CPU_ENV,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "lightning_logs" / "version_0" / "kprof" / "train"
    s = kprof.summarize(run)
    assert sorted(p.name.split("_")[0] for p in s.files) == ["rank0", "rank1"]
    assert done.stdout.count("Communication by collective") == 1  # rank 0 alone prints
    groups = 4 + 1  # the example's CPU model: 4 blocks, and the root
    fsdp = {key: calls for key, calls in _calls(s).items() if key[0] in ("all_gather", "reduce_scatter")}
    assert fsdp == {
        ("all_gather", "forward"): {groups},
        ("all_gather", "backward"): {groups - 1},
        ("reduce_scatter", "backward"): {groups},
    }  # Lightning adds a broadcast or two of its own
    assert all(f.groups == groups and f.unsharded_total > 0 for f in s.fsdp)
