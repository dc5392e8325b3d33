"""kprof's reader of CUDA allocator snapshots: plain values only (no code runs), streamed entry by entry, the same
values as pickle.loads in every protocol; the summary of a snapshot's history (its peak and what was alive then),
and the summary saved beside a snapshot."""

from __future__ import annotations

import os
import pickle
import random

import pytest

from kprof_callbacks.analysis import pickles, snapshot

FIELDS = (
    "action",
    "addr",
    "size",
    "stream",
    "time_us",
    "frames",
    "compile_context",
    "user_metadata",
    "device_free",
    "x",
)


def _frames(line: int, own: str = "/home/me/train.py") -> list[dict]:
    return [
        {"filename": "/usr/lib/python3/site-packages/torch/nn/modules/linear.py", "line": 125, "name": "forward"},
        {"filename": own, "line": line, "name": "step"},
    ]


def _history(n: int, seed: int = 0) -> list[dict]:
    """Entries laid out as torch writes them, frames shared between entries as torch shares them."""
    rng = random.Random(seed)
    frames = [_frames(k) for k in range(60)]
    return [
        {
            "action": rng.choice(["alloc", "free_requested", "free_completed", "segment_alloc"]),
            "addr": 0x7F0000000000 + 512 * k,
            "size": rng.randrange(1, 1 << 40),
            "stream": rng.choice([0, 2**60, 300, 70_000, -7, -(2**40), -(2**63)]),  # each way pickle writes an int
            "time_us": 1_700_000_000_000_000 + k,
            "x": rng.choice([0.0, -0.0, 1.5, -2.25]),  # a float (not in torch's snapshots): told apart from -0.0
            "tags": [],  # a list before the frames: the memo counts it
            "frames": list(frames[rng.randrange(60)]) if rng.random() < 0.5 else frames[rng.randrange(60)],
            "compile_context": "",
            "user_metadata": "",
        }
        for k in range(n)
    ]


def _entries(got: list, reader: pickles.Reader) -> list:
    """What the reader handed on, as (device, the values of FIELDS with frames decoded) per entry: runs of entries
    (`pickles.Run`) taken apart."""
    out = []
    for device, values in got:
        if not isinstance(values, pickles.Run):
            out.append(
                (
                    device,
                    tuple(reader.resolve(v) if f == "frames" and v is not None else v for f, v in zip(FIELDS, values)),
                )
            )
            continue
        for i, start in enumerate(values.starts.tolist()):
            row = []
            for f in FIELDS:
                column = values.columns.get(f)
                if f in values.lists:
                    row.append(reader.resolve(reader.list_at(start, f)))
                elif isinstance(column, pickles.Coded):
                    row.append(column.values[column.index[i]])
                else:
                    row.append(None if column is None else int(column[i]))
            out.append((device, tuple(row)))
    return out


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_the_reader_streams_the_same_values_as_pickle_in_every_protocol(tmp_path, protocol):
    history = _history(3000)
    history.insert(7, {"action": "oom", "size": 5, "device_free": 3, "frames": _frames(1)})
    value = {
        "segments": [{"device": 0, "blocks": [{"size": 3, "frames": _frames(2)}], "t": (1, 2.5, None, True)}],
        "device_traces": [history, [dict(e) for e in history[:10]], []],  # torch shares no entry between lists
        "allocator_settings": {"a": -5, "f": 1.5e300, "l": 2**100},
    }
    if protocol >= 4:
        value["extras"] = {"set": {1, 2}, "bytes": b"xy", "frozen": frozenset([3])}
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(value, protocol=protocol))
    got = []
    rest, reader = pickles.read(path, lambda device, entry: got.append((device, entry)), FIELDS)
    expected = [(d, tuple(e.get(f) for f in FIELDS)) for d, trace in ((0, history), (1, history[:10])) for e in trace]
    assert repr(_entries(got, reader)) == repr(expected)  # repr: 0.0 and -0.0 differ
    assert rest == {**pickle.loads(path.read_bytes()), "device_traces": [[], [], []]}
    assert reader.fast > (2000 if protocol >= 4 else -1)  # the template reads most entries of protocol 4 and 5


class _Evil:
    def __reduce__(self):
        return (os.system, (f"touch {_Evil.marker}",))


@pytest.mark.parametrize("protocol", [2, 4])
def test_the_reader_refuses_a_pickle_that_names_code_and_runs_none(tmp_path, protocol):
    _Evil.marker = tmp_path / "pwned"
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps({"segments": [_Evil()], "device_traces": []}, protocol=protocol))
    with pytest.raises(pickles.PickleError, match="builds something other than plain values"):
        pickles.read(path, lambda *a: None, FIELDS)
    assert not _Evil.marker.exists()
    assert snapshot.summaries([path])[0]["error"].startswith("PickleError")


@pytest.mark.parametrize("data", [b"", b"not a pickle", pickle.dumps({"a": [1, 2, 3]})[:-5]])
def test_broken_files_are_errors_that_say_so(tmp_path, data):
    path = tmp_path / "bad.pickle"
    path.write_bytes(data)
    with pytest.raises(pickles.PickleError):
        pickles.read(path, lambda *a: None, FIELDS)


def _snapshot_value() -> dict:
    """A device whose history peaks at 7 MB: 1 MB from before the history freed late, 2 MB and 4 MB allocated by
    train.py lines 10 and 20; a segment of 16 MB holds what is left at the end (the 4 MB block and one from before
    the history never freed, 3 MB)."""
    mb = 2**20
    history = [
        {"action": "segment_alloc", "addr": 0, "size": 8 * mb, "frames": []},
        {"action": "alloc", "addr": 0x100, "size": 2 * mb, "frames": _frames(10), "time_us": 1},
        {"action": "alloc", "addr": 0x200, "size": 4 * mb, "frames": _frames(20), "time_us": 2},
        {"action": "oom", "size": 64 * mb, "device_free": mb, "frames": _frames(30), "time_us": 3},
        {"action": "free_requested", "addr": 0x100, "size": 2 * mb, "frames": [], "time_us": 4},
        {"action": "free_completed", "addr": 0x100, "size": 2 * mb, "frames": [], "time_us": 5},
        {"action": "free_requested", "addr": 0x900, "size": 1 * mb, "frames": [], "time_us": 6},
    ]
    for entry in history:
        entry.setdefault("time_us", 0)
    blocks = [
        {"size": 4 * mb, "state": "active_allocated", "frames": _frames(20)},
        {"size": 3 * mb, "state": "active_allocated", "frames": _frames(5)},
        {"size": 9 * mb, "state": "inactive", "frames": []},
    ]
    return {
        "segments": [{"device": 0, "address": 0, "total_size": 16 * mb, "blocks": blocks}],
        "device_traces": [history],
    }


def test_a_snapshot_summary_finds_the_peak_and_what_held_it(tmp_path):
    mb = 2**20
    path = tmp_path / "w.memory_snapshot.pickle"
    value = _snapshot_value()
    path.write_bytes(pickle.dumps(value))
    (device,) = snapshot.summarize(path)["devices"]
    # allocated at the end: 7 MB; before the history: 7 + 1 (freed at the end) + 2 (freed) - 2 - 4 = 4 MB
    assert device["peak"] == 4 * mb + 2 * mb + 4 * mb and device["peak_at"] == 2
    assert device["allocated_end"] == 7 * mb and device["reserved_end"] == 16 * mb
    assert device["reserved_at_peak"] == 16 * mb and device["largest_free"] == 9 * mb
    assert device["unseen_at_peak"] == 3 * mb  # the block from before the history that is never freed
    assert [(b["size"], b["site"]) for b in device["blocks"]] == [
        (4 * mb, "train.py:20 in step"),
        (2 * mb, "train.py:10 in step"),
        (1 * mb, "(allocated before the history)"),
    ]
    assert device["oom"] == [{"size": 64 * mb, "device_free": mb, "time_us": 3, "site": "train.py:30 in step"}]
    assert device["x"] == "time_us" and max(p[1] for p in device["curve"]) == device["peak"]
    assert snapshot.summarize_value(value, path)["devices"] == [device]


def test_the_summary_saved_beside_a_snapshot_is_used_while_the_snapshot_is_unchanged(tmp_path):
    path = tmp_path / "w.memory_snapshot.pickle"
    path.write_bytes(pickle.dumps(_snapshot_value()))
    saved = snapshot.save_beside({"path": str(path), "devices": [{"device": 0, "peak": 123}]}, path)
    assert saved.name == "w.memory_snapshot.pickle.summary"
    assert snapshot.summarize(path)["devices"] == [{"device": 0, "peak": 123}]
    path.write_bytes(pickle.dumps(_snapshot_value()) + b"")
    os.utime(path, ns=(1, 1))  # the snapshot changed: its summary is made again
    assert snapshot.summarize(path)["devices"][0]["peak"] == 10 * 2**20


def test_the_benchmarks_synthetic_snapshot_is_a_pickle_torch_could_have_written(tmp_path):
    """benchmarks/memory_view.py writes its 1 GB snapshot by hand: pickle.loads reads it as torch's layout, and
    kprof's reader streams the same entries, most of them by its template."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from memory_view import KEYS, synthetic_snapshot

    path = tmp_path / "w.memory_snapshot.pickle"
    n = synthetic_snapshot(path, 400_000)
    value = pickle.loads(path.read_bytes())
    (history,) = value["device_traces"]
    assert len(history) == n and all(set(e) == set(KEYS) for e in history)
    assert all(isinstance(f, dict) and {"filename", "line", "name"} == set(f) for f in history[3]["frames"])
    got = []
    _, reader = pickles.read(path, lambda device, entry: got.append((device, entry)), FIELDS)
    assert _entries(got, reader) == [(0, tuple(e.get(f) for f in FIELDS)) for e in history]
    assert reader.fast == n - 1
    (device,) = snapshot.summarize(path)["devices"]
    in_use = sum(b["size"] for b in value["segments"][0]["blocks"] if b["state"] == "active_allocated")
    assert device["allocated_end"] == in_use and device["peak"] >= in_use


def _paired_history(n: int, seed: int = 0) -> list[dict]:
    """Allocations freed later (some never), segments, an out-of-memory event, as torch lays them out: a block's
    free shares the frames list of its allocation."""
    rng = random.Random(seed)
    stacks = [_frames(k, own=f"/home/me/m{k % 3}.py") for k in range(40)]
    live: list[dict] = []
    out = []
    for k in range(n):
        t = 1_700_000_000_000_000 + k
        if k == n // 3:
            out.append({"action": "oom", "device_free": 3, "size": 2**30, "frames": stacks[0], "time_us": t})
        elif live and (rng.random() < 0.45 or len(live) > 200):
            block = live.pop(rng.randrange(len(live)))
            out.append({**block, "action": rng.choice(["free_requested", "free_completed"]), "time_us": t})
        else:
            kind = "segment_alloc" if rng.random() < 0.05 else "alloc"
            size = rng.randrange(1, 1 << 34)
            block = {"action": kind, "addr": 0x7F0000000000 + 512 * k, "size": size, "stream": 0, "time_us": t}
            block["frames"] = list(rng.choice(stacks))
            out.append(block)
            live += [block] if kind == "alloc" else []
    for entry in out:
        entry.update(compile_context="", user_metadata="")
    return out


def test_a_summary_read_by_the_template_is_the_one_the_pickle_machine_reads(tmp_path):
    """Protocol 2 is read opcode by opcode, 4 and 5 mostly by the template (runs of entries as columns): the same
    summary, and the same as the snapshot's value summarized in memory."""
    history = _paired_history(6000)
    blocks = [{"size": 2**20, "state": "active_allocated", "frames": history[5]["frames"]}]
    value = {"segments": [{"device": 0, "total_size": 2**40, "blocks": blocks}], "device_traces": [history]}
    found = {}
    for protocol in (2, 4, 5):
        path = tmp_path / f"p{protocol}.pickle"
        path.write_bytes(pickle.dumps(value, protocol=protocol))
        found[protocol] = {k: v for k, v in snapshot.summarize(path).items() if k not in ("path", "bytes")}
    (device,) = found[2]["devices"]
    assert device["oom"][0]["site"] == "m0.py:0 in step" and device["growing"] and len(device["blocks"]) == 20
    assert found[4] == found[2] == found[5]
    in_memory = snapshot.summarize_value(value, tmp_path / "p2.pickle")
    assert {k: v for k, v in in_memory.items() if k not in ("path", "bytes")} == found[2]


def test_a_snapshot_read_once_keeps_its_summary_beside_it_where_it_can(tmp_path, monkeypatch):
    path = tmp_path / "elsewhere.pickle"
    path.write_bytes(pickle.dumps(_snapshot_value(), protocol=4))
    first = snapshot.summarize(path)
    assert (tmp_path / "elsewhere.pickle.summary").is_file()
    monkeypatch.setattr(pickles, "read", lambda *a: pytest.fail("read again"))
    assert snapshot.summarize(path) == first
    monkeypatch.undo()
    (tmp_path / "elsewhere.pickle.summary").unlink()
    busy = tmp_path / "elsewhere.pickle.summary"
    busy.mkdir()  # where the summary would go cannot be written (as a folder kprof may not write to)
    assert snapshot.summarize(path) == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere.pickle", "elsewhere.pickle.summary"]
