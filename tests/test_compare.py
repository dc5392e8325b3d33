"""kprof.compare on real (tiny) models: timing verdicts, the numerical check, traces, bad input, failing variants."""

from __future__ import annotations

import copy
import itertools
import json
import math
import random
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from kprof_callbacks import stats
from kprof_callbacks.cli import main
from kprof_callbacks.compare import ComparisonError, compare
from kprof_callbacks.kernels import KernelBuildError

pytestmark = pytest.mark.usefixtures("one_thread")


class Clock:
    """``time.perf_counter`` as the timing tests see it: it moves only when a ``Sleepy`` variant says so, so their
    step times are the ones they set, whatever else loads the machine."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(time, "perf_counter", fake)
    return fake


class Sleepy(nn.Module):
    """Wraps a model and spends ``seconds`` in its forward: a variant whose step time we know. With a ``clock`` the
    time passes on that clock alone (no sleep, no scheduler in the way)."""

    def __init__(self, inner: nn.Module, seconds: float | Callable[[], float], clock: Clock | None = None) -> None:
        super().__init__()
        self.inner, self.seconds, self.clock = inner, seconds, clock

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seconds = self.seconds() if callable(self.seconds) else self.seconds
        if self.clock is None:
            time.sleep(seconds)
        else:
            self.clock.now += seconds
        return self.inner(x)


def jittered(seconds: float, seed: int) -> Callable[[], float]:
    """``seconds``, give or take a few percent, from a seeded generator: step times with a spread."""
    rng = random.Random(seed)
    return lambda: seconds * rng.lognormvariate(0.0, 0.05)


class Broken(nn.Sequential):
    """The MLP's layers (same state_dict names) whose forward raises, as a kernel that fails at run time."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("kernel launch failed: invalid configuration")


class _DoubleGrad(torch.autograd.Function):
    """Identity forward, backward that doubles the gradient: right outputs, wrong gradients."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return 2 * grad


class MaybeWrongGrad(nn.Module):
    """The MLP's layers, with the gradient into the last layer doubled when ``wrong``."""

    def __init__(self, inner: nn.Sequential, wrong: bool) -> None:
        super().__init__()
        self.inner, self.wrong = inner, wrong

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.inner[1](self.inner[0](x))
        return self.inner[2](_DoubleGrad.apply(hidden) if self.wrong else hidden)


def mlp(seed: int = 0, act: nn.Module | None = None) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 64), act or nn.GELU(), nn.Linear(64, 4))


BATCHES = [torch.randn(16, 32, generator=torch.Generator().manual_seed(i)) for i in range(4)]


def loss_fn(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x).pow(2).mean()


class CountingStep:
    """A step_fn that records which model ran on which batch, in call order."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []  # (id(model), index of the batch in BATCHES)

    def __call__(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        self.calls.append((id(model), next(i for i, b in enumerate(BATCHES) if torch.equal(b, x))))
        assert all(b is not x for b in BATCHES)  # each variant steps on its own copy, never on the caller's tensors
        return loss_fn(model, x)


# -- timing ------------------------------------------------------------------------------------------------------
def test_identical_variants_show_no_significant_difference(clock):
    """Two variants whose steps take 2 ms +- 5% (on the test's clock: a loaded machine once made this "noisy")."""
    base = mlp()
    variants = {
        "a": Sleepy(base, jittered(0.002, 1), clock),
        "b": Sleepy(copy.deepcopy(base), jittered(0.002, 2), clock),
    }
    # 99%: a 95% interval excludes 1.0 for identical variants one time in twenty, by construction
    result = compare(variants, loss_fn, BATCHES, steps=40, warmup=2, confidence=0.99)
    b = result["b"]
    assert result.baseline == "a" and result["a"].verdict == "baseline"
    assert b.verdict == stats.SAME and b.ci[0] < 1.0 < b.ci[1] and b.ci[0] <= b.speedup <= b.ci[1]
    assert 0.95 < b.speedup < 1.05
    assert len(b.timing.times_ms) == 40 and all(1.6 < t < 2.5 for t in b.timing.times_ms)  # what the clock moved


def test_slowed_variant_is_detected_as_slower_with_about_the_right_ratio(clock):
    base = mlp()
    variants = {
        "fast": Sleepy(base, jittered(0.003, 1), clock),
        "slow": Sleepy(copy.deepcopy(base), jittered(0.009, 2), clock),
    }
    result = compare(variants, loss_fn, BATCHES, steps=30, warmup=2)
    slow = result["slow"]
    assert slow.verdict == stats.SLOWER
    assert slow.ci[0] < 1 / 3 < slow.ci[1] < 1.0  # 3 ms / 9 ms
    assert slow.timing.median_ms > result["fast"].timing.median_ms


def loaded(seconds: float, slow_every: int = 5) -> Callable[[], float]:
    """``seconds`` a step, every ``slow_every``-th step twice that (other load): p90/median 2.0 over 20 steps."""
    calls = itertools.count()
    return lambda: seconds * (2.0 if next(calls) % slow_every == slow_every - 1 else 1.0)


def test_a_10x_slower_variant_on_a_noisy_machine_is_slower(clock):
    """The baseline's steps spread to p90/median 2.0 (load), the variant is 10x slower: the interval widened by that
    spread still excludes no change, so the verdict is "slower", with a note that the machine was noisy that quotes
    the variant's own spread beside the baseline's."""
    base = mlp()
    variants = {
        "fast": Sleepy(base, loaded(0.0005), clock),
        "slow": Sleepy(copy.deepcopy(base), jittered(0.005, 2), clock),
    }
    result = compare(variants, loss_fn, BATCHES, steps=20, warmup=1, check=False)
    slow = result["slow"]
    assert stats.spread(result["fast"].timing.times_ms) == pytest.approx(2.0)
    assert slow.verdict == stats.SLOWER and slow.ci[1] < slow.noise_ci[1] < 1.0 and slow.noise_ci[0] <= slow.ci[0]
    own = stats.spread(slow.timing.times_ms)
    assert f"p90/median of its step times is {own:.2f}, of fast's 2.00" in slow.note and own < 1.2
    assert f"slow: slower: the machine was noisy (p90/median of its step times is {own:.2f}" in str(result)
    limit = 100 * (1 / slow.noise_ci[1] - 1)  # the gate goes by the widened interval: surely this much slower
    assert 1 / slow.ci[1] - 1 > limit / 100 + 0.1 > 8  # (the plain one, surely slower by more)
    assert result.regressed(limit - 1) == ["slow"] and result.regressed(limit + 1) == []


def test_each_variant_on_a_noisy_machine_quotes_its_own_spread(clock):
    """A noisy baseline against a steady variant of the same speed (the noise could change that answer: "noisy
    measurement") and a steady one twice as slow (it cannot: "slower"): each note gives that variant's own spread."""
    base = mlp()
    variants = {
        "base": Sleepy(base, loaded(0.002, slow_every=4), clock),
        "same": Sleepy(copy.deepcopy(base), jittered(0.002, 3), clock),
        "twice": Sleepy(copy.deepcopy(base), jittered(0.004, 4), clock),
    }
    result = compare(variants, loss_fn, BATCHES, steps=20, warmup=1, check=False)
    same, twice = result["same"], result["twice"]
    spreads = {v.name: stats.spread(v.timing.times_ms) for v in (same, twice)}
    assert all(s < 1.2 for s in spreads.values()) and spreads["same"] != spreads["twice"]
    assert same.verdict == stats.NOISY
    assert same.note.startswith(f"p90/median of its step times is {spreads['same']:.2f}, of base's 2.00: other load")
    assert twice.verdict == stats.SLOWER
    assert twice.note.startswith(
        f"the machine was noisy (p90/median of its step times is {spreads['twice']:.2f}, of base's 2.00)"
    )


def test_identical_variants_under_load_are_rarely_called_different():
    """Seeded load (bursts that double a round's steps) on two identical variants: at most the published rate of
    "faster"/"slower" verdicts (docs/findings.md, "compare under load")."""
    rng = np.random.default_rng(0)
    wrong = 0
    for trial in range(100):
        burst = np.where(rng.random(50) < 0.2, rng.uniform(1.5, 3.0, 50), 1.0)
        base = [[1e-3 * b * rng.lognormal(0, 0.05)] for b in burst]
        other = [[1e-3 * b * rng.lognormal(0, 0.05) * (rng.uniform(1.5, 3.0) if rng.random() < 0.1 else 1.0)]
                 for b in burst]  # fmt: skip
        speedup, low, high = stats.speedup_interval(base, other, seed=trial)
        verdict, _, _ = stats.judge(speedup, low, high, sum(base, []), sum(other, []), rounds=50)
        wrong += verdict in (stats.FASTER, stats.SLOWER)
    assert wrong <= 5


def test_a_step_fn_that_changes_its_batch_in_place_fails_no_correct_variant():
    """Each variant gets its own copy of the batches: the in-place change of one never reaches another (or the
    caller)."""
    originals = [b.clone() for b in BATCHES]

    def scaling_step(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2.0)  # e.g. normalization done in place by the user's code
        return loss_fn(model, x)

    result = compare({"a": mlp(), "b": mlp()}, scaling_step, BATCHES, steps=4, warmup=1)
    assert result["b"].check_ok and result["b"].check_max_rel_err == result["b"].check_ref_err
    assert all(torch.equal(b, o) for b, o in zip(BATCHES, originals))


def test_every_variant_sees_the_same_batches_and_variants_are_interleaved():
    a, b = mlp(), mlp()
    step = CountingStep()
    compare({"a": a, "b": b}, step, iter(BATCHES), steps=12, warmup=2, block=3, check=False)
    per_model = {id(a): [], id(b): []}
    for model, batch in step.calls:
        per_model[model].append(batch)
    assert per_model[id(a)] == per_model[id(b)] == [i % 4 for i in range(14)]
    timed = [model for model, _ in step.calls[4:]]  # after each variant's 2 warm-up steps
    switches = sum(x != y for x, y in zip(timed, timed[1:]))
    assert switches >= 3  # 4 rounds of blocks of 3, never all of one variant then all of the other


def test_optimizer_factory_gives_each_variant_its_own_optimizer():
    a, b = mlp(), mlp()
    before = copy.deepcopy(a.state_dict())
    made = []

    def factory(params):
        made.append(torch.optim.SGD(params, lr=0.1))
        return made[-1]

    compare({"a": a, "b": b}, loss_fn, BATCHES, steps=3, warmup=0, optimizer=factory)
    assert len(made) == 2
    assert not torch.equal(a.state_dict()["0.weight"], before["0.weight"])
    assert torch.equal(a.state_dict()["0.weight"], b.state_dict()["0.weight"])  # same start, same batches


def test_without_optimizer_weights_stay_put():
    a = mlp()
    before = copy.deepcopy(a.state_dict())
    compare({"a": a}, loss_fn, BATCHES, steps=3, warmup=1)
    assert all(torch.equal(before[k], v) for k, v in a.state_dict().items())


# -- numerical check ---------------------------------------------------------------------------------------------
def test_check_loads_the_first_variants_weights_into_the_others():
    a, b = mlp(seed=0), mlp(seed=1)
    result = compare({"a": a, "b": b}, loss_fn, BATCHES, steps=3, warmup=0)
    assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())
    b_result = result["b"]
    assert b_result.check_ok is True and b_result.check_basis == "float64"
    assert b_result.check_max_rel_err == b_result.check_ref_err < 1e-6  # the same numbers as "a", as far from float64
    assert b_result.check_against == "a" and result["a"].check_ok is None


def test_wrong_forward_fails_the_check_before_any_timed_step():
    step = CountingStep()
    with pytest.raises(ComparisonError, match=r"relu.*output#0"):
        compare({"gelu": mlp(), "relu": mlp(act=nn.ReLU())}, step, BATCHES, steps=5)
    assert len(step.calls) == 3  # the one check step of each variant, and the reference's in float64


def test_wrong_gradient_fails_the_check_naming_the_parameter():
    variants = {"good": MaybeWrongGrad(mlp(), wrong=False), "wrong": MaybeWrongGrad(mlp(), wrong=True)}
    with pytest.raises(ComparisonError, match=r"wrong: .*grad of inner\.0\.weight"):
        compare(variants, loss_fn, BATCHES, steps=5)


def test_check_warn_reports_the_mismatch_and_still_times():
    variants = {"gelu": mlp(), "relu": mlp(act=nn.ReLU())}
    with pytest.warns(RuntimeWarning, match="disagree"):
        result = compare(variants, loss_fn, BATCHES, steps=3, warmup=0, check="warn")
    relu = result["relu"]
    assert relu.check_ok is False and relu.check_worst == "output#0" and relu.check_max_rel_err > 1e-2
    assert relu.timing is not None and "FAIL" in str(result)


def test_tolerance_follows_dtype_and_can_be_overridden():
    exact, approx = mlp(act=nn.GELU()), mlp(act=nn.GELU(approximate="tanh"))  # differ by ~1e-4 relative
    with pytest.raises(ComparisonError):
        compare({"exact": exact, "tanh": approx}, loss_fn, BATCHES, steps=3, tol=1e-6)
    result = compare({"exact": exact, "tanh": approx}, loss_fn, BATCHES, steps=3, tol=1e-2)
    assert 0 < result["tanh"].check_max_rel_err < 1e-2 and result["tanh"].check_ok
    double = compare({"a": mlp().double(), "b": mlp().double()}, loss_fn, [b.double() for b in BATCHES], steps=3)
    assert double["b"].check_basis == "float64" and double["b"].check_tol < 1e-14  # float64 is its own truth


def test_dropout_sees_the_same_random_numbers_in_every_variant():
    a = nn.Sequential(nn.Linear(32, 64), nn.Dropout(0.5), nn.Linear(64, 4))
    result = compare({"a": a, "b": copy.deepcopy(a)}, loss_fn, BATCHES, steps=3, warmup=0)
    assert result["b"].check_ok and result["b"].check_max_rel_err == result["b"].check_ref_err


# -- failures are reported, the others finish ----------------------------------------------------------------------
def test_a_variant_that_raises_is_reported_and_the_others_finish():
    def build_fails():
        raise KernelBuildError("nvcc failed: see build.log")

    base = mlp()
    variants = {
        "torch": base,
        "broken": Broken(*copy.deepcopy(base)),
        "nobuild": build_fails,
        "copy": lambda: copy.deepcopy(base),
    }
    result = compare(variants, loss_fn, BATCHES, steps=5, warmup=1)
    assert result["broken"].status == "error" and "invalid configuration" in result["broken"].error
    assert result["nobuild"].status == "error" and result["nobuild"].error.startswith("KernelBuildError")
    assert result["broken"].timing is None
    assert result["torch"].status == result["copy"].status == "ok"
    assert len(result["copy"].timing.times_ms) == 5 and result["copy"].check_ok
    text = str(result)
    assert "broken: RuntimeError: kernel launch failed" in text and "nobuild: KernelBuildError" in text


def test_when_the_first_variant_fails_the_next_one_is_the_baseline():
    base = mlp()
    result = compare(
        {"broken": Broken(*base), "a": copy.deepcopy(base), "b": copy.deepcopy(base)},
        loss_fn,
        BATCHES,
        steps=4,
        warmup=0,
    )
    assert result.baseline == "a" and result["a"].verdict == "baseline"
    assert result["b"].check_against == "a" and result["b"].speedup is not None


# -- logdir ----------------------------------------------------------------------------------------------------------
def test_logdir_gets_one_trace_folder_per_variant_and_compare_json(tmp_path):
    base = mlp()
    result = compare(
        {"torch": base, "copy": copy.deepcopy(base)},
        loss_fn,
        BATCHES,
        steps=4,
        warmup=0,
        logdir=tmp_path,
        optimizer=lambda p: torch.optim.SGD(p, lr=0.01),
    )
    for name in ("torch", "copy"):
        traces = list((tmp_path / name).glob("*.pt.trace.json"))
        assert len(traces) == 1
        events = {e.get("name") for e in json.loads(traces[0].read_text())["traceEvents"]}
        assert {"forward", "backward", "optimizer"} <= events
        assert result[name].trace_dir == str(tmp_path / name)
    saved = json.loads((tmp_path / "compare.json").read_text())
    assert saved == json.loads(json.dumps(result.to_dict()))
    assert [v["name"] for v in saved["variants"]] == ["torch", "copy"]
    assert len(saved["variants"][1]["times_ms"]) == 4
    assert not list(tmp_path.glob("*.partial"))


def test_with_a_logdir_each_variant_says_what_changed_in_its_traces(tmp_path):
    """compare(..., logdir=) diffs every variant's profiled steps against the baseline's (kprof.diff)."""
    variants = {"gelu": mlp(), "tanh": mlp(act=nn.Tanh())}
    result = compare(variants, loss_fn, BATCHES, steps=4, warmup=0, check=False, logdir=tmp_path, profile={"active": 5})
    assert result["gelu"].trace_diff is None  # the baseline
    diff = result["tanh"].trace_diff.lower()  # operators (aten::tanh) on a CPU, kernels (tanh_kernel_cuda) on a GPU
    assert "tanh" in diff and "gelu" in diff
    assert f"tanh in its traces: {result['tanh'].trace_diff}" in str(result)
    assert json.loads((tmp_path / "compare.json").read_text())["variants"][1]["trace_diff"] == result["tanh"].trace_diff


def _identical_pair(logdir: Path):
    base = mlp()
    return compare({"a": base, "b": copy.deepcopy(base)}, loss_fn, BATCHES, steps=4, warmup=0, logdir=logdir)


def _traces(result, name: str) -> list[Path]:
    return sorted(Path(result[name].trace_dir).glob("*.pt.trace.json"))


def test_a_second_comparison_into_one_logdir_keeps_the_first_and_reads_only_its_own_traces(tmp_path, capsys):
    """Two compare(logdir=) calls in one process: the second overwrote the first's compare.json (its variants went to
    <variant>-2), and its trace diff read both calls' traces (identical variants: 0.350x)."""
    first = _identical_pair(tmp_path / "cmp")
    saved = (tmp_path / "cmp" / "compare.json").read_bytes()
    second = _identical_pair(tmp_path / "cmp")
    assert (tmp_path / "cmp" / "compare.json").read_bytes() == saved
    assert f"this one writes to {tmp_path / 'cmp-2'}" in capsys.readouterr().out
    assert second.settings["logdir"] == str(tmp_path / "cmp-2")
    assert json.loads((tmp_path / "cmp-2" / "compare.json").read_text()) == json.loads(json.dumps(second.to_dict()))
    for name in ("a", "b"):
        assert first[name].trace_dir == str(tmp_path / "cmp" / name)
        assert second[name].trace_dir == str(tmp_path / "cmp-2" / name)
        assert len(_traces(first, name)) == len(_traces(second, name)) == 1
    assert sorted(p.name for p in (tmp_path / "cmp").iterdir() if not p.name.startswith(".")) == [
        "a",
        "b",
        "compare.json",
    ]


def test_kprof_0_times_the_variants_and_keeps_the_result(tmp_path, monkeypatch):
    """KPROF=0 and a logdir not yet made: the timing ran, then FileNotFoundError on compare.json.partial lost it."""
    monkeypatch.setenv("KPROF", "0")
    result = _identical_pair(tmp_path / "new")
    assert json.loads((tmp_path / "new" / "compare.json").read_text()) == json.loads(json.dumps(result.to_dict()))
    assert [result[name].trace_dir for name in ("a", "b")] == [None, None] and result["b"].trace_diff is None
    assert not list(tmp_path.rglob("*.pt.trace.json"))


@pytest.mark.parametrize("env", [{"KPROF_TRIGGER": "on_demand"}, {"KPROF_REPEAT": "0"}])
def test_schedule_variables_of_the_environment_do_not_reach_comparisons(tmp_path, monkeypatch, env):
    """KPROF_TRIGGER / KPROF_REPEAT ... set for a training script: compare's own schedule still profiles each variant
    (they gave 0 traces and "no trace diff", with no warning)."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    result = _identical_pair(tmp_path)
    assert len(_traces(result, "a")) == len(_traces(result, "b")) == 1
    assert result["b"].trace_diff and not result["b"].trace_diff.startswith("no trace diff")


# -- result object ---------------------------------------------------------------------------------------------------
def test_comparison_table_pandas_and_dict():
    pytest.importorskip("pandas")
    base = mlp()
    result = compare({"a": base, "b": copy.deepcopy(base)}, loss_fn, BATCHES, steps=5, warmup=0)
    lines = str(result).splitlines()
    header = lines[1].split()
    assert header[:4] == ["variant", "median", "ms", "p10"] and "verdict" in header
    assert lines[3].startswith("a ") and "baseline" in lines[3] and "reference" in lines[3]
    assert lines[4].startswith("b ") and "[" in lines[4]
    assert "torch " + torch.__version__ in lines[-1]
    df = result.to_pandas()
    assert list(df.index) == ["a", "b"] and df.loc["b", "median_ms"] == result["b"].timing.median_ms
    d = result.to_dict()
    assert d["device"].startswith("cpu") and d["versions"]["torch"] == torch.__version__
    assert d["settings"]["steps"] == 5 and d["variants"][1]["ci_low"] <= d["variants"][1]["ci_high"]


# -- CLI -------------------------------------------------------------------------------------------------------------
def test_cli_compares_the_builtin_model_with_its_swapped_copy(capsys):
    code = main(
        [
            "compare",
            "--steps",
            "3",
            "--warmup",
            "0",
            "--device",
            "cpu",
            "--width",
            "32",
            "--depth",
            "1",
            "--batch-size",
            "8",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith(("torch ", "kprof.swap "))}
    assert "baseline" in rows["torch"] and "reference" in rows["torch"]
    assert "e-" in rows["kprof.swap"].split()[-1]  # the check's max relative error, in tolerance (no FAIL)


def test_cli_runs_a_user_setup_and_profiles_both_variants(tmp_path, monkeypatch, capsys):
    (tmp_path / "my_setup.py").write_text(
        textwrap.dedent("""
        import torch
        from torch import nn

        def setup(device):
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 2)).to(device)
            batches = [torch.randn(4, 8, device=device) for _ in range(2)]
            return model, lambda m, x: m(x).square().mean(), batches
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    logdir = tmp_path / "log"
    code = main(
        [
            "compare",
            "--model",
            "my_setup:setup",
            "--steps",
            "3",
            "--warmup",
            "0",
            "--device",
            "cpu",
            "--logdir",
            str(logdir),
        ]
    )
    assert code == 0, capsys.readouterr().out
    assert list((logdir / "torch").glob("*.pt.trace.json")) and list((logdir / "kprof.swap").glob("*.pt.trace.json"))
    assert [v["name"] for v in json.loads((logdir / "compare.json").read_text())["variants"]] == ["torch", "kprof.swap"]


def test_cli_rejects_a_model_spec_without_attribute(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["compare", "--model", "my_setup", "--device", "cpu"])
    assert exc.value.code == 2 and "MODULE:ATTR" in capsys.readouterr().err


# -- examples --------------------------------------------------------------------------------------------------------
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _run_example(name: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args, "--device", "cpu"], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.serial
def test_square_example_reads_pow_and_mul_from_the_profiler():
    out = _run_example("square_compare.py", "--size", "64", "--iters", "2", "--warmup", "1")
    assert "aten::pow: torch.square(a), a ** 2" in out
    assert "aten::mul: a * a" in out
    assert "torch.square(a) runs aten::square -> aten::pow, a * a runs aten::mul" in out


def test_compare_layers_example_swaps_and_compares():
    out = _run_example(
        "compare_layers.py",
        "--width",
        "16",
        "--depth",
        "1",
        "--seq",
        "4",
        "--batch",
        "2",
        "--vocab",
        "50",
        "--steps",
        "3",
    )
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith(("torch ", "kernels "))}
    assert "reference" in rows["torch"] and "e-" in rows["kernels"].split()[-1]  # checked, in tolerance


# -- bad input -------------------------------------------------------------------------------------------------------
def _never_called(model, batch):
    raise AssertionError("no step may run when the arguments are bad")


@pytest.mark.parametrize(
    "variants, kwargs, error, match",
    [
        ([mlp()], {}, TypeError, "variants must be a dict"),
        ({}, {}, ValueError, "variants is empty"),
        ({"a": 3}, {}, TypeError, r"variants\['a'\]"),
        ({"a": lambda: 3}, {}, TypeError, r"variants\['a'\]\(\) must return an nn.Module"),
        ({"a/b": mlp()}, {}, ValueError, "plain folder name"),
        ({'say "hi"': mlp()}, {}, ValueError, "cannot be written into a trace"),
        ({"tab\there": mlp()}, {}, ValueError, "cannot be written into a trace"),
        ({"surrogate\udc80": mlp()}, {}, ValueError, "cannot be written into a trace"),
        ({"a": mlp()}, {"steps": 2}, ValueError, "steps must be an int >= 3"),
        ({"a": mlp()}, {"steps": True}, ValueError, "steps"),
        ({"a": mlp()}, {"warmup": -1}, ValueError, "warmup"),
        ({"a": mlp()}, {"block": 0}, ValueError, "block"),
        ({"a": mlp()}, {"check": "yes"}, ValueError, "check must be"),
        ({"a": mlp()}, {"tol": 0}, ValueError, "tol"),
        ({"a": mlp()}, {"confidence": 1.0}, ValueError, "confidence"),
        ({"a": mlp()}, {"noise_threshold": -0.1}, ValueError, "noise_threshold"),
        ({"a": mlp()}, {"batches": []}, ValueError, "batches is empty"),
        ({"a": mlp()}, {"batches": iter([])}, ValueError, "batches is empty"),
        ({"a": mlp()}, {"batches": torch.randn(4, 16, 32)}, TypeError, "batches must be an iterable"),
        ({"a": mlp()}, {"step_fn": "loss"}, TypeError, "step_fn must be callable"),
        ({"a": mlp()}, {"optimizer": lambda p: None}, TypeError, "torch.optim.Optimizer"),
        ({"a": mlp()}, {"profile": {"active": 2}}, ValueError, "need a logdir"),
        ({"a": mlp()}, {"compile": True, "warmup": 0}, ValueError, "warmup >= 1"),
        ({"a": mlp()}, {"compile": "yes"}, TypeError, "compile must be True or False"),
        ({"a": nn.Linear(32, 4), "b": nn.Linear(32, 5)}, {}, ValueError, r"'weight' has shape \(4, 32\) in 'a'"),
        ({"a": nn.Linear(32, 4), "b": nn.Sequential(nn.Linear(32, 4))}, {}, ValueError, "'weight' is in 'a' but"),
        ({"a": nn.Linear(32, 4), "b": nn.Linear(32, 4, device="meta")}, {}, ValueError, "one device"),
    ],
)
def test_bad_input_is_rejected_before_any_step(variants, kwargs, error, match):
    kwargs = {"step_fn": _never_called, "batches": BATCHES, **kwargs}
    with pytest.raises(error, match=match):
        compare(variants, **kwargs)


@pytest.mark.parametrize(
    "kwargs", [{"confidence": 1.0}, {"confidence": "0.9"}, {"noise_threshold": -0.1}, {"noise_threshold": True}]
)
def test_compare_and_diff_reject_a_bad_confidence_or_noise_threshold_in_the_same_words(kwargs):
    """One check for both front doors: the same ValueError, said before any run is read or any step runs."""
    from kprof_callbacks.analysis import diff

    with pytest.raises(ValueError) as in_diff:
        diff("no-such-run-a", "no-such-run-b", **kwargs)
    with pytest.raises(ValueError) as in_compare:
        compare({"a": mlp()}, _never_called, BATCHES, **kwargs)
    assert str(in_diff.value) == str(in_compare.value)
    assert str(in_diff.value).startswith(f"{next(iter(kwargs))} must be a number")


def test_profile_options_cannot_redirect_the_run_folders(tmp_path):
    with pytest.raises(ValueError, match="must not set"):
        compare({"a": mlp()}, _never_called, BATCHES, logdir=tmp_path, profile={"run": "x"})
    with pytest.raises(ValueError, match="finite schedule"):
        compare({"a": mlp()}, _never_called, BATCHES, logdir=tmp_path, profile={"repeat": 0})


@pytest.mark.parametrize(
    "step_fn, error, match",
    [
        (lambda m, x: loss_fn(m, x).item(), TypeError, "torch.Tensor, got float"),
        (lambda m, x: m(x).pow(2), ValueError, r"scalar loss, got a tensor of shape \(16, 4\)"),
        (lambda m, x: loss_fn(m, x).detach(), ValueError, "does not require grad"),
    ],
)
def test_step_fn_must_return_a_scalar_loss(step_fn, error, match):
    with pytest.raises(error, match=match):
        compare({"a": mlp()}, step_fn, BATCHES, steps=3)


# -- statistics -----------------------------------------------------------------------------------------------------
def test_speedup_interval_covers_the_true_ratio_and_is_seeded():
    rng = np.random.default_rng(1)
    base = rng.lognormal(np.log(10.0), 0.1, (20, 10))  # 20 rounds of 10 steps
    half = rng.lognormal(np.log(5.0), 0.1, (20, 10))
    speedup, low, high = stats.speedup_interval(base, half, seed=3)
    assert 1.5 < low < 2.0 < high < 2.5
    assert (speedup, low, high) == stats.speedup_interval(base, half, seed=3)
    same, low, high = stats.speedup_interval(base, base)
    assert same == 1.0 and low <= 1.0 <= high


def test_drift_shared_by_a_round_cancels():
    rng = np.random.default_rng(2)
    drift = rng.uniform(1.0, 3.0, (10, 1))  # each round runs at its own speed, for both variants alike
    base = drift * rng.lognormal(0.0, 0.01, (10, 5))
    other = drift * rng.lognormal(np.log(0.8), 0.01, (10, 5))
    speedup, low, high = stats.speedup_interval(base, other)
    assert 1.2 < low < 1.25 < high < 1.3


@pytest.mark.parametrize(
    "speedup, low, high, expected",
    [
        (1.5, 1.2, 1.8, stats.FASTER),
        (0.5, 0.4, 0.6, stats.SLOWER),
        (1.5, 0.9, 2.0, stats.SAME),  # the interval includes 1.0
        (1.01, 1.005, 1.02, stats.SAME),  # clear, but under the 2% noise threshold
        (0.99, 0.98, 0.995, stats.SAME),
    ],
)
def test_verdict(speedup, low, high, expected):
    assert stats.verdict(speedup, low, high) == expected


def test_speedup_interval_rejects_empty_rounds():
    with pytest.raises(ValueError, match="same number"):
        stats.speedup_interval([], [])
    with pytest.raises(ValueError, match="at least one step time"):
        stats.speedup_interval([[1.0], []], [[1.0], [2.0]])


# -- GPU -------------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_cuda_timing_and_peak_memory():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    base = mlp().cuda()
    batches = [b.cuda() for b in BATCHES]
    result = compare({"a": base, "b": copy.deepcopy(base)}, loss_fn, batches, steps=10, warmup=2)
    assert torch.cuda.get_device_name() in result.device
    for v in result.variants.values():
        assert v.peak_mem_mb > 0 and all(t > 0 and math.isfinite(t) for t in v.timing.times_ms)


# -- the check under bf16 autocast ---------------------------------------------------------------------------------
class Block(nn.Module):
    """Pre-norm MLP block; ``mistake`` plants one of the errors the check must catch in bf16."""

    def __init__(self, mistake: str = "", rewrite: bool = False) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(64, eps=1e-1 if mistake == "eps" else 1e-5)
        self.up, self.down = nn.Linear(64, 256), nn.Linear(256, 64)
        self.mistake, self.rewrite = mistake, rewrite
        with torch.no_grad():
            self.norm.weight.normal_(1.0, 0.2)
            self.norm.bias.normal_(0.0, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.rewrite or self.mistake == "no bias":  # LayerNorm written out by hand, as a custom kernel would
            mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
            h = (x - mean) * torch.rsqrt(var + self.norm.eps) * self.norm.weight
            h = h if self.mistake == "no bias" else h + self.norm.bias
        else:
            h = self.norm(x)
        h = self.up(h)
        h = (
            torch.relu(h)
            if self.mistake == "relu"
            else 0.5 * h * (1 + torch.erf(h / 2**0.5))
            if self.rewrite
            else nn.functional.gelu(h)
        )
        return x + self.down(h)


def _bf16_step(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return model(x).float().pow(2).mean()


BF16_BATCHES = [torch.randn(32, 64, generator=torch.Generator().manual_seed(i)) for i in range(2)]


def test_under_bf16_autocast_a_correct_rewrite_passes_without_a_tolerance():
    """bf16 matmuls put torch itself ~1e-2 from float64: a dtype tolerance rejected every such model (1.2e-3 on CPU)."""
    torch.manual_seed(0)
    result = compare({"torch": Block(), "rewrite": Block(rewrite=True)}, _bf16_step, BF16_BATCHES, steps=3, warmup=0)
    rewrite = result["rewrite"]
    assert rewrite.check_ok and rewrite.check_basis == "float64" and rewrite.check_ref_err > 1e-4
    assert f"vs torch's own {rewrite.check_ref_err:.1e} against float64" in rewrite.check_detail
    assert rewrite.check_detail.endswith(": ok")


@pytest.mark.parametrize("mistake", ["relu", "eps", "no bias"])
def test_under_bf16_autocast_real_mistakes_still_fail(mistake):
    torch.manual_seed(0)
    with pytest.raises(ComparisonError, match="FAILED"):
        compare({"torch": Block(), mistake: Block(mistake)}, _bf16_step, BF16_BATCHES, steps=3, warmup=0)


def test_compiled_variants_are_checked_and_their_compilation_is_reported_not_timed():
    pytest.importorskip("torch._dynamo")
    torch.manual_seed(0)
    result = compare({"eager": Block(), "also": Block()}, _bf16_step, BF16_BATCHES, steps=3, warmup=1, compile=True)
    assert result["also"].check_ok and result.settings["compile"]
    first = result["eager"]  # compiled in its first step ("also" may reuse that code: same class, same graph)
    # Dynamo traced it (inductor's cache on disk may have spared the compilation itself): far slower than a timed step
    assert first.first_step_s > 10 * max(first.timing.times_ms) / 1e3
    assert result["also"].first_step_s is not None
    assert "torch.compile: the first step of each variant compiles and is not timed" in str(result)


def test_a_noisy_measurement_gets_no_confident_verdict():
    """One variant's steps swing between 1 and 20 ms: whatever the medians say, the verdict is "noisy"."""
    base = mlp()
    calls = iter(range(10_000))
    swing = Sleepy(copy.deepcopy(base), lambda: 0.02 if next(calls) % 3 == 0 else 0.001)
    result = compare({"steady": Sleepy(base, 0.002), "swing": swing}, loss_fn, BATCHES, steps=15, warmup=1)
    assert result["swing"].verdict == stats.NOISY
    assert "p90/median" in result["swing"].note and "steps=60" in result["swing"].note


def test_timed_and_trace_speedups_are_labelled_and_reconciled(tmp_path):
    """`kprof compare` on a CPU printed 0.735x (timed) and then 1.219x (from the traces) with no word on which to
    believe: the trace line says what it measured and, when the two disagree, which one to go by and why."""
    from test_diff import write_trace

    from kprof_callbacks.analysis import diff
    from kprof_callbacks.compare.result import VariantResult, trace_summary

    a = write_trace(tmp_path / "a.pt.trace.json", [{"aten::mm": 1200.0 + 10 * i} for i in range(5)])
    b = write_trace(tmp_path / "b.pt.trace.json", [{"aten::mm": 1000.0 + 10 * i} for i in range(5)])
    d = diff(a, b)
    assert d.step_time.verdict == stats.FASTER
    slower = VariantResult("b", speedup=0.735, verdict=stats.SLOWER)
    text = trace_summary(slower, d, steps=50)
    assert text.startswith("5 against 5 profiled steps, with the profiler on. Step time:")
    assert "The timed speedup (0.735x: slower) is the one to go by: it times 50 steps of each variant" in text
    agreeing = trace_summary(VariantResult("b", speedup=1.2, verdict=stats.FASTER), d, steps=50)
    assert agreeing == f"5 against 5 profiled steps, with the profiler on. {d.headline()}"
    result = compare({"a": mlp(), "b": mlp()}, loss_fn, BATCHES, steps=4, warmup=0, check=False)
    assert "timed speedup [95% CI]" in str(result) and "over the timed steps (no profiler)" in str(result)
