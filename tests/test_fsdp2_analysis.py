"""Communication by collective and FSDP's findings on GPU traces built to order: a step of FSDP2 on NCCL is laid out
event by event (host labels and launches, kernels and NCCL kernels on streams, memory records), once in a good
configuration and once in a bad one, so each finding is seen to fire on the bad layout and stay quiet on the good."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from kprof_callbacks.analysis import comm, summarize

BLOCKS = 6
STEPS = (4, 5, 6)
BLOCK_BYTES = 1 << 20
NCCL = "ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)"  # says nothing: "Collective name" must


@dataclasses.dataclass
class Layout:
    """How a synthetic FSDP step runs on one rank (times in us)."""

    compute: float = 400.0  # one block's forward (backward takes twice as long)
    gather: float = 200.0  # one block's all-gather
    scatter: float = 300.0  # one block's reduce-scatter
    prefetch: bool = True  # the next all-gather is issued before this block's computation
    root_only: bool = False  # one group: all blocks gathered (and reduced) at once
    reshard: bool = True  # reshard after forward (else every block stays unsharded until its backward)
    separate_groups: bool = False  # reduce-scatter on its own communicator: may run beside an all-gather
    rank: int = 0
    clock: float = 0.0  # this host's clock offset (us)
    waits: float = 0.0  # this rank's first all-gather of a step waits this long for a late peer
    kept_across: int = 0  # the first N blocks stay unsharded from one step into the next (never resharded)


class _Trace:
    """The events of one rank's trace: every time is on the rank's host clock (`Layout.clock`)."""

    def __init__(self, layout: Layout) -> None:
        self.l = layout
        self.events: list[dict] = []
        self.corr = 0
        self.allocated = 0
        self.live: dict[int, int] = {}
        self.lanes = {20: 0.0, 21: 0.0}  # when each NCCL stream is free

    def host(self, name: str, ts: float, dur: float, cat: str = "user_annotation") -> None:
        self.events.append(
            {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts + self.l.clock, "dur": dur, "args": {}}
        )

    def gpu(self, name: str, host_ts: float, ts: float, dur: float, stream: int, collective: str = "") -> float:
        """A kernel launched at host_ts, running [ts, ts + dur); returns its end."""
        self.corr += 1
        self.host("cudaLaunchKernel", host_ts, 1.0, "cuda_runtime")
        self.events[-1]["args"] = {"correlation": self.corr}
        args = {"correlation": self.corr, "stream": stream, "device": 0}
        if collective:
            args["Collective name"] = collective
        self.events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": name,
                "pid": 0,
                "tid": stream,
                "ts": ts + self.l.clock,
                "dur": dur,
                "args": args,
            }
        )
        return ts + dur

    def collective(self, host_ts: float, ready: float, dur: float, scatter: bool) -> float:
        """An NCCL collective issued at host_ts that can start at `ready`: it queues on its communicator's stream
        (all-gather and reduce-scatter share one unless `separate_groups`); returns its end."""
        lane = 21 if scatter and self.l.separate_groups else 20
        start = max(ready, self.lanes[lane])
        self.lanes[lane] = self.gpu(
            NCCL, host_ts, start, dur, lane, "_reduce_scatter_base" if scatter else "_allgather_base"
        )
        return self.lanes[lane]

    def memory(self, ts: float, nbytes: int, addr: int) -> None:
        self.allocated += nbytes
        self.events.append(
            {
                "ph": "i",
                "cat": "cpu_instant_event",
                "name": "[memory]",
                "pid": 1,
                "tid": 1,
                "s": "t",
                "ts": ts + self.l.clock,
                "args": {
                    "Addr": addr,
                    "Bytes": nbytes,
                    "Total Allocated": self.allocated,
                    "Device Type": 1,
                    "Device Id": 0,
                },
            }
        )

    def unshard(self, group: str, ts: float, size: int, addr: int) -> None:
        if addr in self.live:  # still unsharded: FSDP gathers nothing
            return
        self.host(f"FSDP::all_gather_copy_out{group}", ts, 4.0)
        self.memory(ts + 1, size, addr)
        self.live[addr] = size

    def reshard(self, label: str, ts: float, addr: int) -> None:
        self.host(label, ts, 4.0)
        if addr in self.live:
            self.memory(ts + 1, -self.live.pop(addr), addr)

    def step(self, number: int, h: float) -> float:
        """One step: the host from h, the GPU from h + 5000; returns where the next step starts."""
        lay = self.l
        groups = [""] if lay.root_only else [f" (blocks.{i})" for i in range(BLOCKS)]
        size, scale = BLOCK_BYTES * BLOCKS // len(groups), BLOCKS / len(groups)
        gather, scatter = lay.gather * scale, lay.scatter * scale
        fwd, bwd = lay.compute * scale, 2 * lay.compute * scale
        self.host(f"ProfilerStep#{number}", h, 4000)
        g = h + 5000  # when the compute stream is free
        self.lanes = {lane: max(free, g - lay.waits) for lane, free in self.lanes.items()}
        self.host("FSDP::root_pre_forward", h + 10, 2)
        gathered = {0: self.collective(h + 15, g - lay.waits, gather + lay.waits, False)}
        for i, group in enumerate(groups):  # forward: block i's all-gather is issued early (prefetch) or not
            hi = h + 20 + 100 * i
            self.host(f"FSDP::pre_forward{group}", hi, 60)
            if lay.prefetch and i + 1 < len(groups):
                gathered[i + 1] = self.collective(hi + 5, g, gather, False)
            self.unshard(group, hi + 10, size, 1000 + i)
            g = self.gpu("sm90_xmma_gemm", hi + 20, max(g, gathered[i]), fwd, 7)
            if not lay.prefetch and i + 1 < len(groups):  # issued only now: it starts after this block
                gathered[i + 1] = self.collective(hi + 25, g, gather, False)
            if lay.reshard and not lay.root_only:
                self.reshard(f"FSDP::post_forward{group}", hi + 70, 1000 + i)
        self.memory(h + 900, 64 * BLOCK_BYTES, 1)  # activations: the step's memory peak
        regather = lay.reshard and not lay.root_only
        for j, i in enumerate(reversed(range(len(groups)))):  # backward: the previous block's all-gather first
            group, hi = groups[i], h + 1000 + 200 * j
            self.host(f"FSDP::pre_backward{group}", hi, 60)
            if regather and not j:
                gathered = {i: self.collective(hi + 5, g, gather, False)}
            if regather:
                self.unshard(group, hi + 10, size, 1000 + i)
                if i and lay.prefetch:
                    gathered[i - 1] = self.collective(hi + 15, g, gather, False)
            g = self.gpu("sm90_xmma_gemm_bwd", hi + 20, max(g, gathered[i]) if regather else g, bwd, 7)
            if regather and i and not lay.prefetch:
                gathered[i - 1] = self.collective(hi + 25, g, gather, False)
            self.host(f"FSDP::post_backward_reduce{group}", hi + 100, 20)
            reduced = self.collective(hi + 105, g, scatter, True)
            if i >= lay.kept_across:
                self.reshard(f"FSDP::post_backward_reshard{group}", hi + 130, 1000 + i)
        self.host("FSDP::root_post_backward_callback", h + 1000 + 200 * len(groups), 20)
        self.memory(h + 3900, -64 * BLOCK_BYTES, 1)
        end = self.gpu("multi_tensor_apply_kernel", h + 3950, max(g, reduced), 100, 7)  # the optimizer
        return end + 200

    def write(self, folder: Path) -> Path:
        t = 1_000_000.0
        for number in STEPS:
            t = self.step(number, t)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"rank{self.l.rank}_host{int(self.l.clock)}_{100 + self.l.rank}.1.pt.trace.json"
        path.write_text(
            json.dumps(
                {
                    "traceEvents": self.events,
                    "distributedInfo": {"rank": self.l.rank, "world_size": 2, "backend": "nccl"},
                }
            )
        )
        return path


def _run(tmp_path: Path, name: str, **changes) -> Path:
    for rank in (0, 1):
        _Trace(Layout(rank=rank, **changes)).write(tmp_path / name)
    return tmp_path / name


def _kinds(folder: Path) -> set[str]:
    return {d.kind for d in summarize(folder).diagnostics}


def test_collectives_are_named_by_their_collective_name_and_accounted_per_step_and_phase(tmp_path):
    s = summarize(_run(tmp_path, "good"))
    rows = {(c.rank, c.step, c.collective, c.phase): c for c in s.comm}
    assert {key[2:] for key in rows} == {
        ("all_gather", "forward"),
        ("all_gather", "backward"),
        ("reduce_scatter", "backward"),
    }
    assert {(key[0], key[1]) for key in rows} == {(r, n) for r in (0, 1) for n in STEPS}
    for c in s.comm:
        assert c.calls == BLOCKS
        assert c.exposed_us == pytest.approx(c.total_us - c.overlap_us)
        assert 0 <= c.overlap_us <= c.total_us
    forward = rows[(0, 5, "all_gather", "forward")]
    assert forward.total_us == pytest.approx(BLOCKS * 200.0)
    assert forward.exposed_us == pytest.approx(200.0)  # only the first all-gather: the others hide behind a block
    scatter = rows[(0, 5, "reduce_scatter", "backward")]
    assert scatter.exposed_us == pytest.approx(300.0)  # only the last one, after the last backward block
    edges = {(f.rank, f.step): f for f in s.fsdp}
    assert edges[(0, 5)].first_gather_exposed_us == pytest.approx(200.0)
    assert edges[(0, 5)].last_scatter_exposed_us == pytest.approx(300.0)
    assert edges[(0, 5)].groups == BLOCKS
    totals = comm.totals(s.comm, s.steps)
    assert {(t.collective, t.phase) for t in totals} == {key[2:] for key in rows}
    assert "Communication by collective" in s.render()


SLOW_COMM = {"gather": 500.0, "scatter": 600.0}  # together longer than a block's backward


@pytest.mark.parametrize(
    ("finding", "good", "bad"),
    [
        ("fsdp_all_gather", {}, {"prefetch": False}),
        ("fsdp_all_gather", {}, {"root_only": True}),
        ("fsdp_reduce_scatter", {}, {"root_only": True}),
        ("fsdp_reduce_scatter", {}, {"scatter": 1200.0}),
        ("fsdp_one_communicator", {"separate_groups": True, **SLOW_COMM}, SLOW_COMM),
        ("fsdp_unsharded_memory", {}, {"reshard": False}),
        ("fsdp_unsharded_memory", {}, {"root_only": True}),
    ],
    ids=lambda v: str(v) if isinstance(v, str) else ",".join(f"{k}={x}" for k, x in v.items()) or "default",
)
def test_each_finding_fires_on_its_bad_layout_and_not_on_the_good_one(tmp_path, finding, good, bad):
    assert finding not in _kinds(_run(tmp_path, "good", **good))
    assert finding in _kinds(_run(tmp_path, "bad", **bad))


def test_all_gather_and_reduce_scatter_concurrent_only_on_separate_groups(tmp_path):
    s = summarize(_run(tmp_path, "separate", separate_groups=True, **SLOW_COMM))
    assert all(f.gather_scatter_concurrent_us > 0 for f in s.fsdp)
    assert all(f.gather_queued_us == 0 for f in s.fsdp)
    serial = summarize(_run(tmp_path, "serial", **SLOW_COMM))
    assert all(f.gather_scatter_concurrent_us == 0 and f.gather_queued_us > 0 for f in serial.fsdp)
    message = next(d.message for d in serial.diagnostics if d.kind == "fsdp_one_communicator")
    assert "set_separate_reduce_scatter_group" in message


def test_unsharded_memory_at_the_peak_against_the_sharded_size(tmp_path):
    kept = summarize(_run(tmp_path, "kept", reshard=False))
    resharded = summarize(_run(tmp_path, "resharded"))
    for f in kept.fsdp:
        assert (f.unsharded_total, f.unsharded_at_peak, f.groups_at_peak) == (
            BLOCKS * BLOCK_BYTES,
            BLOCKS * BLOCK_BYTES,
            BLOCKS,
        )
        assert f.largest_group == BLOCK_BYTES and f.world_size == 2
    for f in resharded.fsdp:  # the peak comes as backward unshards its first block
        assert (f.unsharded_total, f.unsharded_at_peak, f.groups_at_peak) == (BLOCKS * BLOCK_BYTES, BLOCK_BYTES, 1)
    message = next(d.message for d in kept.diagnostics if d.kind == "fsdp_unsharded_memory")
    assert "6.0 MB of unsharded parameters" in message and "3.0 MB sharded per rank over 2 ranks" in message
    assert "reshard_after_forward" in message


def test_groups_kept_unsharded_from_an_earlier_step_count_in_the_model_size(tmp_path):
    """Blocks 0-2 all-gather once and stay unsharded into the later steps: at each later peak every block is alive,
    and the model's unsharded size counts them all (before: only the 3 that all-gathered in the step, so the finding
    read '6 of 3 FSDP groups, 200% of the model')."""
    s = summarize(_run(tmp_path, "across", reshard=False, kept_across=3))
    later = [f for f in s.fsdp if f.step != STEPS[0]]
    assert later and all(f.groups == BLOCKS - 3 for f in later)
    for f in later:
        assert (f.unsharded_total, f.unsharded_at_peak, f.groups_at_peak) == (
            BLOCKS * BLOCK_BYTES,
            BLOCKS * BLOCK_BYTES,
            BLOCKS,
        )
    message = next(d.message for d in s.diagnostics if d.kind == "fsdp_unsharded_memory")
    assert f"{BLOCKS} of {BLOCKS} FSDP groups, 100% of the model" in message


def test_clock_offsets_are_recovered_and_the_late_rank_found_across_hosts(tmp_path):
    """Rank 1 sits on a host whose clock reads 3.7 s more, and arrives 2 ms late at each step's first all-gather, which
    rank 0 waits for; both compute alike, so the lateness is outside computation."""
    _Trace(Layout(rank=0, waits=2000.0)).write(tmp_path / "hosts")
    _Trace(Layout(rank=1, clock=3.7e6)).write(tmp_path / "hosts")
    s = summarize(tmp_path / "hosts")
    by_rank = {r.rank: r for r in s.ranks}
    assert by_rank[0].clock_offset_us == 0
    assert by_rank[1].clock_offset_us == pytest.approx(3.7e6, abs=1.0)
    assert by_rank[0].waited_us == pytest.approx(2000.0) and by_rank[1].waited_us == 0
    assert by_rank[1].late_us == pytest.approx(2000.0) and by_rank[0].late_us == 0
    late = next(d for d in s.diagnostics if d.kind == "late_rank")
    assert late.message.startswith("Rank 1 ") and "2 host clocks" in late.message
    assert "clock offset" in s.render()


def test_collective_names_in_their_spellings():
    spelled = {
        "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)": "all_gather",
        "ncclKernel_ReduceScatter_RING_LL_Sum___nv_bfloat16(ncclDevComm*, unsigned long, ncclWork*)": "reduce_scatter",
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)": "all_reduce",
        "gloo:all_gather": "all_gather",
        "c10d::_reduce_scatter_base_": "reduce_scatter",
        "allgather_into_tensor_coalesced": "all_gather",
        "c10d::allreduce_": "all_reduce",
        "nccl:broadcast": "broadcast",
        "c10d::alltoall_base_": "all_to_all",
        "c10d::recv_": "send_recv",
        "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)": "send_recv",
        "gloo:barrier": "barrier",
        "record_param_comms": "other",
        NCCL: "other",
    }
    assert {name: comm.collective_kind(name) for name in spelled} == spelled


def _num(value: float) -> str:
    """charts.js num(): how the tab writes a number."""
    return (
        "0"
        if value == 0
        else f"{value:.0f}"
        if abs(value) >= 100
        else f"{value:.1f}"
        if abs(value) >= 10
        else f"{value:.2f}"
        if abs(value) >= 1
        else f"{value:.3f}"
    )


def test_tab_ranks_view_shows_each_rank_computing_and_communicating(tmp_path, chromium, group_leftovers):
    from kprof_callbacks.tensorboard.launch import TensorBoardServer

    _Trace(Layout(rank=0, waits=2000.0)).write(tmp_path / "log" / "fsdp")
    _Trace(Layout(rank=1)).write(tmp_path / "log" / "fsdp")
    s = summarize(tmp_path / "log" / "fsdp")
    with TensorBoardServer(tmp_path / "log") as server:
        dom = chromium(f"{server.url}data/plugin_entry.html?name=kprof#run=fsdp", "--dump-dom")
    assert not group_leftovers(server.pid)
    view = dom[dom.index("Ranks (means per step)") :]
    for r in s.ranks:  # one bar per rank: computing, both, communicating, neither
        parts = {"computing": r.compute_us - r.overlap_us, "both": r.overlap_us, "communicating": r.exposed_comm_us}
        for name, us in parts.items():
            assert f"<title>rank {r.rank}: {name} {_num(us / 1000)} ms</title>" in view
    assert "waits for others" in view and "others wait for it" in view
    table = view[view.index("Communication by collective") :]
    rows = re.findall(r'<tr><td class="name">(\d)</td><td class="name">(\w+)</td><td class="name">(\w+)</td>', table)
    assert sorted(rows) == sorted({(str(c.rank), c.collective, c.phase) for c in s.comm})


def test_a_thread_waiting_inside_an_operator_is_not_computing(tmp_path):
    """CPU-only FSDP: a backward node (an operator) runs FSDP's pre-backward hook, which waits for a gloo all-gather
    on gloo's thread. Only the operators' own time computes, so the all-gather is exposed, not hidden."""

    def event(name: str, cat: str, ts: float, dur: float, tid: int = 1) -> dict:
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": {}}

    events = [
        event("ProfilerStep#1", "user_annotation", 0, 1000),
        event("autograd::engine::evaluate_function: AddBackward0", "cpu_op", 100, 800),
        event("FSDP::pre_backward (blocks.0)", "user_annotation", 150, 700),
        event("FSDP::all_gather (blocks.0)", "user_annotation", 200, 600),
        event("c10d::_allgather_base_", "cpu_op", 210, 10),
        event("gloo:all_gather", "user_annotation", 230, 560, tid=2),
        event("aten::mm", "cpu_op", 860, 30),
    ]
    path = tmp_path / "rank0_host_1.1.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    s = summarize(path)
    (row,) = s.comm
    assert (row.collective, row.phase, row.calls) == ("all_gather", "backward", 1)
    assert row.total_us == pytest.approx(570.0) and row.exposed_us == pytest.approx(570.0)
    (rank,) = s.ranks
    assert rank.compute_us == pytest.approx(50.0 + 50.0)  # the node's own 100 us, of which aten::mm 30
