"""Reports written where the user pointed them (`--html OUT`, `--stacks OUT`): what OUT is stays what it was."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from test_diff import noisy_run, write_trace

from kprof_callbacks.cli import main


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A run folder of one small synthetic trace."""
    folder = tmp_path / "log" / "run"
    folder.mkdir(parents=True)
    write_trace(folder / "w.1.pt.trace.json", [{"aten::mm": 10.0, "aten::add": 4.0}] * 4)
    return folder


def _read_fifo(path: Path, got: list[bytes]) -> threading.Thread:
    def read() -> None:
        with open(path, "rb") as f:
            got.append(f.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return reader


@pytest.mark.parametrize("option", ["--html", "--stacks"])
def test_a_fifo_or_a_device_is_written_through_never_replaced(tmp_path, run, capsys, option):
    """As the shell's `>` does: a FIFO gets the report, a device node stays a device (a private /dev/null here: the
    real one, replaced by a file, would break every later process of the machine)."""
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = _read_fifo(fifo, got)
    assert main(["summary", str(run), option, str(fifo)]) == 0
    reader.join(timeout=30)
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert got and (b"<!DOCTYPE html>" in got[0] if option == "--html" else b"aten::mm" in got[0])
    null = tmp_path / "null"
    try:
        os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("making a device node needs root (or CAP_MKNOD)")
    assert main(["summary", str(run), option, str(null)]) == 0
    assert stat.S_ISCHR(null.lstat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log", "null", "out.fifo"]  # no temporary file left
    assert capsys.readouterr().err.endswith(f": {null}\n")


def test_a_link_keeps_pointing_at_its_target_which_gets_the_report(tmp_path, run):
    """A `report.html` link into a web folder: the target is replaced (atomically), the link stays a link."""
    web = tmp_path / "web"
    web.mkdir()
    (web / "report.html").write_text("old")
    link = tmp_path / "report.html"
    link.symlink_to(Path("web") / "report.html")
    dangling = tmp_path / "new.html"
    dangling.symlink_to(web / "new.html")  # the shell's `>` creates a missing target
    for out in (link, dangling):
        assert main(["summary", str(run), "--html", str(out)]) == 0
        assert out.is_symlink() and out.read_text().startswith("<!DOCTYPE html>")
    assert sorted(p.name for p in web.iterdir()) == ["new.html", "report.html"]


def test_a_link_to_a_descriptor_writes_into_it(tmp_path, run):
    """`/dev/stdout` is a link into /proc: the report goes to whatever stdout is open on (a private link of the same
    kind here; the real /dev/stdout replaced by a file would break the machine's)."""
    stdout = tmp_path / "stdout"
    stdout.symlink_to("/proc/self/fd/1")
    done = subprocess.run(
        [sys.executable, "-m", "kprof_callbacks", "summary", str(run), "--html", str(stdout)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "<!DOCTYPE html>" in done.stdout and "aten::mm" in done.stdout
    assert stdout.is_symlink() and sorted(p.name for p in tmp_path.iterdir()) == ["log", "stdout"]


def test_runs_whose_names_differ_only_by_a_slash_get_a_stacks_file_each(tmp_path):
    """Runs `x/y` and `x_y` of one logdir: one folded-stacks file each (the second overwrote the first)."""
    for name in ("x/y", "x_y"):
        folder = tmp_path / "log" / name
        folder.mkdir(parents=True)
        write_trace(folder / "w.1.pt.trace.json", [{f"aten::{name[1]}{i}": 10.0} for i in range(3)])
    assert main(["summary", str(tmp_path / "log"), "--stacks", str(tmp_path / "out.folded")]) == 0
    files = {p.name: p.read_text() for p in tmp_path.glob("out.*.folded")}
    assert set(files) == {"out.x%2Fy.folded", "out.x_y.folded"}
    assert "aten::/0" in files["out.x%2Fy.folded"] and "aten::_0" in files["out.x_y.folded"]


def test_a_regression_exits_3_even_when_the_html_cannot_be_written_on_a_read_only_disk(tmp_path, read_only, capsys):
    """A read-only file system refuses the temporary file and its clean-up: one line, and the gate's status."""
    rng = np.random.default_rng(0)
    a = noisy_run(tmp_path / "a.pt.trace.json", rng, 10)
    b = noisy_run(tmp_path / "b.pt.trace.json", rng, 10, slower={"aten::op25": 3.0, "aten::op3": 3.0})
    out = tmp_path / "ro"
    out.mkdir()
    read_only(out)
    assert main(["diff", str(a), str(b), "--fail-if-slower", "5", "--html", str(out / "r.html")]) == 3
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"kprof diff: could not write {out / 'r.html'}: {os.strerror(30)}"]
    assert main(["summary", str(a), "--html", str(out / "r.html")]) == 1
    assert capsys.readouterr().err == f"kprof summary: could not write {out / 'r.html'}: {os.strerror(30)}\n"
