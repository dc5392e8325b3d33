"""The top-level package: the public names the README documents stay functions, whatever was imported before."""

import importlib

import kprof_callbacks as kprof


def test_public_names_survive_submodule_imports():
    for module in ("compare", "swap", "session", "callback", "analysis", "kernels"):
        importlib.import_module(f"kprof_callbacks.{module}")
    for name in ("session", "compare", "swap", "summarize", "time_cuda"):
        assert callable(getattr(kprof, name)), name
    assert isinstance(kprof.ProfilerCallback, type) and isinstance(kprof.Comparison, type)
    assert kprof.kernels.__name__ == "kprof_callbacks.kernels"


def test_python_dash_m_runs_the_cli(capsys):
    from kprof_callbacks.cli import main

    try:
        main(["--help"])
    except SystemExit as exc:
        assert exc.code == 0
    out = capsys.readouterr().out
    for command in ("demo", "summary", "compare", "bench", "tensorboard"):
        assert command in out
