"""The CI gate: a saved summary is side A of a diff, `--fail-if-slower` fails a slower run (exit 3) and names what
grew, passes two runs of the same code, and every exit status means one thing."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_diff import noisy_run, write_trace

from kprof_callbacks.analysis import diff, summarize
from kprof_callbacks.analysis.summary import Summary
from kprof_callbacks.cli import main


def _side_a(d) -> dict:
    """A diff's dict without where side A came from (a trace file or the summary saved from it)."""
    doc = d.to_dict()
    doc["a"].pop("source")
    return doc


# --- a saved summary as side A ---------------------------------------------------------------------------------------


def test_summary_json_round_trips_into_diff(tmp_path, capsys):
    """`kprof summary --json > base.json` keeps the per-step rows: diffing against it gives the diff of the traces."""
    rng = np.random.default_rng(0)
    a = noisy_run(tmp_path / "a.pt.trace.json", rng, 8)
    b = noisy_run(tmp_path / "b.pt.trace.json", rng, 8, slower={"aten::op25": 1.5}, extra_kernel="my_new_kernel")
    assert main(["summary", str(a), "--json"]) == 0
    saved = tmp_path / "base.json"
    saved.write_text(capsys.readouterr().out)
    assert _side_a(diff(saved, b)) == _side_a(diff(a, b))
    assert _side_a(diff(f"{saved}@steps=2-7", b)) == _side_a(diff(f"{a}@steps=2-7", b))
    again = summarize(saved)  # read back as it was saved: every table, the findings, the per-step rows
    original = summarize(a)
    assert isinstance(again, Summary) and again.to_dict() == json.loads(json.dumps(original.to_dict()))
    assert again.render() == original.render()
    assert saved.stat().st_size < a.stat().st_size / 2


def test_a_saved_logdir_of_runs_is_one_side_only_when_it_holds_one_run(tmp_path, capsys):
    for name in ("x", "y"):
        (tmp_path / "log" / name).mkdir(parents=True)
        write_trace(tmp_path / "log" / name / "w.1.pt.trace.json", [{"aten::mm": 10.0}] * 4)
    assert main(["summary", str(tmp_path / "log"), "--json"]) == 0
    both = tmp_path / "both.json"
    both.write_text(capsys.readouterr().out)
    assert set(summarize(both)) == {"x", "y"}
    with pytest.raises(ValueError, match="holds 2 runs"):
        diff(both, tmp_path / "log" / "x")
    doc = json.loads(both.read_text())
    one = tmp_path / "one.json"
    one.write_text(json.dumps({"x": doc["x"]}))
    assert diff(one, tmp_path / "log" / "y").a.run == "x"


def test_a_saved_summary_of_another_format_is_refused_with_why(tmp_path):
    run = write_trace(tmp_path / "a.pt.trace.json", [{"aten::mm": 10.0}] * 4)
    doc = summarize(run).to_dict()
    old = tmp_path / "old.json"
    old.write_text(json.dumps({**doc, "kprof_summary": 0}))
    with pytest.raises(ValueError, match="not a saved kprof summary of version 1 .*kprof summary --json"):
        diff(old, run)
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({k: v for k, v in doc.items() if k != "per_step"}))
    with pytest.raises(ValueError, match="broken.json: cannot read this saved kprof summary"):
        summarize(broken)


# --- the gate -----------------------------------------------------------------------------------------------------


def labelled_run(path: Path, rng: np.random.Generator, n: int, **kwargs) -> Path:
    """`noisy_run` with each step's work inside a record_function label "forward"."""
    noisy_run(path, rng, n, **kwargs)
    events = json.loads(path.read_text())["traceEvents"]
    events += [{**e, "name": "forward", "dur": e["dur"] - 0.5} for e in events if e["name"].startswith("ProfilerStep#")]
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def _regression(tmp_path: Path) -> tuple[Path, Path]:
    """A and a B whose aten::op25 takes 1.5x as long and that runs one more kernel: ~9% slower a step."""
    rng = np.random.default_rng(0)
    return (
        labelled_run(tmp_path / "a.pt.trace.json", rng, 8),
        labelled_run(tmp_path / "b.pt.trace.json", rng, 8, slower={"aten::op25": 1.5}, extra_kernel="my_kernel"),
    )


def test_a_slower_run_fails_the_gate_and_the_report_names_what_grew(tmp_path, capsys):
    a, b = _regression(tmp_path)
    d = diff(a, b)
    low, high = d.step_time.change_interval
    assert 0.05 < low < high < 0.2  # the slowdown's interval: above 5%, below 20%
    assert d.regressed(5) and not d.regressed(100 * high) and not diff(b, a).regressed(0)
    assert d.regressed(100 * low - 0.01) and not d.regressed(100 * low + 0.01)  # the interval's bound decides
    assert main(["diff", str(a), str(b), "--fail-if-slower", "5"]) == 3
    gate = capsys.readouterr().out.split("\n\n")[-1].rstrip()
    assert gate.startswith("Regression (limit +5%): B's typical step is ") and "all of the interval above" in gate
    grew = gate.split("What grew, largest share of the change in mean step time first: ")[1]
    named = re.findall(r"(?:^|, )([^,]+?) \+\S+ (?:us|ms|s) per step \((?:increased|new), (\d+)%\)", grew)
    assert [name for name, _ in named] == ["label 'forward'", "GPU idle", "aten::op25"]  # the label holds op25
    shares = [int(share) for _, share in named]
    assert shares == sorted(shares, reverse=True)
    together = int(re.search(r"; the rows that grew explain (\d+)% of it together\.$", grew)[1])
    assert shares[0] <= together <= 100  # no time counted twice: the label holds op25
    saved = tmp_path / "base.json"
    assert main(["summary", str(a), "--json"]) == 0
    saved.write_text(capsys.readouterr().out)
    assert main(["diff", str(saved), str(b), "--fail-if-slower", "5", "--json"]) == 3
    doc = json.loads(capsys.readouterr().out)
    assert doc["gate"]["regressed"] is True and doc["gate"]["report"] == gate
    assert main(["diff", str(saved), str(b), "--fail-if-slower", "20"]) == 0
    assert capsys.readouterr().out.split("\n\n")[-1].startswith("No regression (limit +20%): B's typical step is ")


def test_two_runs_of_the_same_code_pass_the_gate(tmp_path):
    """Seeded noise only, 8 steps a side: a 5% gate never fails; even a 0% gate (any significant slowdown) fails at
    most at the interval's own error rate."""
    trials, at_5, at_0 = 40, 0, 0
    for seed in range(trials):
        rng = np.random.default_rng(300 + seed)
        d = diff(noisy_run(tmp_path / "a.pt.trace.json", rng, 8), noisy_run(tmp_path / "b.pt.trace.json", rng, 8))
        at_5 += d.regressed(5)
        at_0 += d.regressed(0)
    assert at_5 == 0
    assert at_0 <= 0.08 * trials
    same = diff(tmp_path / "a.pt.trace.json", tmp_path / "a.pt.trace.json").render(fail_if_slower=5)
    assert (
        same.endswith(
            "]; the gate fails only when B is significantly slower and the whole interval lies above the limit."
        )
        and "No regression (limit +5%): B's typical step is as long as A's [95% CI: " in same
    )


def test_too_few_steps_give_no_verdict_and_exit_1(tmp_path, capsys):
    a, b = _regression(tmp_path)
    d = diff(f"{a}@steps=0-2", f"{b}@steps=0-2")
    with pytest.raises(ValueError, match="too few steps to tell a regression: 3 against 3; .* needs 4 a side"):
        d.regressed(5)
    assert main(["diff", f"{a}@steps=0-2", f"{b}@steps=0-2", "--fail-if-slower", "5"]) == 1
    out, err = capsys.readouterr()
    assert out.split("\n\n")[-1].startswith("No verdict (limit +5%): too few steps")  # the report is still printed
    assert err.startswith("kprof diff: --fail-if-slower: too few steps")
    for bad in (-1, float("nan"), True, "5"):
        with pytest.raises(ValueError, match="percentage >= 0"):
            d.regressed(bad)


def test_exit_statuses(tmp_path, capsys, monkeypatch):
    """0 fine, 1 unreadable input, 2 bad arguments, 3 regression (also when the HTML report could not be written)."""
    a, b = _regression(tmp_path)
    statuses = {
        "same": main(["diff", str(a), str(a), "--fail-if-slower", "5"]),
        "missing": main(["diff", str(a), str(tmp_path / "nope")]),
        "not in run": main(["diff", f"{a}@steps=20", str(b)]),
        "bad selection": main(["diff", f"{a}@steps=0-x", str(b)]),
        "html to a folder": main(["diff", str(a), str(b), "--html", str(tmp_path)]),
        "summary of nothing": main(["summary", str(tmp_path / "nope")]),
    }
    assert statuses == {
        "same": 0,
        "missing": 1,
        "not in run": 1,
        "bad selection": 2,
        "html to a folder": 2,
        "summary of nothing": 1,
    }
    for argv in (
        ["diff", str(a), str(b), "--fail-if-slower", "-1"],
        ["diff", str(a), str(b), "--json", "--markdown"],
        ["summary", str(a), "--json", "--markdown"],
        ["diff", str(a), str(b), "--fail-if-slower", "x"],
    ):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2, argv
    capsys.readouterr()

    def disk_full(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", disk_full)
    assert main(["diff", str(a), str(b), "--fail-if-slower", "5", "--html", str(tmp_path / "d.html")]) == 3
    assert main(["diff", str(a), str(a), "--fail-if-slower", "5", "--html", str(tmp_path / "d.html")]) == 1


# --- the same gate on kprof compare ----------------------------------------------------------------------------------


def timed_comparison(seed: int, slower: float):
    """A Comparison of seeded step times (30 rounds of 2 steps, 5% noise): "same" draws from the baseline's
    distribution, "slow" takes `slower` times as long."""
    torch = pytest.importorskip("torch")
    from kprof_callbacks.compare.run import _results
    from kprof_callbacks.compare.variants import Variant

    rng = np.random.default_rng(seed)
    runs = [Variant(name, None) for name in ("base", "same", "slow")]
    for run, scale in zip(runs, (1.0, 1.0, slower)):
        run.rounds = [list(0.01 * scale * rng.lognormal(0, 0.05, size=2)) for _ in range(30)]
    settings = dict(steps=60, warmup=0, block=2, seed=0, confidence=0.95, noise_threshold=0.02, compile=False)
    return _results(runs, settings, torch.device("cpu"))


def test_compare_gates_each_variant_against_the_baseline():
    for seed in range(20):
        assert timed_comparison(seed, slower=1.0).regressed(5) == []
    result = timed_comparison(0, slower=1.3)
    assert result.regressed(5) == ["slow"] and result.regressed(50) == []
    with pytest.raises(ValueError, match="percentage >= 0"):
        result.regressed(-5)


@pytest.mark.usefixtures("one_thread")  # a 16-wide model: OpenMP threads beside busy test workers only add noise
def test_compare_cli_exits_3_on_a_slower_variant_and_names_it(monkeypatch, capsys):
    """The builtin model against a copy that sleeps 20 ms a step."""
    torch = pytest.importorskip("torch")
    import copy
    import time

    from kprof_callbacks.compare import command as compare_cli

    class Slow(torch.nn.Module):
        def __init__(self, net):
            super().__init__()
            self.net = copy.deepcopy(net)

        def forward(self, x):
            time.sleep(0.02)
            return self.net(x)

    monkeypatch.setattr(compare_cli, "_swapped_variants", lambda impls: {"sleepy": Slow})
    argv = [
        "compare",
        "--steps",
        "6",
        "--warmup",
        "2",  # a first step's warm-up would make the baseline noisy: the gate would go by the widened interval
        "--device",
        "cpu",
        "--width",
        "16",
        "--depth",
        "1",
        "--batch-size",
        "4",
        "--check",
        "off",
    ]
    assert main(argv + ["--fail-if-slower", "50"]) == 3
    out, err = capsys.readouterr()
    assert "sleepy" in out and err.strip().endswith("slower than torch by more than 50%: sleepy")
    assert main(argv + ["--fail-if-slower", "100000"]) == 0


def test_compare_cli_bad_arguments_exit_2(capsys):
    for argv in (["--model", "my_setup"], ["--impls", "nope"], ["--fail-if-slower", "-3"]):
        with pytest.raises(SystemExit) as exc:
            main(["compare", "--device", "cpu", *argv])
        assert exc.value.code == 2, argv
    assert "--model must be 'builtin' or MODULE:ATTR" in capsys.readouterr().err


# --- the recipe: examples/ci_gate -------------------------------------------------------------------------------------

GATE = Path(__file__).resolve().parent.parent / "examples" / "ci_gate"


def _gate(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    train = f"{shlex.quote(sys.executable)} {shlex.quote(str(GATE / 'train.py'))} --logdir {{logdir}}"
    argv = [sys.executable, str(GATE / "gate.py"), *(a.replace("TRAIN", train) for a in args)]
    return subprocess.run(
        argv, cwd=cwd, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )


def test_the_gate_script_fails_a_slower_pull_request_and_passes_a_faster_one(tmp_path):
    """Main against a pull request that sleeps 30 ms a step in a label: exit 3, naming the label; its saved summary
    as the baseline of a pull request without the sleep: exit 0."""
    done = _gate(
        tmp_path,
        "--base",
        "TRAIN",
        "--pr",
        "TRAIN --extra-ms 30",
        "--steps",
        "6",
        "--fail-if-slower",
        "5",
        "--workdir",
        "one",
        "--save-summary",
        "slow.json",
    )
    assert done.returncode == 3, done.stdout[-3000:] + done.stderr[-3000:]
    assert "mean step time first: label 'extra' +" in done.stdout.split("Regression (limit +5%)")[1]
    done = _gate(
        tmp_path, "--base-summary", "slow.json", "--pr", "TRAIN", "--steps", "6", "--workdir", "two", "--markdown"
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.startswith("### kprof diff: B against A") and "**No regression (limit +5%)" in done.stdout
    assert not (tmp_path / "two" / "base").exists()  # the saved summary stood in for main's run
    assert _gate(tmp_path, "--base", "TRAIN", "--pr", "TRAIN", "--workdir", "two").returncode == 2  # not empty


def test_the_workflow_runs_the_gate_with_options_it_has():
    yaml = pytest.importorskip("yaml")
    workflow = yaml.safe_load((GATE / "kprof-gate.yml").read_text())
    (script,) = [s["run"] for s in workflow["jobs"]["step-time"]["steps"] if "kprof_gate.py" in s.get("run", "")]
    options = set(re.findall(r"(--[a-z-]+)", script))
    assert {"--base", "--pr", "--fail-if-slower", "--markdown"} <= options
    helped = subprocess.run([sys.executable, str(GATE / "gate.py"), "--help"], capture_output=True, text=True).stdout
    assert all(option in helped for option in options), options
    assert "{logdir}" in script and "$GITHUB_STEP_SUMMARY" in script and "exit $status" in script
