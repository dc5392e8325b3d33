"""How fast does the kprof tab show the memory of a run with a big CUDA allocator snapshot? A synthetic snapshot of
--gigabytes (1 by default) is written as torch writes one (a pickle of plain dicts: an allocation history whose
entries each carry a new list of memoized frames), beside a small profiled run; TensorBoard serves the logdir, and
headless Chromium opens the run's page: the first memory view drawn (a big snapshot from elsewhere: its end state,
marked partial, while the plugin reads its history), and the full view (its curve and the snapshot's summary).

Three cases: the snapshot as kprof saves it (its summary beside it, `snapshot.save_beside`), a snapshot from
elsewhere opened the first time (no summary: the plugin reads it with kprof's streaming reader in a process of its
own and writes the summary beside it), and the same opened again by a new TensorBoard (the summary found beside it).
Also the reader on its own: seconds and MB/s, and the resident memory of the process that read it.

    python benchmarks/memory_view.py                      # 1 GB, ~2 min (writing the file, reading it twice)
    python benchmarks/memory_view.py --quick              # 20 MB: the test
    python benchmarks/memory_view.py --gigabytes 1.1 --out benchmarks/results/memory_view-cpu.json  # over 1 GiB
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from _record import command, header

KEYS = ("action", "addr", "size", "stream", "time_us", "compile_context", "user_metadata", "frames")  # torch's order
SEGMENT_WORDS = ("device", "address", "total_size", "blocks", "requested_size", "state", "active_allocated")
SEGMENT_WORDS += ("inactive", "allocator_settings", "expandable_segments")
FRAMES, DEPTH, POOL = 4000, 100, 512  # distinct frames, frames per entry, distinct stacks
MB = 2**20
PAGE_BUDGET_MS = 900  # virtual ms Chromium gives the page: under memory.js's 1 s between asks for a partial view
CASES = (
    "saved by kprof (summary beside it)",
    "from elsewhere, first open (read by the plugin)",
    "from elsewhere, opened again (summary kept beside it)",
)


def _str(text: str) -> bytes:
    raw = text.encode()
    return b"\x8c" + bytes([len(raw)]) + raw + b"\x94"  # SHORT_BINUNICODE, MEMOIZE


def _ref(index: int) -> bytes:
    return b"h" + bytes([index]) if index < 256 else b"j" + index.to_bytes(4, "little")


def _long(value: int) -> bytes:
    raw = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw


class _Pickle:
    """Opcodes of a protocol-4 pickle written by hand, counting what is memoized (every string, dict and list)."""

    def __init__(self) -> None:
        self.out = bytearray(b"\x80\x04}\x94(")  # the top dict, and the mark of its items
        self.memo = 1
        self.refs: dict[str, bytes] = {}

    def strings(self, *texts: str, keep: bool = False) -> None:
        """Memoize each text (popped unless it is one of the top dict's keys); ``refs[text]`` refers to it."""
        for text in texts:
            self.out.extend(_str(text) + (b"" if keep else b"0"))
            self.refs[text] = _ref(self.memo)
            self.memo += 1

    def entry(self, i: int, action: str, addr: int, size: int, frames: bytes) -> bytes:
        """A history entry as torch writes it (its frames last); ``frames``: the references of its new list."""
        r = self.refs
        self.memo += 2  # the entry, its list of frames
        numbers = r["addr"] + _long(addr) + r["size"] + _long(size) + r["stream"] + b"K\x00"
        tail = r["compile_context"] + r[""] + r["user_metadata"] + r[""]
        head = b"}\x94(" + r["action"] + r[action] + numbers + r["time_us"] + _long(1_700_000_000_000_000 + i)
        return head + tail + r["frames"] + b"]\x94(" + frames + b"eu"

    def frames(self) -> tuple[bytes, list[int]]:
        """FRAMES new frame dicts (every 40th in the program's own train.py), memoized from here on, and the memo
        index of each."""
        made, ids = [], []
        for k in range(FRAMES):
            file = "/home/me/train.py" if k % 40 == 0 else f"/usr/lib/python3/site-packages/torch/nn/mod{k % 97}.py"
            r = self.refs
            ids.append(self.memo)
            name = _str(f"fn{k}")
            made.append(b"}\x94(" + r["filename"] + _str(file) + r["line"] + b"J" + k.to_bytes(4, "little"))
            made.append(r["name"] + name + b"u")
            self.memo += 3
        return b"".join(made), ids


def _history(entries: int, seed: int):
    """The history's events (index, action, address, size): blocks allocated and freed at random, up to 256 alive;
    ends with the blocks alive at its end as its last item (a list of (index, address, size))."""
    rng = np.random.default_rng(seed)
    sizes = (rng.integers(1, 64, 4096) * 512 * 1024).tolist()
    live: list[tuple[int, int, int]] = []
    for i in range(entries):
        if not live or (len(live) < 256 and rng.random() < 0.5):
            live.append((i, 0x7F0000000000 + 4096 * i, sizes[i % 4096]))
            yield i, "alloc", *live[-1][1:]
        else:
            yield i, "free_requested", *live.pop(int(rng.integers(len(live))))[1:]
    yield live


def synthetic_snapshot(path: Path, target_bytes: int, seed: int = 0) -> int:
    """Write a protocol-4 snapshot of about ``target_bytes`` as torch's ``_dump_snapshot`` lays one out: a top dict
    with ``segments`` (one segment holding the blocks alive at the end, each with its frames), ``device_traces`` (one
    device whose history allocates and frees blocks, each entry with a new list of 100 memoized frames) and
    ``allocator_settings``, in that order; the frame dicts are made where first pickled, in the segments. Returns the
    number of entries."""
    entries = max(2, target_bytes // (85 + 5 * DEPTH))
    allocated = peak = 0
    *events, live = _history(entries, seed)
    for _, action, _, size in events:
        allocated += size if action == "alloc" else -size
        peak = max(peak, allocated)
    del events
    p = _Pickle()
    p.strings(*KEYS, "filename", "line", "name", "alloc", "free_requested", "", *SEGMENT_WORDS)
    p.strings("segments", keep=True)
    segments, stacks = _segments(p, live, reserved=peak + peak // 4)  # a quarter more cached than the peak
    p.out.extend(segments)
    p.strings("device_traces", keep=True)
    p.out.extend(b"]\x94]\x94(")  # the list of devices, device 0's history, the mark of its first batch
    p.memo += 2
    with path.open("wb") as f:
        f.write(p.out)
        for i, action, addr, size in _history(entries, seed):
            f.write(p.entry(i, action, addr, size, stacks[i % POOL]) + (b"e(" if i % 1000 == 999 else b""))
            if i == entries - 1:
                break
        settings = b"}\x94" + p.refs["expandable_segments"] + b"\x89s"
        f.write(b"ea" + _str("allocator_settings") + settings + b"u.")  # the last batch, the history, the settings
    return entries


def _segments(p: _Pickle, live: list[tuple[int, int, int]], reserved: int) -> tuple[bytes, list[bytes]]:
    """The list under ``segments``: one segment of ``reserved`` bytes holding the blocks alive at the end, each with
    the frames of the entry that allocated it (the first block's list makes every frame dict; with no block alive,
    the free one's), the rest of it free; and the POOL stacks the history's entries draw from."""
    ref, rng = p.refs, np.random.default_rng(len(live))
    p.memo += 3  # the list of segments, the segment, its list of blocks
    blocks, stacks = [], []
    for i, addr, size in [*live, (-1, 0, reserved - sum(size for _, _, size in live))]:
        p.memo += 2  # the block, its list of frames
        frames = b""
        if not stacks:
            frames, ids = p.frames()
            stacks = [b"".join(_ref(ids[k]) for k in rng.choice(FRAMES, DEPTH, replace=False)) for _ in range(POOL)]
        state = ref["inactive"] if i < 0 else ref["active_allocated"]
        frames = frames or (b"" if i < 0 else stacks[i % POOL])
        head = b"}\x94(" + ref["address"] + _long(addr) + ref["size"] + _long(size) + ref["requested_size"]
        blocks.append(head + _long(size) + ref["state"] + state + ref["frames"] + b"]\x94(" + frames + b"eu")
    total = ref["total_size"] + _long(reserved)
    segment = b"}\x94(" + ref["device"] + b"K\x00" + ref["address"] + _long(0x7F0000000000) + total + ref["blocks"]
    return b"]\x94" + segment + b"]\x94(" + b"".join(blocks) + b"eua", stacks


def _until(tb, full: bool) -> float:
    """Seconds until the plugin's /memory route has a view for the page (``full``: one with every snapshot read,
    none still shown by its end state): what a page waits for, in real time (a headless page's timers run in
    virtual time)."""
    started = time.perf_counter()
    while True:
        data = tb.get_json("data/plugin/kprof/memory", run="run")
        reading = not data.get("pending") and any("reading" in s for s in data["memory"]["snapshots"])
        if not data.get("pending") and not (full and reading):
            return time.perf_counter() - started
        time.sleep(0.1)


def _page_seconds(url: str, chromium: str, profile: Path) -> tuple[float, str]:
    """Seconds from Chromium's start until it printed the page with the memory view the plugin answered first
    drawn, and that page: it prints the page once PAGE_BUDGET_MS of virtual time passed with no request pending,
    before the page asks again (a view still partial is asked for every second)."""
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        f"--user-data-dir={profile}",
        f"--virtual-time-budget={PAGE_BUDGET_MS}",
        "--dump-dom",
    ]
    started = time.perf_counter()
    done = subprocess.run([chromium, *flags, url], capture_output=True, text=True, timeout=600)
    return time.perf_counter() - started, done.stdout


_READER = """
import json, sys, threading, time
from pathlib import Path
from kprof_callbacks.analysis import snapshot

peak = [0]
def anon() -> int:  # the process's own memory, not the file's pages it maps (VmRSS counts both)
    return int(next(l for l in open("/proc/self/status") if l.startswith("RssAnon")).split()[1]) * 1024
def watch() -> None:
    while True:
        peak[0] = max(peak[0], anon())
        time.sleep(0.05)
threading.Thread(target=watch, daemon=True).start()
t = time.perf_counter(); cpu = time.process_time()
summary = snapshot.summarize(Path(sys.argv[1]))
t, cpu = time.perf_counter() - t, time.process_time() - cpu
print(json.dumps({"seconds": t, "cpu_seconds": cpu, "anon_mb": max(peak[0], anon()) / 2**20}))
"""


def _reader(path: Path) -> dict:
    """kprof's reader on the snapshot, in a fresh process: seconds (wall and CPU), MB/s, and the peak of the
    process's own memory (anonymous pages, sampled every 50 ms; the file itself is mapped, not copied)."""
    done = subprocess.run([sys.executable, "-c", _READER, str(path)], capture_output=True, text=True, check=True)
    found = json.loads(done.stdout)
    found["mb_per_s"] = path.stat().st_size / MB / found["cpu_seconds"]
    return found


def _profiled_run(folder: Path) -> None:
    """A few profiled steps of a small model with memory events: the run the snapshot sits beside."""
    import torch

    import kprof_callbacks as kprof

    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with kprof.session(folder.parent, run=folder.name, wait=0, warmup=1, active=2, profile_memory=True) as s:
        for _ in range(4):
            model(torch.randn(32, 64)).square().mean().backward()
            opt.step()
            opt.zero_grad()
            s.step()


def measure(gigabytes: float, chromium: str | None) -> list[dict]:
    """Each case's row: the snapshot's size, the reader's time, and the page's time to draw the memory view."""
    from kprof_callbacks.analysis import snapshot

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        logdir = Path(tmp)
        run = logdir / "run"
        _profiled_run(run)
        path = run / "w.memory_snapshot.pickle"
        started = time.perf_counter()
        entries = synthetic_snapshot(path, int(gigabytes * 2**30))
        written = time.perf_counter() - started
        reader = _reader(path)
        beside = path.with_name(path.name + snapshot.SUMMARY_SUFFIX)
        for case in CASES:
            if case == CASES[0]:
                snapshot.save_beside(snapshot.summarize(path), path)
            elif case == CASES[1]:
                beside.unlink()
            elif chromium and not beside.is_file():  # without a browser no page asked the plugin to read it
                raise RuntimeError(f"the plugin kept no summary beside {path.name}")
            row = {
                "case": case,
                "snapshot_mb": round(path.stat().st_size / MB, 1),
                "entries": entries,
                "write_s": round(written, 2),
                "reader_s": round(reader["seconds"], 2),
                "reader_cpu_s": round(reader["cpu_seconds"], 2),
                "reader_mb_per_s": round(reader["mb_per_s"], 1),
                "reader_memory_mb": round(reader["anon_mb"], 1),
            }
            if chromium:
                row.update(_views(logdir, chromium, len(rows)))
            rows.append(row)
            print(_line(row), flush=True)
    return rows


def _views(logdir: Path, chromium: str, k: int) -> dict:
    """Seconds from TensorBoard's start until the page drew its first memory view (``first_s``: a snapshot still
    being read shown by its end state, ``partial``), and until it drew the full one (``full_s``: the plugin done
    reading, then a page drawn; the same as first_s when the first view was full)."""
    from kprof_callbacks.tensorboard.launch import TensorBoardServer

    with TensorBoardServer(logdir) as tb:
        url = f"{tb.url}data/plugin_entry.html?name=kprof#run=run"
        first = _until(tb, full=False)
        page, dom = _page_seconds(url, chromium, logdir / f"profile-{k}-first")
        partial = 'class="meta snapshot-partial"' in dom
        out = {"first_s": round(first + page, 2), "partial": partial, "drawn": 'id="memory-curve"' in dom}
        out["first_view"] = "end state (partial)" if partial else "full"
        if not partial:
            return {**out, "full_s": out["first_s"], "drawn": out["drawn"] and 'class="snapshot-curve"' in dom}
        full = first + page + _until(tb, full=True)
        page, dom = _page_seconds(url, chromium, logdir / f"profile-{k}-full")
        drawn = out["drawn"] and 'class="snapshot-curve"' in dom and 'id="memory-curve"' in dom
        return {**out, "full_s": round(full + page, 2), "drawn": drawn}


def _line(row: dict) -> str:
    page = "no chromium"
    if "first_s" in row:
        first = f"{row['first_s']:.2f} s ({'end state, partial' if row['partial'] else 'full'})"
        page = f"{first}, full view {row['full_s']:.2f} s{'' if row['drawn'] else ' NOT drawn'}"
    return (
        f"| {row['case']} | {row['snapshot_mb']:.0f} MB, {row['entries']:,} entries | {row['reader_s']:.2f} s "
        f"({row['reader_cpu_s']:.2f} s CPU, {row['reader_mb_per_s']:.0f} MB/s; {row['reader_memory_mb']:.0f} MB "
        f"of memory) | {page} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gigabytes", type=float, default=1.0, help="snapshot size (default 1)")
    parser.add_argument("--quick", action="store_true", help="a 20 MB snapshot: the test")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    chromium = shutil.which("chromium")
    print("| case | snapshot | kprof's reader | first memory view drawn, full view drawn |")
    print("|---|---:|---:|---:|")
    rows = measure(0.02 if args.quick else args.gigabytes, chromium)
    if args.out:
        import msgspec

        doc = {
            **header(
                f"CPU, {os.cpu_count()} cores ({platform.machine()}), load average {os.getloadavg()[0]:.1f}",
                command("memory_view.py", argv),
                numpy=np.__version__,
                msgspec=msgspec.__version__,
            ),
            "rows": rows,
        }
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
