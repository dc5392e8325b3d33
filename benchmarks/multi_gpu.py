"""Four GPUs, every rank: FSDP2, HSDP (a 2 x 2 mesh of replicate x shard) and DDP on 4 GPUs, each with and without a
straggler injected on rank 2, and Lightning's FSDP2 (ModelParallelStrategy) on 2 and 4 GPUs; each run summarized
with kprof and its claims checked: every rank present, HSDP's two levels of collectives told apart, the straggler
named (with the wait it causes) only where it was injected, and every rank's median step on one clock.

    python benchmarks/multi_gpu.py            # a 4-GPU host: benchmarks/results/{fsdp2,hsdp,ddp}-<gpu>x4.json
    python benchmarks/multi_gpu.py --quick    # the same runs on the CPU with gloo and tiny models (~2 min, 2 cores)

Results go to --out (default benchmarks/results/; with --quick nowhere unless asked) and to $OUT when it is set; the
traces stay in --logdir for the kprof tab (`kprof tensorboard LOGDIR`). Every child runs with NVLink multicast off
(NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1). Exit status 1 when a claim fails, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import kprof_callbacks as kprof
from kprof_callbacks.analysis import comm
from kprof_callbacks.analysis.ranktimeline import RunSlices

from _record import header

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
STRAGGLER = 2  # the rank made slow
NAMED = ("straggler", "late_rank")  # the findings that name a rank the others wait for


@dataclasses.dataclass(frozen=True)
class Run:
    """One launch: its run folder name, the results file it goes to, its command and what it should show."""

    name: str
    family: str  # fsdp2, hsdp or ddp: the results file
    argv: list[str]
    ranks: int
    injected: bool = False
    lightning: bool = False

    def folder(self, logdir: Path) -> Path:
        return (
            logdir / self.name / "lightning_logs" / "version_0" / "kprof" / "train"
            if self.lightning
            else logdir / self.name
        )


def runs(quick: bool, logdir: Path) -> list[Run]:
    """Every launch; with `quick`, tiny models on the CPU, and a straggler long enough to stand out of the noise of
    four processes sharing a few cores."""
    sizes = ["--layers", "2", "--width", "32", "--batch", "2", "--steps", "8"] if quick else ["--width", "2048"]
    sizes += [] if quick else ["--batch", "32", "--no-profile-memory"]
    slow = f"{STRAGGLER}:{300 if quick else 40}"
    ddp = ["--width", "64", "--steps", "12"] if quick else ["--width", "4096", "--batch", "4096"]  # compute-bound
    out = []
    for family, script, extra in (
        ("fsdp2", "fsdp2_loop.py", sizes),
        ("hsdp", "fsdp2_loop.py", [*sizes, "--replicate", "2"]),
        ("ddp", "ddp_loop.py", ddp),
    ):
        for injected in (False, True):
            name = f"{family}-straggler" if injected else family
            argv = [*_torchrun(4), str(ROOT / "examples" / script), "--logdir", str(logdir), "--name", name, *extra]
            out.append(Run(name, family, argv + (["--straggler", slow] if injected else []), 4, injected))
    for n in (2, 4):
        fit = [sys.executable, str(ROOT / "examples" / "fsdp2_fit.py"), "--root", str(logdir / f"lightning-{n}")]
        out.append(Run(f"lightning-{n}", "fsdp2", [*fit, "--devices", str(n), "--steps", "8"], n, lightning=True))
    return out


def _torchrun(ranks: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]


def launch(run: Run, env: dict[str, str], timeout: float) -> tuple[float, str]:
    """Run it; returns (seconds, "" or why it failed)."""
    started = time.perf_counter()
    try:
        done = subprocess.run(run.argv, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return time.perf_counter() - started, f"did not finish within {timeout:.0f} s"
    failed = f"exit {done.returncode}: {done.stderr.strip()[-1500:]}" if done.returncode else ""
    return time.perf_counter() - started, failed


def claims(run: Run, s: kprof.Summary, quick: bool) -> dict[str, str]:
    """Each claim of the run: "ok", "FAILED: why", or "not judged: why"."""
    out = {}
    ranks = sorted(r.rank for r in s.ranks if r.rank is not None)
    out["every rank"] = "ok" if ranks == list(range(run.ranks)) else f"FAILED: ranks {ranks} of {run.ranks}"
    named = {d.kind: d.message for d in s.diagnostics if d.kind in NAMED}
    unmatched = run.family == "hsdp" and quick and not any(c.group for c in s.comm)
    if run.injected:
        mine = [m for m in named.values() if m.startswith(f"Rank {STRAGGLER} ")]
        said = "ok" if mine else f"FAILED: findings name {sorted(named) or 'no rank'}"
        # gloo names no process group: HSDP's shard and replicate collectives of one kind cannot be matched apart,
        # so a wait at the replicate level may land on rank 2's shard partner
        out["straggler named"] = f"not judged: gloo traces name no process group ({said})" if unmatched else said
    elif not run.lightning:
        quiet = "ok" if not named else f"FAILED: {'; '.join(named.values())[:300]}"
        out["none named"] = f"not judged: {run.ranks} processes share the CPU ({quiet})" if quick else quiet
    if run.family == "hsdp":
        groups = {c.group for c in s.comm if c.group}
        kinds = {c.collective for c in s.comm}
        if unmatched:
            out["levels apart"] = f"not judged: gloo traces name no process group (collectives: {sorted(kinds)})"
        else:
            apart = {"mesh_shard", "mesh_replicate"} <= groups
            out["levels apart"] = "ok" if apart else f"FAILED: process groups {sorted(groups)}"
    return out


def timeline(s: kprof.Summary) -> dict:
    """Every rank's median step on one clock, as the tab and the report draw it: what it matched, and how long."""
    started = time.perf_counter()
    run = RunSlices(s.files)
    step = run.step(run.default_step(), skew=s.step_skew)
    return {
        "step": step.step,
        "ranks": len(step.ranks),
        "collectives": len(step.collectives),
        "straggler": step.straggler[0] if step.straggler else None,
        "waited_for": step.late[0] if step.late else None,
        "seconds": round(time.perf_counter() - started, 3),
    }


def row(run: Run, s: kprof.Summary, seconds: float, quick: bool) -> dict:
    """What the results file keeps of one run."""
    first = [r for r in s.steps if r.rank == 0]
    late = {r.rank: r.late_us for r in s.ranks}
    totals = comm.totals(s.comm, s.steps)
    return {
        "run": run.name,
        "command": " ".join(a.replace(f"{ROOT}/", "") for a in ["python", *run.argv[1:]]),
        "ranks": len(s.ranks),
        "step_ms": round(sum(r.wall_us for r in first) / max(len(first), 1) / 1000, 2),
        "exposed_comm_ms": round(sum(r.exposed_comm_us for r in s.ranks) / max(len(s.ranks), 1) / 1000, 2),
        "others_wait_for_rank2_ms": round(late.get(STRAGGLER, 0.0) / 1000, 2),
        "collectives": [
            {
                "collective": t.collective,
                "group": t.group,
                "phase": t.phase,
                "calls": round(t.calls, 1),
                "time_ms": round(t.total_us / 1000, 3),
                "exposed_ms": round(t.exposed_us / 1000, 3),
            }
            for t in totals
        ],
        "findings": sorted({d.kind for d in s.diagnostics if d.severity == "warning"}),
        "named": [d.message for d in s.diagnostics if d.kind in NAMED],
        "timeline": timeline(s),
        "claims": claims(run, s, quick),
        "seconds": round(seconds, 1),
    }


def device(quick: bool) -> tuple[str, str]:
    """(the device as results files say it, the tag in their names)."""
    if quick:
        return f"CPU ({os.cpu_count()} cores), gloo", "cpu"
    import torch

    name, count = torch.cuda.get_device_name(0), torch.cuda.device_count()
    tag = next((t for t in ("h100", "h200", "b200", "a100") if t in name.lower()), "gpu")
    return f"{count}x {name}, NCCL", f"{tag}x{count}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny models on the CPU with gloo (a smoke test)")
    parser.add_argument("--logdir", type=Path, default=Path("log-multi-gpu"), help="where the runs write traces")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default: benchmarks/results/)")
    parser.add_argument("--only", nargs="+", default=None, metavar="RUN", help="these runs alone (e.g. hsdp ddp)")
    args = parser.parse_args(argv)
    if not args.quick:
        import torch

        if torch.cuda.device_count() < 4:
            parser.error(f"needs 4 GPUs, this machine has {torch.cuda.device_count()}: use --quick for the CPU")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = dict(os.environ, **NO_MULTICAST)
    if args.quick:
        env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    logdir = args.logdir.resolve()
    planned = [r for r in runs(args.quick, logdir) if args.only is None or r.name in args.only]
    if not planned:
        print(f"no run named {args.only}", file=sys.stderr)
        return 2
    started, done = time.perf_counter(), []
    for run in planned:
        seconds, why = launch(run, env, 300 if args.quick else 240)
        print(f"{run.name}: {seconds:.0f} s{' ' + why if why else ''}", flush=True)
        result = (
            {"run": run.name, "error": why}
            if why
            else row(run, kprof.summarize(run.folder(logdir)), seconds, args.quick)
        )
        done.append((run.family, result))
    families: dict[str, list[dict]] = {}
    for family, result in done:
        families.setdefault(family, []).append(result)
    write(families, args, time.perf_counter() - started)
    print_table([result for _, result in done])
    failed = [r for _, r in done if "error" in r or any(c.startswith("FAILED") for c in r["claims"].values())]
    return 1 if failed else 0


def write(rows: dict[str, list[dict]], args: argparse.Namespace, seconds: float) -> None:
    """One results file per family, with commit, date, device, versions and command (the results of record's
    provenance, as benchmarks/tables.py reads it), a row per run."""
    name, tag = device(args.quick)
    folders = [args.out or (None if args.quick else RESULTS)] + (
        [Path(os.environ["OUT"])] if os.environ.get("OUT") else []
    )
    invocation = "python benchmarks/multi_gpu.py" + (" --quick" if args.quick else "")
    for family, items in rows.items():
        doc = {
            **header(name, invocation),
            "seconds": round(seconds, 1),
            "rows": items,
        }
        for folder in filter(None, folders):
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{family}-{tag}.json").write_text(json.dumps(doc, indent=1) + "\n")


def print_table(items: list[dict]) -> None:
    print(f"\n{'run':<18} {'ranks':>5} {'step':>9} {'exposed':>9} {'rank 2 waited for':>17}  claims")
    for r in items:
        if "error" in r:
            print(f"{r['run']:<18} failed: {r['error'][:100]}")
            continue
        said = ", ".join(f"{k} {v.split(':')[0]}" for k, v in r["claims"].items())
        print(
            f"{r['run']:<18} {r['ranks']:>5} {r['step_ms']:>6.1f} ms {r['exposed_comm_ms']:>6.1f} ms "
            f"{r['others_wait_for_rank2_ms']:>14.1f} ms  {said}"
        )


if __name__ == "__main__":
    sys.exit(main())
