"""The timeline of all ranks (analysis/ranktimeline.py) on GPU traces built to order: four ranks on two hosts whose
clocks differ by a known offset, each step computing for a set time and then all-reducing twice, once in each of two
process groups (HSDP's mesh levels). Where each rank arrives at each collective is known, so the alignment, the
matching, the waits and the ranks marked are checked against the numbers the traces were built from."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

import kprof_callbacks as kprof
from kprof_callbacks.analysis import html
from kprof_callbacks.analysis.ranktimeline import RunSlices

STEPS = (5, 6, 7)
HOST_B = 3.7e6  # us: the second host's clock reads this much more
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
COMPUTE = {0: 1000.0, 1: 1000.0, 2: 1600.0, 3: 1000.0}  # us of compute before the first collective; rank 2 straggles
LEVELS = (("mesh_shard", 300.0), ("mesh_replicate", 200.0))  # each step: a shard all-reduce, then a replicate one


def _groups(rank: int) -> dict[str, list[int]]:
    """A 2 x 2 mesh [[0, 1], [2, 3]]: shard groups {0, 1} and {2, 3}, replicate groups {0, 2} and {1, 3}."""
    return {"mesh_shard": [r for r in range(4) if r // 2 == rank // 2], "mesh_replicate": [rank % 2, rank % 2 + 2]}


def _true_times() -> dict[int, dict[int, list[tuple[float, float]]]]:
    """step -> rank -> [(arrival, end)] per collective, on one true clock (us): a collective ends when its last
    member arrives plus its duration."""
    out: dict[int, dict[int, list[tuple[float, float]]]] = {}
    t = 10_000.0
    for step in STEPS:
        ready = {r: t + 100 + COMPUTE[r] for r in range(4)}
        out[step] = {r: [] for r in range(4)}
        for level, dur in LEVELS:
            done = {}
            for r in range(4):
                members = _groups(r)[level]
                done[r] = max(ready[m] for m in members) + dur
                out[step][r].append((ready[r], done[r]))
            ready = done
        t = max(ready.values()) + 500
    return out


def _write(folder: Path, shifted: set[int]) -> None:
    times = _true_times()
    for r in range(4):
        clock = HOST_B if r in shifted else 0.0
        host = "hostb" if r in shifted else "hosta"
        events, corr = [], 0
        for step, per_rank in times.items():
            arrivals = per_rank[r]
            begin = arrivals[0][0] - COMPUTE[r] - 100
            events.append(_event(f"ProfilerStep#{step}", "user_annotation", 1, begin + clock, 50.0, {}))
            kernels = [("sm90_xmma_gemm", begin + 100, COMPUTE[r], 7, {})]
            for (level, _), (arrive, end) in zip(LEVELS, arrivals):
                args = {
                    "Collective name": "allreduce",
                    "Process Group Name": str(1 + [n for n, _ in LEVELS].index(level)),
                    "Process Group Description": level,
                    "Process Group Ranks": str(_groups(r)[level]),
                    "Group size": 2,
                }
                kernels.append((NCCL, arrive, end - arrive, 20 if level == "mesh_shard" else 24, args))
            for name, ts, dur, stream, extra in kernels:
                corr += 1
                events.append(_event("cudaLaunchKernel", "cuda_runtime", 1, begin + 10 + corr + clock, 1.0, {}))
                events[-1]["args"]["correlation"] = corr
                args = {"correlation": corr, "stream": stream, "device": r, **extra}
                events.append(_event(name, "kernel", stream, ts + clock, dur, args, pid=r))
        doc = {"traceEvents": events, "distributedInfo": {"rank": r, "world_size": 4, "backend": "nccl"}}
        (folder / f"rank{r}_{host}_{100 + r}.1.pt.trace.json").write_text(json.dumps(doc))


def _event(name: str, cat: str, tid: int, ts: float, dur: float, args: dict, pid: int = 1000) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


@pytest.fixture(params=[set(), {2, 3}], ids=["one-host", "two-hosts"])
def run(request, tmp_path) -> Path:
    _write(tmp_path, request.param)
    return tmp_path


def test_clocks_aligned_collectives_matched_in_their_groups_and_waits_measured(run):
    s = kprof.summarize(run)
    merged = RunSlices(s.files).step(6, skew=s.step_skew)
    shifted = "hostb" in s.files[-1].name
    assert [r.rank for r in merged.ranks] == [0, 1, 2, 3]
    offset = HOST_B * 1e3 if shifted else 0.0
    assert [r.clock_offset_ns for r in merged.ranks] == pytest.approx([0, 0, offset, offset], abs=1)
    true = _true_times()[6]
    origin = min(true[r][0][0] - COMPUTE[r] - 100 for r in range(4))
    p = merged.piece
    by_level: dict[tuple[str, int], list] = {}
    for c in merged.collectives:
        assert c.kind == "all_reduce" and c.group in ("mesh_shard", "mesh_replicate")
    for i in (i for i in range(len(p)) if merged.coll[i] >= 0):
        c = merged.collectives[merged.coll[i]]
        rank = int(p.lanes[p.lane[i]].name.split()[1])
        level = [name for name, _ in LEVELS].index(c.group)
        arrive, end = true[rank][level]
        assert p.start[i] == pytest.approx((arrive - origin) * 1e3, abs=1)  # on the aligned clock
        assert p.start[i] + p.dur[i] == pytest.approx((end - origin) * 1e3, abs=1)
        members = _groups(rank)[c.group]
        assert merged.wait[i] == pytest.approx((max(true[m][level][0] for m in members) - arrive) * 1e3, abs=1)
        by_level.setdefault((c.group, tuple(members)), []).append((rank, c.color))
    # one collective per group: both members drawn in its colour, the four groups each matched on their own
    assert sorted(by_level) == [
        ("mesh_replicate", (0, 2)),
        ("mesh_replicate", (1, 3)),
        ("mesh_shard", (0, 1)),
        ("mesh_shard", (2, 3)),
    ]
    assert all(len(v) == 2 and v[0][1] == v[1][1] for v in by_level.values())
    waited = {r.rank: r.waited_ns for r in merged.ranks}
    assert waited[3] == pytest.approx(600e3, abs=10) and waited[2] == pytest.approx(0, abs=10)
    assert waited[0] == pytest.approx(600e3, abs=10)  # waits at the replicate all-reduce for rank 2
    assert merged.straggler[0] == 2 and merged.straggler[1] == pytest.approx(600.0, abs=1)
    assert merged.late[0] == 2
    assert {r.rank: r.clock_offset_us for r in s.ranks} == pytest.approx(
        {r.rank: r.clock_offset_ns / 1e3 for r in merged.ranks}
    )


def test_comm_table_tells_the_mesh_levels_apart(run):
    s = kprof.summarize(run)
    assert {(c.collective, c.group, c.group_size) for c in s.comm} == {
        ("all_reduce", "mesh_shard", 2),
        ("all_reduce", "mesh_replicate", 2),
    }
    table = s.render()
    assert "mesh_shard (2 ranks)" in table and "mesh_replicate (2 ranks)" in table


def test_collapsed_rows_keep_every_rank_and_its_collectives(run):
    s = kprof.summarize(run)
    merged = RunSlices(s.files).step(6, skew=s.step_skew)
    small = merged.collapsed()
    assert [lane.name for lane in small.piece.lanes] == [f"rank {r}" for r in range(4)]
    assert sorted(small.coll[small.coll >= 0].tolist()) == sorted(merged.coll[merged.coll >= 0].tolist())
    busy = [i for i in range(len(small.piece)) if small.coll[i] < 0]
    assert {int(small.piece.lane[i]) for i in busy} == {0, 1, 2, 3}
    assert small.piece.dur[busy].tolist() == [COMPUTE[r] * 1e3 for r in range(4)]


def test_html_report_draws_the_ranks_on_one_clock(run, tmp_path):
    s = kprof.summarize(run)
    page = html.summary_body(s, 10, "cuda")
    section = page[page.index("<h2>All ranks") :]
    for r in range(4):
        assert f">rank {r} · GPU {r} stream 20<" in section
    assert "straggler: rank 2" in section and "waited for: rank 2" in section
    two = "hostb" in s.files[-1].name
    assert ("2 hosts, their clocks aligned" in section) == two
    assert [r.host for r in RunSlices(s.files).step(6).ranks] == ["hosta", "hosta"] + ["hostb" if two else "hosta"] * 2


def test_html_report_collapses_many_ranks_to_a_row_each(run, monkeypatch):
    monkeypatch.setattr(html, "COLLAPSE_RANKS", 3)  # 4 ranks count as many
    s = kprof.summarize(run)
    page = html.summary_body(s, 10, "cuda")
    section = page[page.index("<h2>All ranks") :]
    assert "one row per rank" in section and " · GPU" not in section
    assert all(f">rank {r}<" in section for r in range(4))


def test_process_group_as_kineto_writes_it_in_its_spellings():
    from kprof_callbacks.analysis.comm import group_parts
    from kprof_callbacks.analysis.eventcolumns import Event, group_text

    def text(args: dict) -> str:
        return group_text(msgspec.json.decode(json.dumps({"args": args}), type=Event).args)

    shard = {"Process Group Name": "3", "Process Group Description": "mesh_shard", "Group size": 2}
    assert group_parts(text({**shard, "Process Group Ranks": "[0, 1]"})) == ("mesh_shard", 2)
    assert text({**shard, "Process Group Ranks": [2, 3]}) == "mesh_shard\t2\t[2,3]"  # a list, not a string
    assert group_parts(text({"Process Group Name": 7, "Process Group Description": "undefined"})) == ("group 7", 0)
    assert text({"Collective name": "allreduce"}) == "" and group_parts("") == ("", 0)
