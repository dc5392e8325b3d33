"""The "kprof" TensorBoard tab: run summaries, step time over the run, comparisons, raw trace downloads.

TensorBoard finds `KprofPlugin` through this package's `tensorboard_plugins` entry point and serves its
routes under `data/plugin/kprof/`. Summaries come from `kprof.summarize` on the trace files on disk,
cached per run until its files change; step time comes from the `kprof/step_time_ms` scalars through
TensorBoard's own data provider. The frontend is a plain ES module (static/index.js) in the tab's iframe.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import werkzeug
from tensorboard import errors, plugin_util
from tensorboard.backend import http_util
from tensorboard.data import provider
from tensorboard.plugins import base_plugin
from tensorboard.plugins.scalar import metadata as scalar_metadata
from werkzeug import wrappers

from .. import layout
from ..analysis import summarize
from . import logdir
from .cache import SummaryCache

PLUGIN_NAME = "kprof"
STATIC = Path(__file__).parent / "static"
_STATIC_TYPES = {"index.js": "text/javascript", "charts.js": "text/javascript", "style.css": "text/css"}
_MAX_POINTS = 10_000  # step-time points per run: TensorBoard keeps fewer by default, so this means "all it has"
_JSON = "application/json"


def summarize_run(run: logdir.RunFiles) -> dict[str, Any]:
    """`summarize(run).to_dict()`, plus its problems as (file name, reason) pairs for the page."""
    try:
        summary = summarize(run.folder)
    except ValueError as exc:  # not one readable trace file: the message names each file and why
        return {"summary": None, "error": str(exc), "problems": []}
    problems = [{"file": p.path.name, "problem": p.reason} for p in summary.problems]
    return {"summary": summary.to_dict(), "error": None, "problems": problems}


class KprofPlugin(base_plugin.TBPlugin):
    """TensorBoard plugin serving the kprof tab for every run folder with trace files below the logdir."""

    plugin_name = PLUGIN_NAME

    def __init__(self, context: base_plugin.TBContext) -> None:
        # No logdir with --logdir_spec; a remote logdir (gs://...) is not a folder here and shows no runs.
        self._logdir = Path(context.logdir).expanduser().resolve() if context.logdir else None
        self._provider = context.data_provider
        self._cache = SummaryCache(summarize_run)

    def is_active(self) -> bool:
        return self._logdir is not None and logdir.has_data(self._logdir)

    def frontend_metadata(self) -> base_plugin.FrontendMetadata:
        # The page has its own Reload button: TensorBoard's reload does not reach an iframed plugin.
        return base_plugin.FrontendMetadata(es_module_path="/index.js", tab_name="kprof", disable_reload=True)

    def get_plugin_apps(self) -> dict[str, Any]:
        apps = {f"/{name}": self._static for name in _STATIC_TYPES}
        apps.update({
            "/runs": self._runs_route,
            "/summary": self._summary_route,
            "/steptime": self._steptime_route,
            "/compare": self._compare_route,
            "/trace": self._trace_route,
        })
        return apps

    # -- routes ----------------------------------------------------------------------------------------------
    @wrappers.Request.application
    def _static(self, request: werkzeug.Request) -> werkzeug.Response:
        name = request.path.rsplit("/", 1)[-1]
        return http_util.Respond(request, (STATIC / name).read_bytes(), _STATIC_TYPES[name])

    @wrappers.Request.application
    def _runs_route(self, request: werkzeug.Request) -> werkzeug.Response:
        """Runs and comparisons below the logdir, from folder listings and file stats only."""
        runs, comparisons = logdir.scan(self._logdir) if self._logdir else ([], [])
        return http_util.Respond(request, {
            "logdir": str(self._logdir or ""),
            "runs": [r.to_dict() for r in runs],
            "comparisons": [{"dir": layout.run_name(self._logdir, c.parent), "modified": c.stat().st_mtime}
                            for c in comparisons],
        }, _JSON)

    @wrappers.Request.application
    def _summary_route(self, request: werkzeug.Request) -> werkzeug.Response:
        """The run's Summary (`to_dict()`), per-file problems, and its files; re-summarized only when they change."""
        run = self._run(request)
        return http_util.Respond(request, dict(self._cache.get(run), run=run.name, files=run.to_dict()), _JSON)

    @wrappers.Request.application
    def _steptime_route(self, request: werkzeug.Request) -> werkzeug.Response:
        """Step time (ms) of every step TensorBoard holds for the run, from the session's scalars."""
        name = self._run(request).name
        series = []
        if self._provider is not None:
            data = self._provider.read_scalars(
                plugin_util.context(request.environ),
                experiment_id=plugin_util.experiment_id(request.environ),
                plugin_name=scalar_metadata.PLUGIN_NAME,
                downsample=_MAX_POINTS,
                run_tag_filter=provider.RunTagFilter(runs=[name], tags=[layout.STEP_TIME_TAG]),
            )
            series = data.get(name, {}).get(layout.STEP_TIME_TAG, [])
        return http_util.Respond(request, {"run": name, "tag": layout.STEP_TIME_TAG,
                                           "points": [[d.step, d.value] for d in series]}, _JSON)

    @wrappers.Request.application
    def _compare_route(self, request: werkzeug.Request) -> werkzeug.Response:
        """A `compare.json` (folder `dir`, relative to the logdir), with each variant's run name where it has traces."""
        name = request.args.get("dir", ".")
        folder = self._folder(name)
        path = folder / layout.COMPARE_FILE
        if not path.is_file():
            raise errors.NotFoundError(f"no {layout.COMPARE_FILE} in {name!r}")
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            return http_util.Respond(request, {"dir": name, "data": None, "error": f"{path.name}: {exc}"}, _JSON)
        runs = {}
        for variant in data.get("variants", []):
            trace_dir = variant.get("trace_dir")
            run = logdir.run_files(self._logdir, folder / Path(trace_dir).name) if trace_dir else None
            runs[variant["name"]] = run.name if run else None
        return http_util.Respond(request, {"dir": name, "data": data, "runs": runs, "error": None}, _JSON)

    @wrappers.Request.application
    def _trace_route(self, request: werkzeug.Request) -> werkzeug.Response:
        """One trace file of a run, as a download (to open in ui.perfetto.dev or chrome://tracing)."""
        run = self._run(request)
        name = request.args.get("file", "")
        if name not in {f.name for f in run.traces}:
            raise errors.NotFoundError(f"no trace file {name!r} in run {run.name!r}")
        response = werkzeug.utils.send_file(
            run.folder / name, request.environ, as_attachment=True, download_name=name, max_age=0,
            mimetype="application/gzip" if name.endswith(".gz") else _JSON,
        )
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response

    # -- request helpers ---------------------------------------------------------------------------------------
    def _folder(self, name: str) -> Path:
        folder = logdir.inside(self._logdir, name) if self._logdir else None
        if folder is None:
            raise errors.NotFoundError(f"no folder {name!r} in the logdir")
        return folder

    def _run(self, request: werkzeug.Request) -> logdir.RunFiles:
        name = request.args.get("run")
        if not name:
            raise errors.InvalidArgumentError("missing ?run=")
        run = logdir.run_files(self._logdir, self._folder(name))
        if run is None:
            raise errors.NotFoundError(f"no trace files in run {name!r}")
        return run
