"""The ``kprof`` command (also ``python -m kprof_callbacks``): one registry of subcommands, each option declared once.

A ``Command`` names the function that does its work (``"module:function"``, imported only when that subcommand runs,
so ``kprof --help`` imports neither torch nor the analysis) and its ``Arg``s; each option's destination is that
function's keyword, so the parsed options are passed on as they are. The work functions live beside the features they
drive and return the exit status (``exits``).
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import importlib
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import exits
from .analysis import SORT_KEYS, default_jobs
from .checks import UsageError


@dataclasses.dataclass(frozen=True)
class Arg:
    """One argument: ``add_argument(*flags, **options)``, in the mutually exclusive group ``exclusive`` or the help
    section ``section`` when given."""

    flags: tuple[str, ...]
    options: dict[str, Any]
    exclusive: str | None = None
    section: str | None = None


def arg(*flags: str, exclusive: str | None = None, section: str | None = None, **options: Any) -> Arg:
    return Arg(flags, options, exclusive, section)


@dataclasses.dataclass(frozen=True)
class Command:
    """A subcommand: its help line, its description (text, or a function called only when the help is shown), the
    function that runs it and its arguments."""

    name: str
    help: str
    run: str  # "module:function" (relative to this package), called with the parsed options as keywords
    args: tuple[Arg, ...]
    description: str | Callable[[], str] | None = None


# -- argument types: integers and numbers in ASCII digits (int() and float() also take other scripts' digits) ------
def at_least(low: int | None) -> Callable[[str], int]:
    """An argument type: an integer of at least ``low``."""

    def integer(text: str) -> int:
        value = int(text) if re.fullmatch(r"\s*[-+]?[0-9]+\s*", text) else None
        if value is None or (low is not None and value < low):
            raise argparse.ArgumentTypeError(f"must be an integer{'' if low is None else f' >= {low}'}, got {text!r}")
        return value

    return integer


def _number(what: str, ok: Callable[[float], bool]) -> Callable[[str], float]:
    """An argument type: a number for which ``ok`` holds (-0 is 0), else an error that says it must be ``what``."""

    def number(text: str) -> float:
        try:
            value = float(text) + 0.0 if text.isascii() else None
        except ValueError:
            value = None
        if value is None or not ok(value):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value

    return number


positive = at_least(1)
fraction = _number("between 0 and 1", lambda v: 0.0 < v < 1.0)
percent = _number("a percentage >= 0", lambda v: 0.0 <= v < float("inf"))


SUMMARY_HELP = """\
Summarize torch.profiler traces: where the time went, per step, operator, kernel and label, with findings.
LOGDIR may also be a summary saved with --json (read back as it was saved).

Exit status 0 when at least one trace was summarized (unreadable files are listed under
"Problems"), 1 when nothing could be read or a report could not be written, 2 for bad arguments.
Big runs are read by --jobs worker processes, with a progress bar on stderr (a terminal) for runs over 100 MB.
--json keeps the per-step rows kprof diff tests: the file can be side A of a diff (kprof summary --json > base.json).
"""
DIFF_HELP = """\
What changed from A to B, with intervals and verdicts. A and B: a run folder, a trace file, a summary saved with
kprof summary --json, or PATH@steps=SPEC for some steps of a run (SPEC: numbers and ranges, e.g. log/run@steps=2-4,7).

--fail-if-slower PCT gates on the step time: exit status 3 when B's typical step is significantly slower than A's
and the whole confidence interval of the slowdown lies above PCT percent; the report then says what grew.
--fail-if-more-memory PCT gates on memory: exit status 3 when B's peak allocated (the median over its steps) is above
A's by more than PCT percent (both profiled with profile_memory=True); the report says what grew at the peak.

Exit status 0 when both sides were read (and no regression), 1 when one could not be (or a step selection does not
match the run, or a side has too few steps for --fail-if-slower, or the report could not be written), 2 for bad
arguments (a malformed step selection included), 3 for a regression of either gate (it wins over a report that could
not be written), 4 when the step-time gate would fail but B ran on a busier or throttled machine that slowed every
part of its step alike (inconclusive).
"""


# -- options several subcommands share --------------------------------------------------------------------------------
def _formats(what: str) -> tuple[Arg, Arg]:
    """--json and --markdown: one of them, or neither (text)."""
    return (
        arg(
            "--json",
            dest="as_json",
            action="store_true",
            exclusive="format",
            help=f"print the {what} as JSON instead of text",
        ),
        arg(
            "--markdown",
            action="store_true",
            exclusive="format",
            help=f"print the {what} as GitHub-flavoured Markdown (a pull-request comment)",
        ),
    )


def _gate(against: str, machine: str = "") -> Arg:
    return arg(
        "--fail-if-slower",
        type=percent,
        metavar="PCT",
        help=f"exit status {exits.REGRESSION} when {against} significantly slower by more than PCT percent: the "
        f"whole confidence interval of the slowdown lies above PCT{machine} (docs/ci.md)",
    )


HTML = arg("--html", type=Path, metavar="OUT.html", help="also write a self-contained HTML report")
TOP = arg("--top", type=positive, default=10, metavar="N", help="rows per table (default 10)")
DEVICE = arg("--device", default=None, help="cpu or cuda (default: cuda when available)")


def _jobs() -> Arg:
    cores = default_jobs()
    return arg(
        "--jobs",
        type=positive,
        default=cores,
        metavar="N",
        help=f"worker processes reading big runs (default: the cores, {cores}; 1: read in this process)",
    )


def _bench_description() -> str:
    from . import bench

    return f"{bench.__doc__}\nops: {', '.join(op.name for op in bench.OPS)}\n"


def commands() -> list[Command]:
    """Every subcommand, in the order ``kprof --help`` lists them."""
    return [_demo(), _summary(), _diff(), _tensorboard(), _compare(), _bench()]


def _demo() -> Command:
    return Command(
        "demo",
        "train a small model under the profiler and print where the time went",
        ".demo:run_cli",
        (
            arg("--logdir", default="log", help="where traces go (default: log)"),
            arg("--steps", type=at_least(None), default=60, help="training steps (default: 60)"),
            DEVICE,
        ),
    )


def _summary() -> Command:
    return Command(
        "summary",
        "summarize torch.profiler traces (a file, a run folder or a logdir)",
        ".analysis:run_summary",
        (
            arg(
                "path",
                type=Path,
                metavar="LOGDIR",
                help="trace file (.pt.trace.json[.gz]), run folder, logdir of runs, or a summary saved with --json",
            ),
            *_formats("tables (JSON: with the per-step rows kprof diff needs)"),
            HTML,
            TOP,
            arg(
                "--sort",
                choices=SORT_KEYS,
                default="cuda",
                help="sort operators by self CUDA time, self CPU time or self memory (default cuda; cpu without "
                "GPU events)",
            ),
            arg(
                "--stacks",
                type=Path,
                metavar="OUT.folded",
                help="write flamegraph folded stacks of self CPU time (one file per run when several)",
            ),
            _jobs(),
        ),
        SUMMARY_HELP,
    )


def _diff() -> Command:
    return Command(
        "diff",
        "what changed between two runs, trace files or step selections (with CIs and verdicts)",
        ".analysis:run_diff",
        (
            arg(
                "a",
                help="the baseline: run folder, trace file, saved summary (kprof summary --json) or PATH@steps=SPEC",
            ),  # fmt: skip
            arg("b", help="the run compared with it (same forms)"),
            *_formats("diff"),
            _gate(
                "B's step time is",
                f"; {exits.INCONCLUSIVE} when B ran on a busier or throttled machine that slowed its step alike",
            ),
            arg(
                "--fail-if-more-memory",
                type=percent,
                metavar="PCT",
                help=f"exit status {exits.REGRESSION} when B's peak allocated memory (the median over its steps) "
                "is above A's by more than PCT percent; both sides profiled with profile_memory=True (docs/ci.md)",
            ),
            HTML,
            TOP,
            arg(
                "--confidence",
                type=fraction,
                default=0.95,
                help="interval level; 1 - confidence is the false discovery rate (default 0.95)",
            ),
            _jobs(),
        ),
        DIFF_HELP,
    )


def _tensorboard() -> Command:
    return Command(
        "tensorboard",
        "serve LOGDIR with TensorBoard on 127.0.0.1 and print the URL",
        ".tensorboard.launch:serve",
        (
            arg("logdir", nargs="?", default="log", help="the logdir kprof wrote (default: log)"),
            arg(
                "--port",
                type=at_least(None),
                default=6006,
                help="port on 127.0.0.1 (default: 6006; 0 picks a free one)",
            ),  # fmt: skip
        ),
    )


def _compare() -> Command:
    return Command(
        "compare",
        "time a model with and without kprof.swap (custom kernels) and check they agree",
        ".compare.command:run_cli",
        _compare_args(),
        "Train a model and its kprof.swap copy (or one copy per --impls choice: CUDA, C++, Triton or torch's own "
        "ops in the kprof layers) on the same batches, check that outputs and gradients agree, and print step "
        "times with a bootstrap confidence interval on the speedup. Exit status 0, 1 when a variant failed (its "
        f"code raised, or the check), 2 for bad arguments, {exits.REGRESSION} for a regression (--fail-if-slower).",
    )


def _bench() -> Command:
    return Command(
        "bench",
        "time every custom layer (and its Triton twin) against eager PyTorch and torch.compile",
        ".bench:run",
        _bench_args(),
        _bench_description,
    )


def _compare_args() -> tuple[Arg, ...]:
    size = "builtin model size"
    return (
        arg(
            "--model",
            default="builtin",
            help="'builtin' (the demo ToyModel) or MODULE:ATTR naming a function f(device) that returns (model, "
            "step_fn, batches) (default: builtin)",
        ),
        arg("--steps", type=at_least(3), default=50, help="timed steps per variant (default: 50)"),
        arg("--warmup", type=at_least(0), default=5, help="untimed warm-up steps per variant (default: 5)"),
        DEVICE,
        arg("--logdir", default=None, help="also profile each variant into LOGDIR/<variant>/"),
        arg("--check", choices=("raise", "warn", "off"), default="raise", help="numerical check (default: raise)"),
        arg(
            "--impls",
            default="",
            help="comma-separated kprof.swap impls, one variant each beside the torch model, e.g. cuda,triton,torch "
            "(default: one swap whose kernels follow the device)",
        ),
        arg(
            "--markdown",
            action="store_true",
            help="print the table as GitHub-flavoured Markdown (a pull-request comment)",
        ),  # fmt: skip
        _gate("a variant's timed steps are, against the baseline's,"),
        arg("--width", type=positive, default=128, section=size, help="hidden width (default: 128)"),
        arg("--depth", type=positive, default=4, section=size, help="number of blocks (default: 4)"),
        arg("--batch-size", type=positive, default=64, section=size, help="batch size (default: 64)"),
    )


def _bench_args() -> tuple[Arg, ...]:
    return (
        arg("--quick", action="store_true", help="small sizes on the CPU, a few iterations, no compile"),
        arg(
            "--check",
            dest="check_only",
            action="store_true",
            help="correctness of every kernel on small shapes, no timing",
        ),  # fmt: skip
        arg("--no-compile", dest="compile_ref", action="store_false", help="skip the torch.compile reference"),
        arg("--no-triton", dest="triton", action="store_false", help="skip the Triton twins (impl='triton')"),
        arg("--largest", dest="largest_only", action="store_true", help="only each op's largest shape per dtype"),
        arg("--ops", default="", help="comma-separated op names (default: all; listed above)"),
        arg(
            "--shapes",
            choices=("full", "gpt"),
            default="full",
            help="full: large shapes of every op family (default); gpt: the shapes of GPT-2 small/medium",
        ),
        arg("--out", type=Path, help="write the results as JSON here"),
    )


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


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kprof", description="Profile PyTorch training and read the results.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    raw = argparse.RawDescriptionHelpFormatter  # descriptions laid out in lines keep them
    for command in commands():
        text = command.description
        p = sub.add_parser(
            command.name,
            help=command.help,
            description=text if isinstance(text, str) else None,
            describe=text if callable(text) else None,
            formatter_class=argparse.HelpFormatter if isinstance(text, str) and "\n" not in text else raw,
        )
        places: dict[str | None, argparse._ActionsContainer] = {None: p}
        for a in command.args:
            key = a.exclusive or a.section
            if key not in places:
                places[key] = p.add_mutually_exclusive_group() if a.exclusive else p.add_argument_group(a.section)
            places[key].add_argument(*a.flags, **a.options)
        p.set_defaults(_run=command.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a subcommand; its exit status. Ctrl-C is 130 and a reader of the output that went away (``| head``) 141,
    as a shell reports a process those signals end; an output that cannot be written (``> /dev/full``) is 1. Each
    says so in one line, never a traceback."""
    options = vars(build_parser().parse_args(argv))
    name, target = options.pop("command"), options.pop("_run")
    module, _, function = target.partition(":")
    try:
        status = getattr(importlib.import_module(module, __package__), function)(**options)
        sys.stdout.flush()  # a full or closed output fails here, not at the interpreter's exit
    except UsageError as exc:
        print(f"kprof {name}: {exc}", file=sys.stderr)
        return exits.USAGE
    except KeyboardInterrupt:
        print(f"kprof {name}: interrupted", file=sys.stderr)
        return exits.INTERRUPTED
    except BrokenPipeError:
        _drop_stdout()
        return exits.BROKEN_PIPE
    except OSError as exc:
        if exc.filename is not None or exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO):
            raise
        _drop_stdout()
        print(f"kprof {name}: could not write the output: {exc.strerror}", file=sys.stderr)
        return exits.FAILED
    return status


def _drop_stdout() -> None:
    """Send what stdout still buffers nowhere, so that the interpreter's last flush fails no more."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # a stdout without a descriptor (a test's capture)
        pass


if __name__ == "__main__":
    sys.exit(main())
