"""What changed between two training runs, and is the change real? kprof.diff.

Trains the tiny GPT-style model of plain_loop.py twice under kprof.session, 12 profiled steps each: run
"diff-fp32" as it is and run "diff-bf16" under torch.autocast(bfloat16). Then diffs them: the step time with
its confidence interval and verdict, which operators, labels and GPU kernels are new, gone or significantly
slower or faster (false discovery rate 5% across all of them), the counts per step (syncs, kernels, copies)
and the findings that appeared or went away.

    python examples/diff_runs.py                         # CPU or the first GPU
    kprof diff log/diff-fp32 log/diff-bf16 --html diff.html
    kprof diff log/diff-fp32@steps=4-9 log/diff-fp32@steps=10-15    # two halves of one run
"""

import torch
from plain_loop import BATCH, TinyLM, batches  # the model and data of examples/plain_loop.py, next to this file
from torch import nn

import kprof_callbacks as kprof
from kprof_callbacks.analysis import diff


def train(run: str, dtype: torch.dtype | None, device: str) -> None:
    """Train a fresh TinyLM, profiling steps 4-15; `dtype` runs forward and loss under autocast."""
    torch.manual_seed(0)
    model = TinyLM().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with kprof.session("log", run=run, wait=2, warmup=2, active=12) as s:
        for x, y in batches(device):
            with s.region("forward"), torch.autocast(device, dtype=dtype or torch.float32, enabled=dtype is not None):
                loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            s.step(samples=BATCH)
    print(f"{run}: {len(s.trace_files)} trace file(s) in {s.run_dir}")


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    train("diff-fp32", None, device)
    train("diff-bf16", torch.bfloat16, device)
    result = diff("log/diff-fp32", "log/diff-bf16")
    print(result.render(top=8))
    print("\nHTML report:", result.to_html("log/diff.html"))


if __name__ == "__main__":
    main()
