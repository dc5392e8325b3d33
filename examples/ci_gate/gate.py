"""Gate a pull request on step time: profile N steps of the main branch and of the pull request, one after the other
on the same machine, and fail (exit status 3) when the pull request's typical step is slower by more than PCT percent
with significance; the report names the kernels, operators and labels that grew (kprof diff --fail-if-slower).

    python examples/ci_gate/gate.py \\
        --base "cd main && python train.py --logdir {logdir}" \\
        --pr   "cd pr && python train.py --logdir {logdir}" \\
        --steps 20 --fail-if-slower 5 --markdown > report.md

Each command runs once through the shell, with {logdir} replaced by a fresh folder under --workdir and KPROF_ACTIVE=N,
KPROF_REPEAT=1 in its environment, so the kprof.session (or ProfilerCallback) in it profiles N steps there. Instead
of --base, --base-summary names a summary saved with `kprof summary --json` (a small file kept from the main branch);
--save-summary writes the pull request's (on the main branch: the next baseline). Exit status: kprof diff's (0 no
regression, 1 a run or its traces failed, or too few steps for a verdict, 2 bad arguments, 3 regression). docs/ci.md
has the rule, the recipe and a GitHub Actions workflow (kprof-gate.yml, next to this file).
"""

import argparse
import contextlib
import os
import shlex
import subprocess
import sys
from pathlib import Path

from kprof_callbacks.cli import main as kprof


def profile(command: str, logdir: Path, steps: int) -> Path:
    """Run ``command`` with ``{logdir}`` filled in and N profiled steps; the one run folder it wrote."""
    logdir.mkdir(parents=True)
    env = {**os.environ, "KPROF_ACTIVE": str(steps), "KPROF_REPEAT": "1"}
    print(f"[gate] {command}", file=sys.stderr, flush=True)
    done = subprocess.run(command.replace("{logdir}", shlex.quote(str(logdir.absolute()))), shell=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"[gate] the command failed (exit status {done.returncode}): {command}")
    runs = sorted({p.parent for p in logdir.rglob("*.pt.trace.json*") if not p.name.endswith(".partial")})
    if len(runs) != 1:
        raise SystemExit(
            f"[gate] expected one run folder of traces under {logdir}, found {len(runs)}: "
            "does the command pass {logdir} to kprof.session?"
        )
    return runs[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    base = parser.add_mutually_exclusive_group(required=True)
    base.add_argument("--base", metavar="COMMAND", help="trains the main branch, writing traces to {logdir}")
    base.add_argument("--base-summary", type=Path, metavar="BASE.json", help="a saved summary of the main branch")
    parser.add_argument("--pr", required=True, metavar="COMMAND", help="trains the pull request (same form)")
    parser.add_argument("--steps", type=int, default=20, help="profiled steps a side (default 20)")
    parser.add_argument("--fail-if-slower", type=float, default=5.0, metavar="PCT", help="the limit (default 5)")
    parser.add_argument("--workdir", type=Path, default=Path("kprof-gate"), help="where the runs go")
    parser.add_argument("--markdown", action="store_true", help="print the report as Markdown (a PR comment)")
    parser.add_argument("--save-summary", type=Path, metavar="OUT.json", help="also save the pull request's summary")
    args = parser.parse_args()
    if args.steps < 4:
        parser.error("--steps must be >= 4: the step-time test needs 4 steps a side for a verdict at 95%")
    if not args.fail_if_slower >= 0:
        parser.error(f"--fail-if-slower must be a percentage >= 0, got {args.fail_if_slower}")
    if args.workdir.exists() and any(args.workdir.iterdir()):
        parser.error(f"--workdir {args.workdir} is not empty: name a fresh folder")
    a = str(args.base_summary) if args.base_summary else str(profile(args.base, args.workdir / "base", args.steps))
    b = str(profile(args.pr, args.workdir / "pr", args.steps))
    if args.save_summary:
        with args.save_summary.open("w") as out, contextlib.redirect_stdout(out):
            if kprof(["summary", b, "--json"]) != 0:
                return 1
    markdown = ["--markdown"] if args.markdown else []
    return kprof(["diff", a, b, "--fail-if-slower", str(args.fail_if_slower), *markdown])


if __name__ == "__main__":
    sys.exit(main())
