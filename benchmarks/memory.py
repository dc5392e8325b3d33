"""What fills GPU memory at the peak of a GPT-2 small training step, as kprof explains it, checked against the CUDA
allocator: the GPT of ``kprof_callbacks.models`` (124M parameters, batch 8 x 512 tokens, bf16 autocast, fused AdamW)
under ``kprof.session(profile_memory=True, record_shapes=True)``.

- the breakdown at the peak (kinds alive, from the trace's memory events) against ``torch.cuda.max_memory_allocated``
  over the same profiled steps: within 5%. The session's memory scalars reset the allocator's peak at each
  ``s.step()``, so each step's peak is read as the step ends, before ``s.step()`` (a peak read once after the
  session is only that of the time after its last sample: 1.5 of 4.9 GB on an H100);
- the loss head's logits ([tokens, vocab]) named among the blocks at the peak, with their size;
- a second run with activation checkpointing of the blocks (``torch.utils.checkpoint``): the activations' share
  moves, and ``kprof.diff`` of the two says so (and the memory gate would fail the reverse);
- a forced out-of-memory error (the batch doubled until the allocator fails): the report names the step, the phase
  and the biggest holders, and the error reaches the caller as torch raised it;
- what recording the allocator's history (``oom_snapshot=True``) costs a step.

    python benchmarks/memory.py --out benchmarks/results/memory-h100.json     # a GPU, ~3 min
    python benchmarks/memory.py --quick                                        # the tiny GPT on the CPU: the test
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import platform
import statistics
import sys
import tempfile
import traceback
from pathlib import Path

import torch

import kprof_callbacks as kprof
from kprof_callbacks import models
from kprof_callbacks.analysis import fmt

from _record import command, header

WINDOW = {"wait": 1, "warmup": 1, "active": 3}
TOLERANCE = 0.05


@dataclasses.dataclass(frozen=True)
class Setup:
    cfg: models.GPTConfig
    batch: int
    device: str

    def autocast(self) -> contextlib.AbstractContextManager:
        return torch.autocast("cuda", torch.bfloat16) if self.device == "cuda" else contextlib.nullcontext()


def _model(setup: Setup, checkpoint: bool) -> tuple[models.GPT, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = models.GPT(setup.cfg).to(setup.device)
    if checkpoint:
        for block in model.blocks:
            forward = block.forward
            block.forward = lambda x, f=forward: torch.utils.checkpoint.checkpoint(f, x, use_reentrant=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=setup.device == "cuda")
    return model, opt


def _step(setup: Setup, model, opt, batch: tuple[torch.Tensor, torch.Tensor]) -> None:
    with setup.autocast():
        loss = model(*batch)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _allocator_peak(setup: Setup, reset: bool = False) -> int | None:
    """The CUDA allocator's highest allocated bytes since its last reset (host-side counters: no sync), then reset
    it when ``reset``; None on a CPU, whose allocator keeps no such count."""
    if setup.device != "cuda":
        return None
    peak = torch.cuda.max_memory_allocated()
    if reset:
        torch.cuda.reset_peak_memory_stats()
    return peak


def profiled(logdir: Path, run: str, setup: Setup, checkpoint: bool) -> tuple[kprof.Summary, dict[int, int | None]]:
    """One profiled run; its Summary and, by step number, the allocator's highest allocated in each step."""
    model, opt = _model(setup, checkpoint)
    batches = models.random_batches(setup.cfg, n=sum(WINDOW.values()), batch=setup.batch, device=setup.device)
    peaks: dict[int, int | None] = {}
    with kprof.session(logdir, run=run, model=model, profile_memory=True, record_shapes=True, **WINDOW) as s:
        for i, batch in enumerate(batches):  # step i runs in the trace's ProfilerStep#i
            _allocator_peak(setup, reset=True)
            _step(setup, model, opt, batch)
            peaks[i] = _allocator_peak(setup)
            s.step()
    del model, opt
    if setup.device == "cuda":
        torch.cuda.empty_cache()
    return s.summary(), peaks


def _measured(memory, peaks: dict[int, int | None]) -> int | None:
    """The allocator's highest allocated over the steps the summary's memory rows are of (an error when the loop ran
    no such step: the two would not be of the same steps)."""
    missing = [s.step for s in memory.steps if s.step not in peaks]
    if missing:
        raise RuntimeError(f"the summary has memory rows of steps {missing} that the loop did not run")
    found = [peaks[s.step] for s in memory.steps if peaks[s.step] is not None]
    return max(found) if found else None


def breakdown(summary: kprof.Summary, peaks: dict[int, int | None], vocab: int) -> dict:
    """The peak explained: kinds at the highest profiled peak against the allocator's over the same steps, the loss
    head's blocks."""
    memory = summary.memory
    measured = _measured(memory, peaks)
    top = max(memory.steps, key=lambda s: s.peak)
    explained = sum(top.kinds.values())
    logits = [dataclasses.asdict(b) for b in memory.blocks if str(vocab) in b.shapes]
    return {
        "steps": [s.step for s in memory.steps],
        "highest_peak": top.peak,
        "explained": explained,
        "measured": measured,
        "measured_by_step": {s.step: peaks[s.step] for s in memory.steps},
        "error": None if not measured else explained / measured - 1.0,
        "within_tolerance": measured is None or abs(explained / measured - 1.0) <= TOLERANCE,
        "phase": top.phase,
        "where": top.where,
        "kinds": top.kinds,
        "shares": {k: v / top.peak for k, v in top.kinds.items() if v},
        "activations_share_median": memory.kind_median("activations") / memory.peak,
        "logits": logits,
        "findings": {d.kind: d.message for d in summary.diagnostics if d.kind.startswith("memory_")},
    }


def checkpointing(base: kprof.Summary, checkpointed: kprof.Summary) -> dict:
    """What ``kprof.diff`` says of the checkpointed run against the plain one, and the gate both ways."""
    d = kprof.diff(base, checkpointed)
    rows = {c.name: c for c in d.changes if c.kind == "memory"}
    activations = rows.get("kind: activations")
    return {
        "peak_change": d.memory.change if d.memory else None,
        "activations_row": None
        if activations is None
        else {"a": activations.a, "b": activations.b, "status": activations.status},
        "gate_5pct": d.more_memory(5),
        "reverse_gate_5pct": kprof.diff(checkpointed, base).more_memory(5),
        "diff_memory_rows": [
            f"{c.name}: {fmt.size(c.a)} -> {fmt.size(c.b)} ({c.status})"
            for c in d.changes
            if c.kind == "memory" and c.significant
        ][:8],
    }


def forced_oom(logdir: Path, setup: Setup) -> dict:
    """Double the batch until the allocator fails, under a session with oom_snapshot=True; what reached the caller and
    what the report says."""
    model, opt = _model(setup, checkpoint=False)
    batch, error = setup.batch, None
    try:
        with kprof.session(logdir, run="oom", oom_snapshot=True, wait=100, scalars=False) as s:
            while True:
                (pair,) = models.random_batches(setup.cfg, n=1, batch=batch, device=setup.device)
                _step(setup, model, opt, pair)
                s.step()
                batch *= 2
    except torch.OutOfMemoryError as exc:
        error = exc
    frames = traceback.extract_tb(error.__traceback__)
    report = next((logdir / "oom").glob("*.oom.txt"))
    out = {
        "batch": batch,
        "type": type(error).__name__,
        "message": str(error)[:200],
        "context": repr(error.__context__),
        "notes": getattr(error, "__notes__", None),
        "kprof_frames": [f"{f.filename}:{f.lineno}" for f in frames if "kprof_callbacks" in f.filename],
        "innermost": f"{Path(frames[-1].filename).name}:{frames[-1].lineno} in {frames[-1].name}",
        "report": str(report),
        "report_head": report.read_text().splitlines()[:14],
    }
    del model, opt, error
    torch.cuda.empty_cache()
    return out


def history_cost(setup: Setup, steps: int = 30) -> dict:
    """Median step time (ms) without and with the allocator's history recorded (oom_snapshot=True), no window."""
    out = {}
    for on in (False, True):
        model, opt = _model(setup, checkpoint=False)
        batches = models.random_batches(setup.cfg, n=4, batch=setup.batch, device=setup.device)
        with tempfile.TemporaryDirectory() as logdir:
            with kprof.session(logdir, wait=10**6, oom_snapshot=on, scalars=False) as s:
                for i in range(steps):
                    _step(setup, model, opt, batches[i % 4])
                    s.step()
        out["history" if on else "plain"] = statistics.median(s.step_times[5:]) * 1e3
        del model, opt
        torch.cuda.empty_cache()
    out["extra"] = out["history"] / out["plain"] - 1.0
    return out


def rows(result: dict) -> list[dict]:
    """The two profiled runs as the results table shows them (sizes as kprof prints them)."""
    out = []
    for name, key in (("plain", "baseline"), ("checkpointed blocks", "checkpointed")):
        r = result[key]
        out.append(
            {
                "run": name,
                "highest_peak": fmt.size(r["highest_peak"]),
                "explained": fmt.size(r["explained"]),
                "measured": fmt.size(r["measured"]) if r["measured"] else None,
                "error": r["error"],
                **{kind: r["shares"].get(kind, 0.0) for kind in ("activations", "temporaries", "optimizer_state")},
                "at": f"{r['phase']} at {r['where']}",
            }
        )
    return out


def _table(result: dict) -> str:
    b = result["baseline"]
    lines = [
        "| run | highest peak | explained (kinds) | allocator's max | error | activations | phase at the peak |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows(result):
        error = f"{r['error']:+.2%}" if r["error"] is not None else "-"
        lines.append(
            f"| {r['run']} | {r['highest_peak']} | {r['explained']} | {r['measured'] or '-'} | {error} "
            f"| {r['activations']:.0%} | {r['at']} |"
        )
    lines.append("")
    for block in b["logits"][:3]:
        lines.append(
            f"loss head: {fmt.size(block['bytes'])} {block['kind']} from {block['op']} ({block['inner']}) "
            f"of input {block['shapes']} in {block['where']}"
        )
    d = result["diff"]
    lines.append(f"diff (checkpointed against plain): peak {d['peak_change']:+.1%}; {'; '.join(d['diff_memory_rows'])}")
    if "oom" in result:
        o = result["oom"]
        lines.append(f"out of memory at batch {o['batch']}: {o['type']}; report {o['report']}:")
        lines += [f"    {line}" for line in o["report_head"][:6]]
    if "history_cost" in result:
        h = result["history_cost"]
        lines.append(f"oom_snapshot=True: {h['plain']:.1f} -> {h['history']:.1f} ms a step ({h['extra']:+.1%})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the tiny GPT on the CPU, no out-of-memory run")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    if not args.quick and not torch.cuda.is_available():
        parser.error("needs a CUDA device (--quick runs the tiny GPT on the CPU)")
    cfg = models.tiny() if args.quick else models.gpt2_small()
    setup = Setup(cfg, 2 if args.quick else 8, "cpu" if args.quick else "cuda")
    result: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        logdir = Path(tmp)
        base, peaks = profiled(logdir, "plain", setup, checkpoint=False)
        ckpt, peaks_ckpt = profiled(logdir, "checkpointed", setup, checkpoint=True)
        result["baseline"] = breakdown(base, peaks, cfg.vocab_size)
        result["checkpointed"] = breakdown(ckpt, peaks_ckpt, cfg.vocab_size)
        result["diff"] = checkpointing(base, ckpt)
        if setup.device == "cuda":
            result["history_cost"] = history_cost(setup)
            result["oom"] = forced_oom(logdir, setup)
    print(_table(result))
    if args.out:
        device = torch.cuda.get_device_name() if setup.device == "cuda" else f"cpu ({platform.machine()})"
        doc = {
            **header(device, command("memory.py", argv)),
            "workload": f"GPT {cfg.n_layer}x{cfg.n_embd}, vocab {cfg.vocab_size}, batch {setup.batch} x "
            f"{cfg.block_size}, {'bf16 autocast, fused AdamW' if setup.device == 'cuda' else 'fp32, AdamW'}",
            **result,
            "rows": rows(result),
        }
        args.out.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    ok = result["baseline"]["within_tolerance"] and result["diff"]["reverse_gate_5pct"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
