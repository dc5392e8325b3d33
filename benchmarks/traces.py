"""Real GPU traces for the analysis benchmarks: record one, and scale one up to any size with its own event mix.

    python benchmarks/traces.py record gpt.pt.trace.json.gz      # on a GPU: GPT-2 small, 20 steps, ~100 MB of JSON
    python benchmarks/traces.py scale gpt.pt.trace.json.gz big.pt.trace.json --mb 1000

``record`` profiles GPT-2 small (``kprof_callbacks.models``, batch 8 x 512 tokens, AdamW) in bf16 autocast with
``record_shapes=True, with_stack=True``, as a user chasing a slow step would, and writes the chrome trace (gzipped
when the name ends in .gz). ``scale`` repeats a trace's timed events back to back until the file reaches ``--mb``:
each copy is shifted past the one before, with its step numbers, external ids, correlation ids and flow ids moved
past the copy before's, so the result reads as one longer profile with the same operators, kernels, Python frames
and their proportions. Events are copied as the bytes torch wrote, so the file is formatted as torch formats it and
its MB count the same events a real trace of that size holds. ``scale`` needs neither torch nor a GPU.
"""

from __future__ import annotations

import argparse
import gzip
import re
import sys
import tempfile
from pathlib import Path

import msgspec

# Fields rewritten in each copy; torch writes `"ts": 123.456` and integer ids, one space after the colon.
_TS = re.compile(rb'"ts": (-?\d+)(?:\.(\d{1,3}))?')
_IDS = re.compile(rb'"(External id|correlation|id)": (\d+)')
_STEP = re.compile(rb'"ProfilerStep#(\d+)"')
_TIMED = re.compile(rb'"ph": "[XisftbeC]"')
_SEP = b",\n  "  # between events, as torch writes them


def record(out: Path, steps: int = 20, batch: int = 8) -> Path:
    """Profile ``steps`` bf16 training steps of GPT-2 small on the GPU with shapes and stacks; write the trace."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    from kprof_callbacks import models

    cfg = models.gpt2_small()
    torch.manual_seed(0)
    model = models.GPT(cfg).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    batches = models.random_batches(cfg, n=4, batch=batch, device="cuda")
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "trace.json"
        with profile(
            activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
            record_shapes=True,
            with_stack=True,
            schedule=schedule(wait=1, warmup=2, active=steps, repeat=1),
            on_trace_ready=lambda prof: prof.export_chrome_trace(str(plain)),
        ) as prof:
            for i in range(steps + 3):
                idx, targets = batches[i % len(batches)]
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(idx, targets)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                prof.step()
        torch.cuda.synchronize()
        data = plain.read_bytes()
    out.write_bytes(gzip.compress(data, 6) if out.suffix == ".gz" else data)
    print(f"{out}: {len(data) / 2**20:.1f} MB of JSON, {steps} steps of GPT-2 small (bf16, shapes, stacks)")
    return out


def _read(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def _time_range(events: list[bytes]) -> tuple[int, int, int, int]:
    """(first ts, last ts + dur in ns, the largest id, the largest step number) of the timed events."""
    starts, ends, ids, step_numbers = [], [], [0], [0]
    for raw in events:
        ts = _TS.search(raw)
        if ts:
            start = _ns(ts)
            dur = re.search(rb'"dur": (\d+)(?:\.(\d{1,3}))?', raw)
            starts.append(start)
            ends.append(start + (_ns(dur) if dur else 0))
        ids.extend(int(m[2]) for m in _IDS.finditer(raw))
        step_numbers.extend(int(m[1]) for m in _STEP.finditer(raw))
    return min(starts), max(ends), max(ids), max(step_numbers)


def _ns(match: re.Match) -> int:
    """A matched `123.456` microseconds as integer nanoseconds."""
    whole, frac = match[1], match[2] or b""
    sign = -1 if whole.startswith(b"-") else 1
    return int(whole) * 1000 + sign * int(frac.ljust(3, b"0"))


def _shifted(blob: bytes, copy: int, shift_ns: int, id_step: int, step_step: int) -> bytes:
    """``blob`` (events joined by _SEP) as copy number ``copy``: times, ids and step numbers moved past the others."""
    if copy == 0:
        return blob

    def ts(m: re.Match) -> bytes:
        value = _ns(m) + copy * shift_ns
        return b'"ts": %d.%03d' % divmod(value, 1000)

    blob = _TS.sub(ts, blob)
    blob = _IDS.sub(lambda m: b'"%s": %d' % (m[1], int(m[2]) + copy * id_step), blob)
    return _STEP.sub(lambda m: b'"ProfilerStep#%d"' % (int(m[1]) + copy * step_step), blob)


def scale(source: Path, out: Path, mb: float) -> Path:
    """Write ``out``: ``source``'s timed events repeated back to back until the file holds about ``mb`` MB."""
    doc = msgspec.json.decode(_read(source), type=dict[str, msgspec.Raw])
    events = [bytes(e) for e in msgspec.json.decode(doc.pop("traceEvents"), type=list[msgspec.Raw])]
    timed = [e for e in events if _TIMED.search(e)]
    fixed = [e for e in events if not _TIMED.search(e)]  # process and thread names: once
    first, last, max_id, max_step = _time_range(timed)
    shift_ns = last - first + 1_000_000  # a millisecond between copies
    blob = _SEP.join(timed)
    copies = max(1, round(mb * 2**20 / (len(blob) + 2)))
    with out.open("wb") as f:
        f.write(b'{\n  "schemaVersion": 1,\n  "traceEvents": [\n  ')
        f.write(_SEP.join(fixed) + (_SEP if fixed else b""))
        for copy in range(copies):
            f.write((_SEP if copy else b"") + _shifted(blob, copy, shift_ns, max_id + 1, max_step + 1))
        f.write(b"\n  ]")
        for key, value in doc.items():
            if key != "schemaVersion":
                f.write(b',\n  "%s": %s' % (key.encode(), bytes(value)))
        f.write(b"\n}\n")
    print(f"{out}: {out.stat().st_size / 2**20:.1f} MB, {copies} copies of {source.name}'s {len(timed):,} timed events")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="profile GPT-2 small on the GPU (bf16, shapes, stacks) and write the trace")
    rec.add_argument("out", type=Path)
    rec.add_argument("--steps", type=int, default=20)
    rec.add_argument("--batch", type=int, default=8)
    grow = sub.add_parser("scale", help="repeat a trace's timed events until the file reaches --mb")
    grow.add_argument("source", type=Path)
    grow.add_argument("out", type=Path)
    grow.add_argument("--mb", type=float, required=True)
    args = parser.parse_args()
    if args.command == "record":
        record(args.out, args.steps, args.batch)
    else:
        scale(args.source, args.out, args.mb)
    return 0


if __name__ == "__main__":
    sys.exit(main())
