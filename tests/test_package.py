"""The top-level package: the public names the README documents stay functions, whatever was imported before."""

import ast
import importlib
from pathlib import Path

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


ROOT = Path(__file__).resolve().parent.parent


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """Each ``from X import names`` and ``import X`` of a file, X made absolute (``kprof_callbacks.analysis.fmt``)."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            found.append((module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names]
    return found


def test_outside_the_analysis_package_only_its_public_names_are_imported():
    """The CLI, the session, the tab, compare and the examples use ``kprof_callbacks.analysis``'s ``__all__`` alone:
    a module inside it can change without them."""
    from kprof_callbacks import analysis

    files = [p for p in (ROOT / "kprof_callbacks").rglob("*.py") if "analysis" not in p.relative_to(ROOT).parts]
    files += list((ROOT / "examples").glob("*.py"))
    wrong = []
    for path in files:
        for module, names in _imports(path):
            inside = module.startswith("kprof_callbacks.analysis.")
            private = module == "kprof_callbacks.analysis" and set(names) - set(analysis.__all__)
            if inside or private:
                wrong.append(f"{path.relative_to(ROOT)}: {module} {names}")
    assert not wrong, wrong
    assert len(files) > 40  # the walk found the package
