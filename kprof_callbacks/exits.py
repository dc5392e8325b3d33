"""The exit statuses of every ``kprof`` subcommand, in one place (docs/cli.md and docs/ci.md list them).

CI reads them: 3 fails a pull request for a regression, 4 says the comparison could not tell code from machine.
"""

OK = 0
FAILED = 1  # nothing readable, a variant that failed, too few steps for a gate, or a report that could not be written
USAGE = 2  # bad arguments, said in one line before any work
REGRESSION = 3  # a gate failed: --fail-if-slower or --fail-if-more-memory
INCONCLUSIVE = 4  # a gate found B slower, but B ran on a busier or throttled machine and every part slowed alike
INTERRUPTED = 130  # Ctrl-C, as a shell reports a process SIGINT ends
BROKEN_PIPE = 141  # the reader of the output went away (| head), as a shell reports SIGPIPE
