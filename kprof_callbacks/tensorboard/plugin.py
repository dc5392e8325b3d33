"""The "kprof" TensorBoard tab: run summaries, step time over the run, a timeline (of one trace, and of all ranks),
comparisons, diffs of two runs, raw trace downloads.

TensorBoard finds `KprofPlugin` through this package's `tensorboard_plugins` entry point and serves its
routes under `data/plugin/kprof/`. Summaries come from `kprof.summarize` on the trace files on disk, cached per run
until its files change; a run over 100 MB is summarized on a thread of its own by worker processes, so other
requests go on meanwhile, and `/summary` answers with its progress until it is done. A diff is `kprof.diff` of two
such summaries, cached until either run's files change; the timeline serves one step of one trace file at a time
from a decoded copy of the file, cached until it changes, and the timeline of all ranks one step of every rank's
trace from decoded copies kept until the run changes; step time comes from the `kprof/step_time_ms` scalars
through TensorBoard's own data provider. The frontend is plain ES modules (static/*.js) in the tab's iframe.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import werkzeug
from tensorboard import errors, plugin_util
from tensorboard.backend import http_util
from tensorboard.data import provider
from tensorboard.plugins import base_plugin
from tensorboard.plugins.scalar import metadata as scalar_metadata
from werkzeug import wrappers

from .. import layout
from ..analysis import (
    COLLAPSE_RANKS,
    PROGRESS_BYTES,
    Input,
    RunSlices,
    Summary,
    TraceError,
    TraceSlices,
    Unreadable,
    default_jobs,
    diff,
    diff_view,
    fmt,
    legend,
    median_step,
    module_view,
    parse_steps,
    summarize_contents,
)
from . import logdir
from .cache import FileCache
from .snapshots import SnapshotReads

log = logging.getLogger(__name__)

PLUGIN_NAME = "kprof"
STATIC = Path(__file__).parent / "static"
_STATIC_TYPES = {
    **{
        f"{name}.js": "text/javascript"
        for name in ("index", "dom", "charts", "timeline", "diff", "ranks", "memory", "modules", "fmt")
    },
    "style.css": "text/css",
}
_MAX_POINTS = 10_000  # step-time points per run: TensorBoard keeps fewer by default, so this means "all it has"
_JSON = "application/json"
_OUTSIDE = "a link to a file outside the logdir: not read"
_DECODED_TRACES = 4  # decoded trace files kept for the timeline: 49 bytes per event, ~7 MB for a 50 MB trace
_STEP = re.compile(r"-?[0-9]{1,18}")  # beyond 18 digits a step number would not fit the trace's int64
_RANK_RUNS = 2  # runs whose every rank's traces are kept decoded for the timeline of all ranks
_DIFFS = 16  # diffs kept, ~0.4 KB of JSON per row: under 1 MB each for 2,000 operators and kernels


@dataclasses.dataclass(frozen=True)
class RunSummary:
    """A run summarized: its Summary (None when no file could be read), for diffs, and what `/summary` serves."""

    summary: Summary | None
    body: dict[str, Any]
    transient: bool = False  # a file is a problem because the process reading it died: not to be kept


def summarize_run(
    run: logdir.RunFiles, progress: Callable[[int, int], None] | None = None, unread: tuple[str, ...] = ()
) -> RunSummary:
    """`summarize` of the run's files but the snapshots named in ``unread`` (big runs in worker processes;
    ``progress`` gets bytes done, bytes in all); the body has its `to_dict()`, its problems as (file name, reason)
    pairs for the page, when it was made (`summarized_at`, epoch seconds) and how long it took (`seconds`): a client
    tells fresh from stored."""
    start = time.perf_counter()
    outside = [{"file": name, "problem": _OUTSIDE} for name in run.outside]
    try:
        contents = run.contents()
        contents = dataclasses.replace(contents, snapshots=[p for p in contents.snapshots if p.name not in unread])
        summary = summarize_contents(run.folder.name, contents, progress=progress or False, jobs=default_jobs())
    except ValueError as exc:  # not one readable trace file: the message names each file and why
        summary, result = None, {"summary": None, "error": str(exc), "problems": outside}
        transient = isinstance(exc, Unreadable) and any(p.transient for p in exc.problems)
    else:
        problems = [{"file": p.path.name, "problem": p.reason} for p in summary.problems]
        result = {"summary": summary.to_dict(), "error": None, "problems": problems + outside}
        transient = any(p.transient for p in summary.problems)
    body = dict(result, summarized_at=time.time(), seconds=time.perf_counter() - start)
    return RunSummary(summary, body, transient)


class KprofPlugin(base_plugin.TBPlugin):
    """TensorBoard plugin serving the kprof tab for every run folder with trace files below the logdir."""

    plugin_name = PLUGIN_NAME

    def __init__(self, context: base_plugin.TBContext) -> None:
        # No logdir with --logdir_spec; a remote logdir (gs://...) is not a folder here and shows no runs.
        self._logdir = Path(context.logdir).expanduser().resolve() if context.logdir else None
        self._provider = context.data_provider
        self._summaries: FileCache[RunSummary] = FileCache(64)
        self._diffs: FileCache[dict[str, Any]] = FileCache(_DIFFS)
        self._traces: FileCache[TraceSlices] = FileCache(_DECODED_TRACES)
        self._rank_runs: FileCache[RunSlices] = FileCache(_RANK_RUNS)
        self._busy: dict[tuple, list[int]] = {}  # (run, fingerprint) being summarized in the background: [done, total]
        self._busy_guard = threading.Lock()
        self._snapshots = SnapshotReads()

    def is_active(self) -> bool:
        return self._logdir is not None and logdir.has_data(self._logdir)

    def frontend_metadata(self) -> base_plugin.FrontendMetadata:
        # The page has its own Reload button: TensorBoard's reload does not reach an iframed plugin.
        return base_plugin.FrontendMetadata(es_module_path="/index.js", tab_name="kprof", disable_reload=True)

    def get_plugin_apps(self) -> dict[str, Any]:
        apps = {f"/{name}": self._static for name in _STATIC_TYPES}
        apps.update(
            {
                "/runs": self._runs_route,
                "/summary": self._summary_route,
                "/steptime": self._steptime_route,
                "/compare": self._compare_route,
                "/trace": self._trace_route,
                "/timeline": self._timeline_route,
                "/ranktimeline": self._rank_timeline_route,
                "/diff": self._diff_route,
                "/memory": self._memory_route,
                "/modules": self._modules_route,
            }
        )
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
        listed = []
        for c in comparisons:
            with contextlib.suppress(FileNotFoundError):  # removed since the walk
                listed.append({"dir": layout.run_name(self._logdir, c.parent), "modified": c.stat().st_mtime})
        compare_dirs = {c["dir"] for c in listed}
        parent = {r.name: r.name.rpartition("/")[0] or "." for r in runs}  # a compare variant's run: in its folder
        return http_util.Respond(
            request,
            {
                "logdir": str(self._logdir or ""),
                "runs": [
                    dict(r.to_dict(), comparison=parent[r.name] if parent[r.name] in compare_dirs else None)
                    for r in runs
                ],
                "comparisons": listed,
                "legend": legend(),
            },
            _JSON,
        )

    @wrappers.Request.application
    def _summary_route(self, request: werkzeug.Request) -> werkzeug.Response:
        """The run's Summary (`to_dict()`), per-file problems, and its files; re-summarized only when they change."""
        run = self._run(request)
        progress = self._in_background(run)
        if progress is not None:
            done, total = progress
            return http_util.Respond(request, {"run": run.name, "pending": True, "done": done, "total": total}, _JSON)
        body = self._summary(run).body
        return http_util.Respond(request, dict(body, run=run.name, files=run.to_dict()), _JSON)

    @wrappers.Request.application
    def _memory_route(self, request: werkzeug.Request) -> werkzeug.Response:
        """The run's memory at the peak and its allocator snapshots' summaries (`Summary.memory`, null when the traces
        hold no memory events), from its stored summary; pending, as `/summary`, while a big run is read."""
        run = self._run(request)
        partial = self._snapshots.partial(run)  # big snapshots not read yet: their end state, while they are read
        if self._in_background(run) is not None:
            return http_util.Respond(request, {"run": run.name, "pending": True}, _JSON)
        summary = self._summary(run).summary
        memory = None if summary is None or summary.memory is None else summary.memory.to_dict()
        if partial:
            memory = memory or {"shown": None, "snapshots": []}
            memory["snapshots"] = [*memory["snapshots"], *partial]
        return http_util.Respond(request, {"run": run.name, "memory": memory}, _JSON)

    @wrappers.Request.application
    def _steptime_route(self, request: werkzeug.Request) -> werkzeug.Response:
        """Step time (ms, without kprof's own cost) of every step TensorBoard holds for the run, kprof's own cost per
        step (`profiler`: its work on the training thread, and what the steps right after a window pay for its
        export), and the slow-step trigger's factor when it was on (`slow_step_trigger`, else null), from the
        session's scalars."""
        name = self._run(request).name
        data = {}
        if self._provider is not None:
            data = self._provider.read_scalars(
                plugin_util.context(request.environ),
                experiment_id=plugin_util.experiment_id(request.environ),
                plugin_name=scalar_metadata.PLUGIN_NAME,
                downsample=_MAX_POINTS,
                run_tag_filter=provider.RunTagFilter(
                    runs=[name],
                    tags=[layout.STEP_TIME_TAG, layout.PROFILER_TAG, layout.AFTER_WINDOW_TAG, layout.TRIGGER_TAG],
                ),
            ).get(name, {})
        export = {d.step: d.value for d in data.get(layout.AFTER_WINDOW_TAG, [])}
        step = [[d.step, d.value] for d in data.get(layout.STEP_TIME_TAG, [])]
        own = [[d.step, d.value + export.get(d.step, 0.0)] for d in data.get(layout.PROFILER_TAG, [])]
        trigger = data.get(layout.TRIGGER_TAG)
        body = {"run": name, "tag": layout.STEP_TIME_TAG, "points": step, "profiler": own}
        return http_util.Respond(request, dict(body, slow_step_trigger=trigger[0].value if trigger else None), _JSON)

    @wrappers.Request.application
    def _compare_route(self, request: werkzeug.Request) -> werkzeug.Response:
        """A `compare.json` (folder `dir`, relative to the logdir), with each variant's run name where it has traces."""
        name = request.args.get("dir", ".")
        folder = self._folder(name)
        path = folder / layout.COMPARE_FILE
        if not path.is_file():
            raise errors.NotFoundError(f"no {layout.COMPARE_FILE} in {name!r}")
        if not logdir.is_below(self._logdir, path):
            raise errors.PermissionDeniedError(f"{layout.COMPARE_FILE} in {name!r}: {_OUTSIDE}")
        try:
            data = logdir.read_comparison(path)
        except ValueError as exc:
            return _unprocessable(request, f"{name}/{exc}")
        runs = {}
        for variant in data["variants"]:
            trace_dir = variant.get("trace_dir")
            run = logdir.run_files(self._logdir, folder / Path(trace_dir).name) if trace_dir else None
            runs[variant["name"]] = run.name if run else None
        return http_util.Respond(request, {"dir": name, "data": data, "runs": runs, "error": None}, _JSON)

    @wrappers.Request.application
    def _trace_route(self, request: werkzeug.Request) -> werkzeug.Response:
        """One trace file of a run, as a download (to open in ui.perfetto.dev or chrome://tracing)."""
        run, trace = self._trace_file(request)
        response = werkzeug.utils.send_file(
            run.folder / trace.name,
            request.environ,
            as_attachment=True,
            download_name=trace.name,
            max_age=0,
            mimetype="application/gzip" if trace.name.endswith(".gz") else _JSON,
        )
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response

    @wrappers.Request.application
    def _timeline_route(self, request: werkzeug.Request) -> werkzeug.Response:
        """One step of a trace file (`?step=`, default: the median step) as columns, and the file's steps."""
        run, trace = self._trace_file(request)
        try:
            slices = self._traces.get((run.name, trace.name), trace, lambda: TraceSlices.read(run.folder / trace.name))
        except TraceError as exc:
            return _unprocessable(request, f"{trace.name}: {exc}")
        windows = slices.steps()
        wanted = request.args.get("step")
        number = median_step([(w.step, w.wall_us) for w in windows]) if wanted is None else _step_number(wanted)
        try:
            piece = slices.step(number)
        except KeyError as exc:
            raise errors.NotFoundError(exc.args[0]) from exc
        body = dict(piece.to_dict(), run=run.name, steps=[dataclasses.asdict(w) for w in windows])
        return http_util.Respond(request, msgspec.json.encode(body), _JSON)

    @wrappers.Request.application
    def _rank_timeline_route(self, request: werkzeug.Request) -> werkzeug.Response:
        """One step of every rank of a run on one clock (`?step=`, default: the median step that every rank
        profiled; `?cpu=1` adds each rank's main thread), one busy row per rank beyond COLLAPSE_RANKS ranks, and the
        steps the ranks share."""
        run = self._run(request)
        cpu = request.args.get("cpu", "0")
        if cpu not in ("0", "1"):
            raise errors.InvalidArgumentError(f"cpu must be 0 or 1, got {cpu[:40]!r}")
        summarized = self._summary(run)
        summary = summarized.summary
        if summary is None:
            return _unprocessable(request, f"run {run.name!r}: {summarized.body['error']}")
        try:
            slices = self._rank_runs.get(run.name, run.fingerprint, lambda: RunSlices(summary.files))
            wanted = request.args.get("step")
            number = slices.default_step() if wanted is None else _step_number(wanted)
            step = slices.step(number, cpu=cpu == "1", skew=summary.step_skew)
        except (TraceError, ValueError) as exc:
            return _unprocessable(request, f"run {run.name!r}: {exc}")
        except KeyError as exc:
            raise errors.NotFoundError(exc.args[0]) from exc
        collapsed = len(step.ranks) > COLLAPSE_RANKS
        body = (step.collapsed() if collapsed else step).to_dict()
        steps = [{"step": n, "wall_us": wall} for n, wall in slices.steps()]
        return http_util.Respond(
            request, msgspec.json.encode(dict(body, run=run.name, steps=steps, collapsed=collapsed)), _JSON
        )

    @wrappers.Request.application
    def _modules_route(self, request: werkzeug.Request) -> werkzeug.Response:
        """The run's time by module as a tree (``modules.tree``), its top source lines and what ran compiled."""
        run = self._run(request)
        summarized = self._summary(run)
        if summarized.summary is None:
            return _unprocessable(request, f"run {run.name!r}: {summarized.body['error']}")
        return http_util.Respond(request, module_view(summarized.summary), _JSON)

    @wrappers.Request.application
    def _diff_route(self, request: werkzeug.Request) -> werkzeug.Response:
        """`kprof.diff` of run `b` against run `a` (each optionally `a_steps`/`b_steps`: `2-4,7`), see `diff_view`;
        computed again only when either run's files change."""
        sides = [(self._run(request, side), _selection(request, side)) for side in "ab"]
        key = tuple((run.name, steps and tuple(steps)) for run, steps in sides)
        try:
            body = self._diffs.get(key, tuple(run.fingerprint for run, _ in sides), lambda: self._diff(sides))
        except ValueError as exc:  # a run with no readable trace, steps it does not hold, overlapping selections
            return _unprocessable(request, str(exc))
        return http_util.Respond(request, body, _JSON)

    def _diff(self, sides: list[tuple[logdir.RunFiles, list[int] | None]]) -> dict[str, Any]:
        """`diff_view` of the two sides, with when it was made (`computed_at`) and how long it took (`seconds`)."""
        start = time.perf_counter()
        inputs = []
        for run, steps in sides:
            summarized = self._summary(run)
            if summarized.summary is None:
                raise ValueError(f"run {run.name!r}: {summarized.body['error']}")
            source = f"{run.name}@steps={fmt.ranges(steps)}" if steps else run.name
            inputs.append(Input(source, None, steps, summarized.summary))
        body = diff_view(diff(*inputs))
        return dict(body, computed_at=time.time(), seconds=time.perf_counter() - start)

    # -- request helpers ---------------------------------------------------------------------------------------
    def _summary(self, run: logdir.RunFiles, progress: Callable[[int, int], None] | None = None) -> RunSummary:
        unread = self._snapshots.unread(run)
        return self._summaries.get(
            run.name,
            (run.fingerprint, unread),
            lambda: summarize_run(run, progress, unread),
            keep=lambda r: not r.transient,
        )

    def _in_background(self, run: logdir.RunFiles) -> tuple[int, int] | None:
        """For a run over PROGRESS_BYTES not summarized yet: start summarizing it on a thread of its own (once) and
        return (bytes done, bytes in all); None when the summary is stored (or the run is small: served at once)."""
        unread = self._snapshots.unread(run)  # read on their own (`SnapshotReads`)
        key = (run.name, (run.fingerprint, unread))
        total = sum(f.bytes for f in run.traces) + sum(f.bytes for f in run.snapshots if f.name not in unread)
        if total <= PROGRESS_BYTES or self._summaries.has(*key):
            return None
        with self._busy_guard:
            if key not in self._busy:
                self._busy[key] = [0, total]
                threading.Thread(
                    target=self._summarize_in_background, args=(run, key), daemon=True, name=f"kprof-summary {run.name}"
                ).start()
            done, total = self._busy[key]
        return done, total

    def _summarize_in_background(self, run: logdir.RunFiles, key: tuple) -> None:
        def progress(done: int, total: int) -> None:
            self._busy[key][:] = [done, total]

        try:
            self._summary(run, progress)
        except Exception:  # the next request summarizes it in the foreground and reports what went wrong
            log.warning("summarizing %s in the background failed", run.name, exc_info=True)
        finally:
            with self._busy_guard:
                del self._busy[key]

    def _folder(self, name: str) -> Path:
        try:
            folder = logdir.inside(self._logdir, name) if self._logdir else None
        except logdir.BadName as exc:
            raise errors.InvalidArgumentError(str(exc)) from exc
        if folder is None:
            raise errors.NotFoundError(f"no folder {name!r} in the logdir")
        return folder

    def _run(self, request: werkzeug.Request, param: str = "run") -> logdir.RunFiles:
        name = request.args.get(param)
        if not name:
            raise errors.InvalidArgumentError(f"missing ?{param}=")
        run = logdir.run_files(self._logdir, self._folder(name))
        if run is None:
            raise errors.NotFoundError(f"no trace files in run {name!r}")
        return run

    def _trace_file(self, request: werkzeug.Request) -> tuple[logdir.RunFiles, logdir.FileStat]:
        """The run and one of its trace files (`?file=`), which lies below the logdir."""
        run = self._run(request)
        name = request.args.get("file", "")
        for trace in run.traces:
            if trace.name == name:
                return run, trace
        if name in run.outside:
            raise errors.PermissionDeniedError(f"{name!r} in run {run.name!r}: {_OUTSIDE}")
        raise errors.NotFoundError(f"no trace file {name!r} in run {run.name!r}")


def _step_number(text: str) -> int:
    """``?step=`` as a step number; 400 for anything else."""
    if not _STEP.fullmatch(text):
        raise errors.InvalidArgumentError(f"step must be a step number, got {text[:40]!r}")
    return int(text)


def _selection(request: werkzeug.Request, side: str) -> list[int] | None:
    """``?a_steps=`` (or ``b_steps``) as step numbers, None when absent or empty (every step); 400 when malformed."""
    spec = request.args.get(f"{side}_steps", "").strip()
    try:
        return parse_steps(spec) if spec else None
    except ValueError as exc:
        raise errors.InvalidArgumentError(f"{side}_steps: {exc}") from exc


def _unprocessable(request: werkzeug.Request, message: str) -> werkzeug.Response:
    """422: the request named a file that exists but cannot be used; the message says which and why."""
    return http_util.Respond(request, message, "text/plain", code=422)
