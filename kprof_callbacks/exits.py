"""The exit statuses of every ``kprof`` subcommand, in one place (docs/cli.md and docs/ci.md list them)."""

OK = 0
FAILED = 1  # nothing readable, a variant that failed, or a report that could not be written
USAGE = 2  # bad arguments, said in one line before any work
REGRESSION = 3  # a gate failed: --fail-if-slower
INTERRUPTED = 130  # Ctrl-C, as a shell reports a process SIGINT ends
BROKEN_PIPE = 141  # the reader of the output went away (| head), as a shell reports SIGPIPE
