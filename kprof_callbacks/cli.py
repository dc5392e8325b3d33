"""The ``kprof`` command (also ``python -m kprof_callbacks``): one subcommand per front door."""

from __future__ import annotations

import argparse
import importlib
import sys

# (module, function) pairs; each function registers one subcommand and sets ``func(args) -> exit code``.
SUBCOMMANDS = (
    ("kprof_callbacks.demo", "add_parser"),
    ("kprof_callbacks.analysis.cli", "add_summary_parser"),
    ("kprof_callbacks.tb", "add_parser"),
    ("kprof_callbacks.compare", "add_parser"),
    ("kprof_callbacks.kernels.bench", "add_parser"),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kprof", description="Profile PyTorch training and read the results.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module, function in SUBCOMMANDS:
        getattr(importlib.import_module(module), function)(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
