"""The exit statuses of every ``kprof`` subcommand, in one place (docs/ci.md lists what each means per command).

CI reads them: 3 fails a pull request for a regression, 4 says the comparison could not tell code from machine.
"""

from __future__ import annotations

OK = 0  # the work was done (and, with a gate, it passed)
FAILED = 1  # nothing readable, a write that failed, a variant that failed, too few steps for a gate
BAD_ARGUMENTS = 2  # as argparse's own
REGRESSION = 3  # a gate (--fail-if-slower) found B significantly slower than the limit allows
INCONCLUSIVE = 4  # a gate found B slower, but B ran on a busier or throttled machine and every part slowed alike

MEANING = {
    OK: "done",
    FAILED: "failed",
    BAD_ARGUMENTS: "bad arguments",
    REGRESSION: "regression",
    INCONCLUSIVE: "inconclusive: the machine changed",
}
"""Each status in a few words, as docs/ci.md's table heads its rows."""
