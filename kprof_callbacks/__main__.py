"""``python -m kprof_callbacks`` is the ``kprof`` command."""

import sys

from .cli import main

sys.exit(main())
