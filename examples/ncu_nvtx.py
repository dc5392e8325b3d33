"""Nsight Compute on one custom kernel, found through kprof's NVTX ranges.

With ``nvtx=True`` every step is an NVTX range ``step N`` and every ``s.region(name)`` an NVTX range too, so
Nsight tools see the same structure as the torch.profiler trace. Profile only kprof's GELU kernel, in step 5:

    ncu --nvtx --nvtx-include "step 5/" --kernel-name-base demangled --kernel-name regex:GeluForward \\
        --launch-count 1 --section SpeedOfLight python examples/ncu_nvtx.py

(``"step 5/"``: kernels launched inside the push/pop range named ``step 5``. kprof's elementwise kernels share
one template, ``map_kernel<Op>``, so the filter matches the demangled name's functor.) Without ncu it just trains.
"""

import torch
from torch import nn

import kprof_callbacks as kprof
from kprof_callbacks import kernels


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("this example needs a CUDA device (ncu profiles GPU kernels)")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 4096), kernels.GELU(), nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(4096, 1024, device="cuda")
    with kprof.session("log", run="ncu-nvtx", nvtx=True, wait=2, warmup=1, active=2) as s:
        for _ in range(8):
            loss = model(x).square().mean()  # no s.region() here: "step 5/" then matches the innermost range
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            s.step()
    print(f"trained 8 steps; median step {sorted(s.step_times)[4] * 1e3:.2f} ms; traces in {s.run_dir}")


if __name__ == "__main__":
    main()
