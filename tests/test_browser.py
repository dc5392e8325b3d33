"""Headless Chromium opens TensorBoard's PyTorch Profiler tab over real kprof traces.

The tab is a React app that fetches runs, views and workers from the plugin's HTTP API; the test reads what it
rendered from the dumped DOM. Chromium reaches 127.0.0.1 only (see ``CHROMIUM_FLAGS`` in conftest.py), so the
result is the same with or without internet: torch-tb-profiler draws its charts with Google Charts from
www.gstatic.com, which stays unloaded here, so the sidebar is what renders.
"""

from __future__ import annotations

from html.parser import HTMLParser

from kprof_callbacks.tensorboard.launch import PROFILER_TAB


class _VisibleText(HTMLParser):
    """Text nodes of a DOM dump outside <script>/<style>: what the page shows, not the code that draws it."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = 0
        self.texts: list[str] = []

    def handle_starttag(self, tag, attrs) -> None:
        self.hidden += tag in ("script", "style")

    def handle_endtag(self, tag) -> None:
        self.hidden -= tag in ("script", "style")

    def handle_data(self, data) -> None:
        if not self.hidden and data.strip():
            self.texts.append(data.strip())


def visible_text(html: str) -> list[str]:
    parser = _VisibleText()
    parser.feed(html)
    return parser.texts


def test_profiler_tab_renders_the_runs(tensorboard, chromium, tmp_path):
    runs = tensorboard.get_json("data/plugin/pytorch_profiler/runs")["runs"]
    shown_run = runs[0]  # the page selects the first run
    (worker,) = tensorboard.get_json("data/plugin/pytorch_profiler/workers", run=shown_run, view="Overview")

    # The tab's content is an iframe (--dump-dom shows only the top frame), so dump the plugin page itself.
    text = visible_text(chromium(tensorboard.url + "data/plugin/pytorch_profiler/index.html", "--dump-dom"))
    for label in ("Runs", "Views", "Workers"):
        assert label in text, f"the profiler sidebar did not render: {text[:40]}"
    assert text[text.index("Runs") + 1] == shown_run
    assert text[text.index("Views") + 1] == "Overview"
    assert text[text.index("Workers") + 1] == worker

    screenshot = tmp_path / "profiler-tab.png"
    top = chromium(tensorboard.url + PROFILER_TAB, f"--screenshot={screenshot}", "--dump-dom")
    assert 'src="data/plugin_entry.html?name=pytorch_profiler"' in top  # TensorBoard opened the tab
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
