"""``kprof.compare``: is my variant of a model faster, and does it still compute the same thing?

``run`` drives it: ``variants`` builds the variants and checks the arguments, ``check`` compares their numbers,
``steps`` runs and times their training steps, ``result`` holds and prints what came out; ``cli`` is
``kprof compare``.
"""

from .check import TOLERANCES, ComparisonError
from .result import Comparison, VariantResult
from .run import compare

__all__ = ["TOLERANCES", "Comparison", "ComparisonError", "VariantResult", "compare"]
