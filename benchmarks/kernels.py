"""The custom-layer benchmark (``kprof bench``): see ``kprof_callbacks/kernels/bench.py``."""

import sys

from kprof_callbacks.kernels.bench import main

if __name__ == "__main__":
    sys.exit(main())
