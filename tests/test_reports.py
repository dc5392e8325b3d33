"""Markdown for pull requests (summary, diff, compare) parses as tables; the notebook views (`_repr_html_`) fetch
nothing, run nothing, restyle nothing around them and escape names."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from test_ci_gate import timed_comparison
from test_diff import write_trace

from kprof_callbacks.analysis import diff, report, summarize
from kprof_callbacks.analysis.fmt import row_name

ODD = "aten::odd|name<T>_x*"  # a table pipe, a would-be HTML tag, would-be emphasis
SCRIPT = "<script>alert(1)</script>"
IMG = '<img src="http://example.com/x.png" onerror="alert(1)">'


def _odd_run(path: Path, rng: np.random.Generator, slow: float = 1.0) -> Path:
    steps = [{ODD: 100.0 * slow * rng.lognormal(0, 0.02), "aten::mm": 50.0 * rng.lognormal(0, 0.02)} for _ in range(6)]
    kernels = [{SCRIPT: 40.0 * rng.lognormal(0, 0.02), IMG: 5.0} for _ in range(6)]
    return write_trace(path, steps, kernels=kernels)


@pytest.fixture
def runs(tmp_path) -> tuple[Path, Path]:
    rng = np.random.default_rng(7)
    return _odd_run(tmp_path / "a.pt.trace.json", rng), _odd_run(tmp_path / "b.pt.trace.json", rng, slow=1.5)


class _Tables(HTMLParser):
    """The cells of every table in an HTML page: tables -> rows -> cell texts."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.tables[-1][-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def markdown_tables(text: str) -> list[list[list[str]]]:
    """Render `text` as Markdown (pipe tables) and return its tables' cells."""
    markdown = pytest.importorskip("markdown")
    parser = _Tables()
    parser.feed(markdown.markdown(text, extensions=["tables"]))
    return parser.tables


def _shown(cell: str) -> str:
    """A code cell as GitHub shows it: Python-Markdown keeps the backslash of a pipe escaped in a code span."""
    return cell.replace("\\|", "|")


def test_summary_markdown_parses_as_tables_with_names_in_one_cell(runs):
    s = summarize(runs[0])
    text = s.to_markdown(top=5)
    tables = markdown_tables(text)
    assert len(tables) == text.count("\n|:---|")  # every table in the text came out as a table
    assert len(tables) == len(report.tables(s, 5, "cuda")) >= 3
    for rows in tables:
        assert len({len(r) for r in rows}) == 1 and len(rows) >= 2  # header and rows, the same number of cells
    names = {_shown(r[0]) for rows in tables for r in rows[1:]}
    assert ODD in names and SCRIPT in names and "<script" not in text.replace(f"`{SCRIPT}`", "")


def test_diff_markdown_has_the_gate_on_top_and_parses_as_tables(runs):
    d = diff(*runs)
    text = d.to_markdown(top=5, fail_if_slower=5)
    assert text.splitlines()[0] == "### kprof diff: B against A"
    gate = next(line for line in text.splitlines() if line.startswith("**Regression (limit +5%)"))
    assert "aten::odd\\|name&lt;T>\\_x\\*" in gate  # escaped in prose: no cell break, tag or emphasis
    tables = markdown_tables(text)
    assert tables and all(len({len(r) for r in rows}) == 1 for rows in tables)
    ops = next(rows for rows in tables if [_shown(r[0]) for r in rows[1:]][:1] == [ODD])
    assert ops[0][:4] == ["name", "A", "B", "change"] and ops[1][-1] == "increased"
    assert "limit +" not in d.to_markdown(top=5)  # no gate asked for: no gate line


def test_compare_markdown_parses_as_a_table():
    result = timed_comparison(0, slower=1.3)
    (rows,) = markdown_tables(result.to_markdown())
    assert [r[0] for r in rows] == ["variant", "base", "same", "slow"]
    assert rows[3][5] == "slower" and rows[1][5] == "baseline"


def _views(runs) -> dict[str, str]:
    return {
        "summary": summarize(runs[0])._repr_html_(),
        "diff": diff(*runs)._repr_html_(),
        "compare": timed_comparison(0, slower=1.3)._repr_html_(),
    }


class _Tags(HTMLParser):
    """Every element and attribute of a page, and its text."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.attrs: dict[str, set[str]] = {}
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        for name, value in attrs:
            self.attrs.setdefault(name, set()).add(value or "")

    def handle_data(self, data):
        self.text.append(data)


def test_notebook_views_fetch_and_run_nothing_and_escape_names(runs):
    for kind, html in _views(runs).items():
        assert html.startswith('<div class="kprof"><style>') and html.endswith("</div>"), kind
        page = _Tags()
        page.feed(html)
        assert page.tags <= {
            "div",
            "style",
            "section",
            "h1",
            "h2",
            "h3",
            "p",
            "b",
            "br",
            "ul",
            "li",
            "table",
            "tr",
            "th",
            "td",
            "svg",
            "g",
            "rect",
            "line",
            "text",
            "title",
            "path",
            "i",
            "span",
            "figure",
            "figcaption",
        }, (kind, page.tags)
        assert not {"src", "href", "xlink:href", "srcset", "action"} & set(page.attrs), kind
        assert not [a for a in page.attrs if a.startswith("on")], kind
        assert "url(" not in html and "@import" not in html, kind
        if kind != "compare":
            text = "".join(page.text)
            shown = (SCRIPT, IMG) if kind == "summary" else (row_name("kernel", SCRIPT), row_name("kernel", IMG))
            assert all(name in text for name in (*shown, ODD)), kind  # the names, shown as text


def test_notebook_views_style_only_themselves(runs):
    """Every rule of the view's style is scoped to its div: a notebook page around it keeps its own look."""
    for kind, html in _views(runs).items():
        style = re.search(r"<style>(.*?)</style>", html).group(1)
        selectors = [sel.strip() for rule in style.split("}") if rule for sel in rule.split("{")[0].split(",")]
        assert selectors and all(sel == ".kprof" or sel.startswith(".kprof ") for sel in selectors), kind
