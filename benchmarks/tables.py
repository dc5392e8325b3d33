"""The Markdown tables of BENCHMARKS.md and TESTING.md, generated from the results of record.

A result of record is a JSON file under ``benchmarks/results/`` holding its provenance (the ``commit`` measured,
``date``, ``device``, ``versions``, and the ``command`` that produced it: at the top, or one per row) and its
``rows``. A document marks each generated table with ``<!-- table: NAME -->`` ... ``<!-- end table -->``; this script
replaces what lies between with ``TABLES[NAME]`` (declared in table_specs.py) rendered from its file: one line of
provenance, then the table. Prose stays outside the markers, so a new result is a new JSON file (or a rewritten one)
and a run of this script.

    python benchmarks/tables.py            # rewrite the marked tables of BENCHMARKS.md and TESTING.md
    python benchmarks/tables.py --check    # exit 1, naming each table that differs from its data; CI runs this
"""

from __future__ import annotations

import argparse
import json
import re
import string
import sys
from pathlib import Path
from typing import Any

from table_specs import TABLES

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DOCUMENTS = ("BENCHMARKS.md", "TESTING.md")
MARKED = re.compile(r"^(<!-- table: (?P<name>[\w-]+) -->\n)(?P<body>.*?)^(<!-- end table -->)$", re.S | re.M)
OPENING, CLOSING = re.compile(r"^<!-- table: ", re.M), re.compile(r"^<!-- end table -->$", re.M)
VERSION_NAMES = {
    "torch": "torch",
    "cuda": "CUDA",
    "triton": "Triton",
    "python": "Python",
    "lightning": "Lightning",
    "liger_kernel": "Liger-Kernel",
    "cut_cross_entropy": "Cut Cross-Entropy",
    "numpy": "numpy",
    "msgspec": "msgspec",
    "kprof_callbacks": "kprof",
}


class _Missing(Exception):
    """A cell refers to a value the row does not have (None)."""


class _Cells(string.Formatter):
    """``str.format`` for table cells: a cell whose values include None is a dash; a list is formatted item by item,
    joined with commas; True and False read yes and no."""

    def get_field(self, field_name: str, args, kwargs) -> tuple[Any, str]:
        try:
            return super().get_field(field_name, args, kwargs)
        except TypeError:  # an index into None
            raise _Missing from None

    def format_field(self, value: Any, format_spec: str) -> str:
        if value is None:
            raise _Missing
        if isinstance(value, list):
            return ", ".join(format(item, format_spec) for item in value)
        if isinstance(value, bool):
            return "yes" if value else "no"
        if isinstance(value, dict):
            return "; ".join(f"{key}: {self.format_field(v, format_spec)}" for key, v in value.items())
        return super().format_field(value, format_spec)

    def cell(self, fmt: str, row: dict) -> str:
        try:
            return self.format(fmt, **row)
        except _Missing:
            return "—"


CELLS = _Cells()


def load(path: Path) -> dict:
    """A result of record, with its provenance checked: a ValueError names what is missing."""
    data = json.loads(path.read_text())
    missing = [key for key in ("commit", "date", "device", "rows") if not data.get(key)]
    if not (data.get("versions") or data.get("torch")):
        missing.append("versions")
    if not data.get("command") and not all(row.get("command") for row in data.get("rows") or [{}]):
        missing.append("command (at the top or in every row)")
    if missing:
        raise ValueError(f"{path.name}: no {', '.join(missing)}")
    return data


def versions(data: dict) -> str:
    """``torch 2.11.0+cu130, CUDA 13.0, ...`` from ``versions`` (or, in older files, keys at the top)."""
    found = data.get("versions") or {key: data[key] for key in VERSION_NAMES if data.get(key)}
    return ", ".join(f"{VERSION_NAMES.get(key, key)} {value}" for key, value in found.items() if value)


def provenance(data: dict) -> str:
    """One line: date, device, versions, the commit measured (short), and the command."""
    parts = [str(data["date"])[:10], data["device"], versions(data), f"commit {str(data['commit'])[:7]}"]
    if data.get("command"):
        parts.append(f"`{data['command']}`")
    return "*" + " · ".join(parts) + "*"


def render(name: str, results: Path = RESULTS) -> str:
    """The Markdown of table ``name``: its provenance line, a blank line, the table."""
    table = TABLES[name]
    data = load(results / table.source)
    header = "| " + " | ".join(c.header for c in table.columns) + " |"
    rule = "|" + "|".join("---:" if c.number else "---" for c in table.columns) + "|"
    try:
        rows = ["| " + " | ".join(CELLS.cell(c.fmt, row) for c in table.columns) + " |" for row in data[table.rows]]
    except KeyError as exc:
        raise ValueError(f"{table.source}: no {exc} (table {name})") from None
    return "\n".join([provenance(data), "", header, rule, *rows]) + "\n"


def regenerate(text: str, results: Path = RESULTS) -> tuple[str, list[str]]:
    """``text`` with every marked table rendered again, and the names of those that changed."""
    changed: list[str] = []

    def one(match: re.Match) -> str:
        name = match["name"]
        if name not in TABLES:
            raise ValueError(f"no table called {name!r} (tables: {', '.join(TABLES)})")
        body = render(name, results)
        if body != match["body"]:
            changed.append(name)
        return match[1] + body + match[4]

    new = MARKED.sub(one, text)
    opened, closed = len(OPENING.findall(text)), len(CLOSING.findall(text))
    if opened != closed:
        raise ValueError(f"{opened} table markers but {closed} end markers")
    return new, changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a table differs")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the results of record (default: %(default)s)")
    parser.add_argument(
        "documents",
        nargs="*",
        type=Path,
        default=[ROOT / name for name in DOCUMENTS],
        help="Markdown files with marked tables (default: BENCHMARKS.md and TESTING.md)",
    )
    args = parser.parse_args(argv)
    stale = []
    for path in args.documents:
        text = path.read_text()
        try:
            new, changed = regenerate(text, args.results)
        except (ValueError, OSError) as exc:
            print(f"tables.py: {path.name}: {exc}", file=sys.stderr)
            return 2
        stale += [f"{path.name}: table {name}" for name in changed]
        if changed and not args.check:
            path.write_text(new)
    for item in stale:
        print(f"{item} {'differs from' if args.check else 'rewritten from'} its results of record")
    if stale and args.check:
        print("run: python benchmarks/tables.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
