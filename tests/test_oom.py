"""Out-of-memory reports: an OutOfMemoryError that ends a profiled session (the with body, Session.stop, a Lightning
fit) leaves a one-screen report of what held memory and what was allocating, and reaches the caller unchanged. On
the CPU the error is raised by hand and the CUDA allocator's answers are stood in for; on a GPU (marked gpu) the
batch grows until the allocator really fails."""

from __future__ import annotations

import contextlib
import logging
import traceback

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger

import kprof_callbacks as kprof
from kprof_callbacks import memory_watch, models, torch_compat
from kprof_callbacks.analysis import fmt

GB = 2**30
RAISED: list[BaseException] = []


def _fail_in(module: torch.nn.Module, at_call: int) -> None:
    """Make ``module``'s forward raise the allocator's error on its ``at_call``-th call."""
    forward, calls = module.forward, [0]

    def failing(*args, **kwargs):
        calls[0] += 1
        if calls[0] == at_call:
            RAISED.append(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has ..."))
            raise RAISED[-1]
        return forward(*args, **kwargs)

    module.forward = failing


def _model() -> tuple[models.GPT, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = models.GPT(models.tiny())
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def _loop(ctx, model, opt, steps: int = 6) -> BaseException:
    """Train under ``ctx`` (a session, or nothing) until the error; the error as the caller sees it."""
    batches = models.random_batches(models.tiny(), n=steps, batch=2)
    try:
        with ctx as s:
            for idx, targets in batches:
                model(idx, targets).backward()
                opt.step()
                opt.zero_grad()
                if s is not None:
                    s.step()
    except torch.OutOfMemoryError as exc:
        return exc
    raise AssertionError("no out-of-memory error")


@pytest.fixture
def cuda_allocator(monkeypatch):
    """The allocator's answers, as on a GPU: the optimizers' tensors (found by address) and a 3 GB block made by
    the model's forward (its frames recorded), the numbers at the failed allocation and now."""

    def snapshot():
        model, opt = _model_now or (torch.nn.Module(), torch.optim.SGD([torch.zeros(1)]))
        watch_tensors = [*model.parameters(), *(v for s in opt.state.values() for v in s.values())]
        blocks = [
            {
                "device": 0,
                "address": t.untyped_storage().data_ptr(),
                "total_size": t.untyped_storage().nbytes(),
                "blocks": [{"size": t.untyped_storage().nbytes(), "state": "active_allocated", "frames": []}],
            }
            for t in watch_tensors
        ]
        frames = [
            {"filename": "/venv/site-packages/torch/nn/functional.py", "line": 1, "name": "linear"},
            {"filename": "/home/me/gpt.py", "line": 88, "name": "forward"},
        ]
        blocks.append(
            {
                "device": 0,
                "address": 1 << 40,
                "total_size": 4 * GB,
                "blocks": [
                    {"size": 3 * GB, "state": "active_allocated", "frames": frames},
                    {"size": GB, "state": "inactive", "frames": []},
                ],
            }
        )
        return {"segments": blocks, "device_traces": [[]]}

    _model_now: list = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the tensors are the CPU's: watched there
    monkeypatch.setattr(torch_compat, "allocator_snapshot", snapshot)
    monkeypatch.setattr(
        torch_compat,
        "device_memory",
        lambda device: {"allocated": 70 * GB, "reserved": 75 * GB, "free": GB // 2, "total": 80 * GB},
    )
    memory_watch._observe(0, 2 * GB, 70 * GB, GB // 2)
    yield _model_now
    memory_watch._LAST_OOM.clear()


def test_an_oom_in_forward_is_reported_and_reaches_the_caller_unchanged(tmp_path, cuda_allocator, capsys):
    plain_model, plain_opt = _model()
    _fail_in(plain_model.blocks[1].attn, at_call=3)
    plain = _loop(contextlib.nullcontext(), plain_model, plain_opt)
    model, opt = _model()
    cuda_allocator[:] = [model, opt]
    _fail_in(model.blocks[1].attn, at_call=3)
    exc = _loop(kprof.session(tmp_path, run="r", wait=0, warmup=0, active=10, scalars=False), model, opt)
    assert exc is RAISED[-1] and type(exc) is torch.OutOfMemoryError
    assert str(exc) == str(plain) and exc.__cause__ is None and exc.__context__ is None
    assert not hasattr(exc, "__notes__")
    frames = lambda e: [(f.name, f.line) for f in traceback.extract_tb(e.__traceback__)]  # noqa: E731
    assert frames(exc) == frames(plain)
    (report,) = (tmp_path / "r").glob("*.oom.txt")
    text = report.read_text()
    assert text.startswith("kprof: CUDA out of memory at step 2, in forward of blocks.1.attn (CausalSelfAttention)")
    assert "CUDA out of memory. Tried to allocate 2.00 GiB" in text
    assert "At the failed allocation: 2.0 GB asked for, 70.0 GB allocated, 512.0 MB free on the device." in text
    assert "Now: 70.0 GB allocated, 75.0 GB reserved (5.0 GB reserved but unallocated)" in text
    assert "activations and temporaries" in text and "gpt.py:88 in forward" in text
    params = sum(p.untyped_storage().nbytes() for p in model.parameters())
    assert "parameters" in text and "optimizer state" in text and f"{params}" not in text
    lines = text.splitlines()
    assert len(lines) <= 30  # one screen
    assert f"kprof: out-of-memory report: {report}" in capsys.readouterr().err
    assert list((tmp_path / "r").glob("*.pt.trace.json")), "the window the error cut short is saved"


def test_the_report_names_the_optimizers_tensors_by_address(tmp_path, cuda_allocator):
    model, opt = _model()
    cuda_allocator[:] = [model, opt]
    _fail_in(model.blocks[0].mlp, at_call=4)
    _loop(kprof.session(tmp_path, run="r", scalars=False), model, opt)
    text = next((tmp_path / "r").glob("*.oom.txt")).read_text()
    by_kind = {line.split()[0]: line for line in text.splitlines() if line.startswith("  ") and "%" in line}
    params = sum(p.untyped_storage().nbytes() for p in model.parameters())
    assert " ".join(by_kind["parameters"].split()[1:3]) == fmt.size(params)
    assert "optimizer" in by_kind and "activations" in by_kind


def test_off_with_oom_report_false(tmp_path, cuda_allocator):
    model, opt = _model()
    _fail_in(model.lm_head, at_call=2)
    exc = _loop(kprof.session(tmp_path, run="r", scalars=False, oom_report=False), model, opt)
    assert exc is RAISED[-1]
    assert not list((tmp_path / "r").glob("*.oom.txt"))


def test_a_report_that_fails_is_a_warning_and_the_error_still_goes_on(tmp_path, monkeypatch, caplog):
    def broken():
        raise RuntimeError("the allocator is gone")

    monkeypatch.setattr(torch_compat, "allocator_snapshot", broken)
    monkeypatch.setattr(
        torch_compat, "device_memory", lambda device: {"allocated": 0, "reserved": 0, "free": 0, "total": 0}
    )
    model, opt = _model()
    _fail_in(model.lm_head, at_call=2)
    with caplog.at_level(logging.WARNING):
        exc = _loop(kprof.session(tmp_path, run="r", scalars=False), model, opt)
    assert exc is RAISED[-1] and exc.__context__ is None
    assert "could not write the out-of-memory report" in caplog.text
    assert not list((tmp_path / "r").glob("*.oom.txt"))


def test_session_stop_with_an_oom_writes_the_report_once(tmp_path, cuda_allocator):
    model, opt = _model()
    cuda_allocator[:] = [model, opt]
    s = kprof.session(tmp_path, run="r", scalars=False).start()
    s.step()
    error = torch.OutOfMemoryError("CUDA out of memory (raised elsewhere)")
    s.stop(error)
    s.stop(error)
    (report,) = (tmp_path / "r").glob("*.oom.txt")
    assert "at step 1, in other" in report.read_text()


class _Failing(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        if batch_idx == 2:
            RAISED.append(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB"))
            raise RAISED[-1]
        return self.net(batch[0]).square().mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_lightning_fit_that_runs_out_of_memory_leaves_the_report(tmp_path, cuda_allocator):
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 8)), batch_size=8)
    trainer = L.Trainer(
        callbacks=[kprof.ProfilerCallback(logdir=tmp_path / "log", run="fit", summary=False)],
        logger=CSVLogger(tmp_path),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        max_epochs=1,
        default_root_dir=tmp_path,
    )
    with pytest.raises(torch.OutOfMemoryError) as caught:
        trainer.fit(_Failing(), data)
    assert caught.value is RAISED[-1]
    (report,) = (tmp_path / "log").rglob("*.oom.txt")
    assert "at step 2, in forward of _Failing" in report.read_text()  # training_step: a method of the module


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_real_oom_on_the_gpu_names_the_step_phase_and_holders(tmp_path):
    """The batch doubles until the caching allocator fails (within a fifth of the GPU, so it fails soon)."""
    torch.cuda.set_per_process_memory_fraction(0.2)
    try:
        cfg = models.GPTConfig(n_layer=4, n_head=4, n_embd=256, vocab_size=8192, block_size=256)
        model = models.GPT(cfg).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
        batch = 8
        with pytest.raises(torch.OutOfMemoryError) as caught:
            with kprof.session(tmp_path, run="r", profile_memory=True, oom_snapshot=True, scalars=False) as s:
                while True:
                    ((idx, targets),) = models.random_batches(cfg, n=1, batch=batch, device="cuda")
                    with torch.autocast("cuda", torch.bfloat16):
                        loss = model(idx, targets)
                    loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    s.step()
                    batch *= 2
        assert "CUDA out of memory" in str(caught.value)
        text = next((tmp_path / "r").glob("*.oom.txt")).read_text()
        assert text.startswith("kprof: CUDA out of memory at step ")
        assert any(f"in {phase}" in text.splitlines()[0] for phase in ("forward", "backward", "optimizer"))
        assert "parameters" in text and "At the failed allocation" in text
        assert "Snapshot:" in text and list((tmp_path / "r").glob("*.oom_snapshot.pickle"))
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()


class _FailingFn(torch.autograd.Function):
    """An autograd Function (its forward runs under torch/autograd/function.py) that fails where it is told."""

    @staticmethod
    def forward(ctx, x, in_forward):
        if in_forward:
            raise torch.OutOfMemoryError("CUDA out of memory (in forward)")
        return 2 * x

    @staticmethod
    def backward(ctx, grad):
        raise torch.OutOfMemoryError("CUDA out of memory (in backward)")


def test_the_phase_comes_from_the_engines_entry_not_from_any_autograd_file():
    from kprof_callbacks.oom import where

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = torch.nn.Linear(2, 2)

        def forward(self, x, in_forward):
            return _FailingFn.apply(self.inner(x), in_forward)

    with pytest.raises(torch.OutOfMemoryError) as caught:
        Net()(torch.ones(2), True)
    assert where(caught.value.__traceback__)[:2] == ("forward", "Net")
    with pytest.raises(torch.OutOfMemoryError) as caught:
        Net()(torch.ones(2), False).sum().backward()
    assert where(caught.value.__traceback__)[0] == "backward"
