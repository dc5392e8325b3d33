"""The commands' edges: bad numbers and environment, outputs that go away or fill up, Ctrl-C, and the small
messages around them; each is one line and an exit status, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from test_diff import noisy_run, write_trace

import kprof_callbacks as kprof
from kprof_callbacks.analysis import diff
from kprof_callbacks.analysis import summary as summary_module
from kprof_callbacks.analysis.workers import default_jobs
from kprof_callbacks.cli import main


@pytest.fixture
def run(tmp_path: Path) -> Path:
    folder = tmp_path / "run"
    folder.mkdir()
    write_trace(folder / "w.1.pt.trace.json", [{"aten::mm": 10.0, "aten::add": 4.0}] * 6)
    return folder


def _refused(capsys, argv: list[str]) -> str:
    """The last stderr line of a command refused as bad arguments (exit status 2, from argparse or the command)."""
    try:
        status = main(argv)
    except SystemExit as exc:
        status = exc.code
    assert status == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--steps", "0"], "kprof compare: error: argument --steps: must be an integer >= 3, got '0'"),
        (["--warmup", "-1"], "kprof compare: error: argument --warmup: must be an integer >= 0, got '-1'"),
        (["--batch-size", "0"], "kprof compare: error: argument --batch-size: must be an integer >= 1, got '0'"),
        (["--depth", "٣"], "kprof compare: error: argument --depth: must be an integer >= 1, got '٣'"),
    ],
)
def test_compare_with_bad_numbers_is_one_line_and_exit_2(capsys, argv, line):
    """A traceback with exit status 1 (`--steps 0`, `--warmup -1`), or a whole comparison of empty batches."""
    assert _refused(capsys, ["compare", *argv]) == line


def test_compare_with_a_bad_kprof_variable_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KPROF", "maybe")
    assert _refused(capsys, ["compare", "--logdir", str(tmp_path / "log")]) == (
        "kprof compare: environment variable KPROF must be 1/true/on/yes or 0/false/off/no, got 'maybe'"
    )
    assert not (tmp_path / "log").exists()


def test_numbers_in_other_scripts_and_internal_names_stay_out(tmp_path, run, capsys):
    """`@steps=١-٣` (Arabic-Indic digits) was read as steps 1-3 by the CLI and /diff while /timeline refused it;
    a bad --fail-if-slower said `invalid _percent value`."""
    assert _refused(capsys, ["diff", f"{run}@steps=١-٣", str(run)]) == (
        "kprof diff: bad step selection '١-٣': use numbers and ranges such as 2-4,7"
    )
    assert _refused(capsys, ["diff", str(run), str(run), "--fail-if-slower", "x"]) == (
        "kprof diff: error: argument --fail-if-slower: must be a percentage >= 0, got 'x'"
    )
    assert _refused(capsys, ["summary", str(run), "--top", "١٠"]) == (
        "kprof summary: error: argument --top: must be an integer >= 1, got '١٠'"
    )


def test_the_diff_route_refuses_other_scripts_digits_as_the_timeline_does(run):
    """The route raises TensorBoard's InvalidArgumentError, which TensorBoard answers with a 400."""
    from tensorboard import errors
    from tensorboard.plugins import base_plugin
    from werkzeug.test import Client
    from werkzeug.wrappers import Response

    from kprof_callbacks.tensorboard.plugin import KprofPlugin

    routes = KprofPlugin(base_plugin.TBContext(logdir=str(run.parent), data_provider=None)).get_plugin_apps()
    with pytest.raises(errors.InvalidArgumentError, match="a_steps: bad step selection"):
        Client(routes["/diff"], Response).get("/diff", query_string={"a": "run", "b": "run", "a_steps": "١"})


def test_limits_and_levels_print_as_given(tmp_path, capsys):
    """`--fail-if-slower -0` printed "limit +-0%", and a confidence of 0.999 "100% confidence"."""
    rng = np.random.default_rng(0)
    a, b = (noisy_run(tmp_path / f"{side}.pt.trace.json", rng, 8) for side in "ab")
    assert main(["diff", str(a), str(b), "--fail-if-slower", "-0"]) in (0, 3)
    out = capsys.readouterr().out
    assert "(limit +0%)" in out and "+-0" not in out
    few = diff(f"{a}@steps=0-5", f"{b}@steps=0-5", confidence=0.999)
    with pytest.raises(ValueError, match=r"a side at 99\.9% confidence"):
        few.regressed(5)


def test_more_jobs_than_cores_are_capped_with_one_line(run, capsys):
    """`--jobs 1000` on 2 cores started 76 processes (3.6 GB) and read 4x slower, without a word."""
    cores = default_jobs()
    assert main(["summary", str(run), "--jobs", str(cores + 998)]) == 0
    assert capsys.readouterr().err == (
        f"kprof summary: --jobs {cores + 998} is more than the {cores} cores here; reading with {cores}\n"
    )


def _kprof(*args: str, stdout) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kprof_callbacks", *args], stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=120
    )


def test_an_output_that_went_away_or_is_full_is_no_traceback(run):
    """`kprof summary RUN | head` (a reader that has gone) and `> /dev/full` printed tracebacks."""
    read, write = os.pipe()
    os.close(read)  # the reader went away before kprof wrote a byte
    try:
        gone = _kprof("summary", str(run), stdout=write)
    finally:
        os.close(write)
    assert (gone.returncode, gone.stderr) == (141, "")
    with open("/dev/full", "w") as full:
        done = _kprof("summary", str(run), stdout=full)
    assert done.returncode == 1
    assert done.stderr == "kprof summary: could not write the output: No space left on device\n"


def test_ctrl_c_is_one_line_and_exit_130(run, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(summary_module, "summarize", interrupted)
    assert main(["summary", str(run)]) == 130
    assert capsys.readouterr().err == "kprof summary: interrupted\n"


def test_numpy_numbers_are_numbers(tmp_path):
    """`active=np.int64(3)` was refused as "active must be int, got int64"."""
    config = kprof.ProfileConfig.from_kwargs(active=np.int64(3), max_trace_mb=np.float32(2.0))
    assert (config.active, type(config.active), config.max_trace_mb, type(config.max_trace_mb)) == (3, int, 2.0, float)


def test_a_mistyped_kprof_variable_is_named_once(monkeypatch):
    monkeypatch.setenv("KPROF_ACTVE", "5")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            kprof.ProfileConfig.from_kwargs()
    assert [str(w.message) for w in caught] == [
        "kprof: the environment variable KPROF_ACTVE is not one kprof reads (did you mean KPROF_ACTIVE?); it is ignored"
    ]


@pytest.mark.parametrize("peak", [1e300, 1e-9])
def test_an_impossible_peak_is_refused(tmp_path, peak):
    with pytest.raises(ValueError, match="peak_tflops is one device's dense peak in TFLOP/s"):
        kprof.session(tmp_path, peak_tflops=peak)


def test_a_small_peak_is_printed_with_its_digits(tmp_path):
    """A peak of 0.004 TFLOP/s (a CPU core) read "0.0 TFLOP/s" in the MFU finding."""
    with kprof.session(tmp_path, run="r", wait=5, peak_tflops=0.004) as s:
        for _ in range(12):
            s.step(flops=1e6)
    (finding,) = [d for d in s.summary().diagnostics if d.kind.startswith("mfu")]
    assert "0.004 TFLOP/s" in finding.message and " 0.0 TFLOP/s" not in finding.message


def test_a_loop_that_ends_before_the_first_window_says_so(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with kprof.session(tmp_path, run="r", wait=10, warmup=1, active=3) as s:
            for _ in range(4):
                s.step()
    assert [str(w.message) for w in caught if str(w.message).startswith("kprof:")] == [
        "kprof: the loop ended after 4 steps, before the schedule's first window (steps 11-13): nothing was "
        "recorded; run more steps or lower skip_first, wait or warmup"
    ]
