"""BENCHMARKS.md and TESTING.md show the results of record: their tables are generated from benchmarks/results/*.json
by benchmarks/tables.py, and ``--check`` (run here, so in CI) fails when a document and its data disagree."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "tables.py"
sys.path.insert(0, str(SCRIPT.parent))
import tables  # noqa: E402


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_the_documents_tables_match_the_results_of_record():
    done = run("--check")
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_result_of_record_has_its_provenance_and_a_table():
    used = {table.source for table in tables.TABLES.values()}
    for path in sorted(tables.RESULTS.glob("*.json")):
        data = tables.load(path)  # commit, date, device, versions, command (or one per row), rows
        assert path.name in used, f"{path.name} is shown by no table"
        assert tables.provenance(data).count(" · ") >= 2
    marked = "".join((REPO / name).read_text() for name in tables.DOCUMENTS)
    for name in tables.TABLES:
        assert f"<!-- table: {name} -->" in marked, f"table {name} is in no document"


@pytest.fixture
def copies(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the results and of BENCHMARKS.md, to change."""
    results = tmp_path / "results"
    shutil.copytree(tables.RESULTS, results)
    document = tmp_path / "BENCHMARKS.md"
    shutil.copy(REPO / "BENCHMARKS.md", document)
    return results, document


def test_a_changed_result_fails_the_check_until_the_tables_are_written(copies):
    results, document = copies
    path = results / "mfu-h100.json"
    data = json.loads(path.read_text())
    data["rows"][1]["tflops"] = 612.5
    path.write_text(json.dumps(data))

    stale = run("--check", "--results", str(results), str(document))
    assert stale.returncode == 1
    assert "BENCHMARKS.md: table mfu differs" in stale.stdout
    assert "612.5" not in document.read_text()

    assert run("--results", str(results), str(document)).returncode == 0
    assert "| 612.5 |" in document.read_text()
    assert run("--check", "--results", str(results), str(document)).returncode == 0


def test_a_table_edited_by_hand_fails_the_check(copies):
    results, document = copies
    document.write_text(document.read_text().replace("| 726.1 |", "| 800.0 |"))
    done = run("--check", "--results", str(results), str(document))
    assert done.returncode == 1 and "table mfu differs" in done.stdout


@pytest.mark.parametrize(
    "text, said",
    [
        ("<!-- table: nonesuch -->\n| a |\n<!-- end table -->\n", "no table called 'nonesuch'"),
        ("<!-- table: mfu -->\n| a |\n", "1 table markers but 0 end markers"),
    ],
)
def test_a_bad_marker_is_one_line_and_status_2(tmp_path, text, said):
    document = tmp_path / "doc.md"
    document.write_text(text)
    done = run(str(document))
    assert done.returncode == 2 and said in done.stderr
    assert document.read_text() == text


def test_a_result_without_its_provenance_is_refused(copies):
    results, document = copies
    path = results / "mfu-h100.json"
    data = json.loads(path.read_text())
    del data["command"], data["date"]
    path.write_text(json.dumps(data))
    done = run("--check", "--results", str(results), str(document))
    assert done.returncode == 2 and "mfu-h100.json: no date, command" in done.stderr


def test_a_result_that_names_no_commit_is_refused_and_tables_show_the_commit(copies):
    results, document = copies
    path = results / "mfu-h100.json"
    data = json.loads(path.read_text())
    assert f"· commit {data['commit'][:7]} ·" in tables.render("mfu", results)
    del data["commit"]
    path.write_text(json.dumps(data))
    done = run("--check", "--results", str(results), str(document))
    assert done.returncode == 2 and "mfu-h100.json: no commit" in done.stderr


def test_cells_say_what_is_missing_and_format_lists():
    row = {"a": None, "b": [1.0, 2.25], "c": True, "d": None}
    assert tables.CELLS.cell("{a:.2f}", row) == "—"
    assert tables.CELLS.cell("{d[0]:.1%} ({d[1]:.1%})", row) == "—"
    assert tables.CELLS.cell("{b:.2f}", row) == "1.00, 2.25"
    assert tables.CELLS.cell("{c}", row) == "yes"
