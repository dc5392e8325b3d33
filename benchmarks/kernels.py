"""The custom-layer benchmark: the same as ``kprof bench`` (see ``kprof_callbacks/bench/``)."""

import sys

from kprof_callbacks.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
