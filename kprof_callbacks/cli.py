"""The ``kprof`` command (also ``python -m kprof_callbacks``): every subcommand's arguments, wired here.

Each subcommand's work is a plain function beside the feature it drives, imported when that subcommand runs; this
module only parses, and imports neither torch nor the analysis (``kprof --help`` answers at once).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from .analysis import commands as analysis_commands
from .analysis.tables import SORT_KEYS
from .analysis.workers import default_jobs


def typed_command() -> str:
    """The kprof command as the user's shell runs it, for the commands kprof prints: ``kprof`` where PATH finds this
    installation's, else the script beside this Python (e.g. ``.venv/bin/kprof`` when the venv is not activated),
    else ``python -m kprof_callbacks`` through this Python."""
    script = Path(sys.executable).parent / "kprof"
    found = shutil.which("kprof")
    if found and script.is_file() and Path(found).resolve() == script.resolve():
        return "kprof"
    if script.is_file():
        return shlex.quote(_as_typed(script))
    return f"{shlex.quote(_as_typed(Path(sys.executable)))} -m kprof_callbacks"


def _as_typed(path: Path) -> str:
    """``path`` relative to the working folder when it lies inside it (``.venv/bin/kprof``), else absolute; never a
    bare name, which the shell would look up on PATH."""
    relative = os.path.relpath(path.absolute())
    if relative.startswith(".."):
        return str(path.absolute())
    return relative if os.sep in relative else f".{os.sep}{relative}"


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose description may come from a function called only when the help is shown: a
    subcommand's help can then describe things that take long to import (``kprof bench``'s ops need torch)."""

    def __init__(self, *args, describe: Callable[[], str] | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._describe = describe

    def format_help(self) -> str:
        if self._describe is not None:
            self.description, self._describe = self._describe(), None
        return super().format_help()


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


def _percent(text: str) -> float:
    value = float(text)
    if not 0.0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a percentage >= 0, got {text}")
    return value


def _formats(p: argparse.ArgumentParser, what: str) -> None:
    """--json and --markdown: one of them, or neither (text)."""
    group = p.add_mutually_exclusive_group()
    group.add_argument("--json", action="store_true", help=f"print the {what} as JSON instead of text")
    group.add_argument(
        "--markdown",
        action="store_true",
        help=f"print the {what} as GitHub-flavoured Markdown (a pull-request comment)",
    )


def _gate(p: argparse.ArgumentParser, against: str, machine: str = "") -> None:
    p.add_argument(
        "--fail-if-slower",
        type=_percent,
        metavar="PCT",
        help=f"exit status 3 when {against} significantly slower by more than PCT percent: the whole "
        f"confidence interval of the slowdown lies above PCT{machine} (docs/ci.md)",
    )


def _demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="train a small model under the profiler and print where the time went")
    p.add_argument("--logdir", default="log", help="where traces go (default: log)")
    p.add_argument("--steps", type=int, default=60, help="training steps (default: 60)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.set_defaults(func=_run_demo)


def _jobs(p: argparse.ArgumentParser) -> None:
    cores = default_jobs()
    p.add_argument(
        "--jobs",
        type=_positive,
        default=cores,
        metavar="N",
        help=f"worker processes reading big runs (default: the cores, {cores}; 1: read in this process)",
    )


def _summary(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "summary",
        help="summarize torch.profiler traces (a file, a run folder or a logdir)",
        description=analysis_commands.SUMMARY_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "logdir",
        type=Path,
        help="trace file (.pt.trace.json[.gz]), run folder, logdir of runs, or a summary saved with --json",
    )
    _formats(p, "tables (JSON: with the per-step rows kprof diff needs)")
    p.add_argument("--html", type=Path, metavar="OUT.html", help="also write a self-contained HTML report")
    p.add_argument("--top", type=_positive, default=10, metavar="N", help="rows per table (default 10)")
    p.add_argument(
        "--sort",
        choices=SORT_KEYS,
        default="cuda",
        help="sort operators by self CUDA time, self CPU time or self memory (default cuda; cpu without GPU events)",
    )
    p.add_argument(
        "--stacks",
        type=Path,
        metavar="OUT.folded",
        help="write flamegraph folded stacks of self CPU time (one file per run when several)",
    )
    _jobs(p)
    p.set_defaults(
        func=lambda a: analysis_commands.run_summary(
            a.logdir,
            as_json=a.json,
            markdown=a.markdown,
            html=a.html,
            top=a.top,
            sort=a.sort,
            stacks=a.stacks,
            jobs=a.jobs,
        )
    )


def _diff(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "diff",
        help="what changed between two runs, trace files or step selections (with CIs and verdicts)",
        description=analysis_commands.DIFF_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "a", help="the baseline: run folder, trace file, saved summary (kprof summary --json) or PATH@steps=SPEC"
    )
    p.add_argument("b", help="the run compared with it (same forms)")
    _formats(p, "diff")
    _gate(p, "B's step time is", "; 4 when B ran on a busier or throttled machine that slowed its step uniformly")
    p.add_argument("--html", type=Path, metavar="OUT.html", help="also write a self-contained HTML report")
    p.add_argument("--top", type=_positive, default=10, metavar="N", help="rows per table (default 10)")
    p.add_argument(
        "--confidence",
        type=_fraction,
        default=0.95,
        help="interval level; 1 - confidence is the false discovery rate (default 0.95)",
    )
    _jobs(p)
    p.set_defaults(
        func=lambda a: analysis_commands.run_diff(
            a.a,
            a.b,
            as_json=a.json,
            markdown=a.markdown,
            html=a.html,
            top=a.top,
            confidence=a.confidence,
            jobs=a.jobs,
            fail_if_slower=a.fail_if_slower,
        )
    )


def _tensorboard(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tensorboard", help="serve LOGDIR with TensorBoard on 127.0.0.1 and print the URL")
    p.add_argument("logdir", nargs="?", default="log", help="the logdir kprof wrote (default: log)")
    p.add_argument("--port", type=int, default=6006, help="port on 127.0.0.1 (default: 6006; 0 picks a free one)")
    p.set_defaults(func=_run_tensorboard)


def _compare(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare",
        help="time a model with and without kprof.swap (custom kernels) and check they agree",
        description="Train a model and its kprof.swap copy (or one copy per --impls choice: CUDA, C++, Triton or "
        "torch's own ops in the kprof layers) on the same batches, check that outputs and gradients agree, and print "
        "step times with a bootstrap confidence interval on the speedup. Exit status 0, 1 when a variant failed (its "
        "code raised, or the check), 2 for bad arguments, 3 for a regression (--fail-if-slower).",
    )
    p.add_argument(
        "--model",
        default="builtin",
        help="'builtin' (the demo ToyModel) or MODULE:ATTR naming a "
        "function f(device) that returns (model, step_fn, batches) (default: builtin)",
    )
    p.add_argument("--steps", type=int, default=50, help="timed steps per variant (default: 50)")
    p.add_argument("--warmup", type=int, default=5, help="untimed warm-up steps per variant (default: 5)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--logdir", default=None, help="also profile each variant into LOGDIR/<variant>/")
    p.add_argument(
        "--check", choices=("raise", "warn", "off"), default="raise", help="numerical check (default: raise)"
    )
    p.add_argument(
        "--impls",
        default="",
        help="comma-separated kprof.swap impls, one variant each beside the torch "
        "model, e.g. cuda,triton,torch (default: one swap whose kernels follow the device)",
    )
    p.add_argument(
        "--markdown", action="store_true", help="print the table as GitHub-flavoured Markdown (a pull-request comment)"
    )
    _gate(p, "a variant's timed steps are, against the baseline's,")
    builtin = p.add_argument_group("builtin model size")
    builtin.add_argument("--width", type=int, default=128, help="hidden width (default: 128)")
    builtin.add_argument("--depth", type=int, default=4, help="number of blocks (default: 4)")
    builtin.add_argument("--batch-size", type=int, default=64, help="batch size (default: 64)")
    p.set_defaults(func=_run_compare)


def _bench(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="time every custom layer (and its Triton twin) against eager PyTorch and torch.compile",
        describe=_bench_description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="small sizes on the CPU, a few iterations, no compile")
    p.add_argument("--check", action="store_true", help="correctness of every kernel on small shapes, no timing")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile reference")
    p.add_argument("--no-triton", action="store_true", help="skip the Triton twins (impl='triton')")
    p.add_argument("--largest", action="store_true", help="only each op's largest shape per dtype")
    p.add_argument("--ops", default="", help="comma-separated op names (default: all; listed above)")
    p.add_argument(
        "--shapes",
        choices=("full", "gpt"),
        default="full",
        help="full: large shapes of every op family (default); gpt: the shapes of GPT-2 small/medium",
    )
    p.add_argument("--out", type=Path, help="write the results as JSON here")

    def run(a: argparse.Namespace) -> int:
        from . import bench

        try:
            return bench.run(
                quick=a.quick,
                check_only=a.check,
                compile_ref=not a.no_compile,
                triton=not a.no_triton,
                largest_only=a.largest,
                ops=a.ops,
                shapes=a.shapes,
                out=a.out,
            )
        except ValueError as exc:
            p.error(str(exc))

    p.set_defaults(func=run)


def _run_demo(a: argparse.Namespace) -> int:
    from .demo import run_cli

    return run_cli(a.logdir, a.steps, a.device)


def _run_tensorboard(a: argparse.Namespace) -> int:
    from .tensorboard.launch import serve

    return serve(a.logdir, a.port)


def _run_compare(a: argparse.Namespace) -> int:
    from .compare.command import run_cli

    return run_cli(
        a.model,
        steps=a.steps,
        warmup=a.warmup,
        device=a.device,
        logdir=a.logdir,
        check=a.check,
        impls=a.impls,
        width=a.width,
        depth=a.depth,
        batch_size=a.batch_size,
        markdown=a.markdown,
        fail_if_slower=a.fail_if_slower,
    )


def _bench_description() -> str:
    from . import bench

    return f"{bench.__doc__}\nops: {', '.join(op.name for op in bench.OPS)}\n"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kprof", description="Profile PyTorch training and read the results.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_demo, _summary, _diff, _tensorboard, _compare, _bench):
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
