"""A report's table: a titled grid of formatted cells, and how it is written as text and as GitHub Markdown. Every
report (summary, diff, memory, modules, compare) builds these and the text, Markdown and HTML writers draw them."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence


@dataclasses.dataclass
class Table:
    """A titled table of formatted cells; `key` names the Summary table it shows."""

    key: str
    title: str
    headers: list[str]
    rows: list[list[str]]


def text_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned first column, right-aligned numbers, a rule under the header."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join([line(headers), "  ".join("-" * w for w in widths), *(line(r) for r in rows)])


_MD_ESCAPES = str.maketrans(
    {"&": "&amp;", "<": "&lt;", "|": "\\|", "\\": "\\\\", "`": "\\`", "*": "\\*", "_": "\\_", "[": "\\[", "\n": " "}
)  # no tags, emphasis, links, code or cell breaks
_MD_CODE_ESCAPES = str.maketrans({"|": "\\|", "\n": " "})  # a pipe ends a table cell even in a code span


def md_text(text: str) -> str:
    """``text`` for GitHub-flavoured Markdown, shown as written: no emphasis, links, HTML tags or table breaks."""
    return text.translate(_MD_ESCAPES)


def md_code(text: str) -> str:
    """``text`` as a code span (names: kernel templates keep their ``<...>``), with table pipes escaped."""
    fence = "``" if "`" in text else "`"
    pad = " " if fence == "``" else ""
    return f"{fence}{pad}{text.translate(_MD_CODE_ESCAPES)}{pad}{fence}"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]], code: Sequence[int] = (0,)) -> str:
    """A GitHub-flavoured Markdown table: the first column left-aligned, the others right-aligned (numbers), the
    columns in ``code`` as code spans."""

    def line(cells: Sequence[str], header: bool = False) -> str:
        return (
            "| "
            + " | ".join(md_code(c) if i in code and not header and c else md_text(c) for i, c in enumerate(cells))
            + " |"
        )

    align = "|" + "|".join(":---" if i == 0 else "---:" for i in range(len(headers))) + "|"
    return "\n".join([line(headers, header=True), align, *(line(r) for r in rows)])
