"""A stand-in for your training script, as the CI gate runs it: a small MLP trained under kprof.session.

    python examples/ci_gate/train.py --logdir DIR [--extra-ms 20]

It profiles into DIR/train with its own schedule (wait 2, warm-up 2, active 10), which the gate's KPROF_ACTIVE=N
overrides, and runs as many steps as the schedule needs. --extra-ms sleeps that long in every step, inside the label
"extra": a regression for the gate to catch (and name).
"""

import argparse
import time

import torch
from torch import nn

import kprof_callbacks as kprof


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--logdir", required=True, help="where the session writes its run folder")
    parser.add_argument("--extra-ms", type=float, default=0.0, help="host work added to every step, in ms")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    x = torch.randn(32, 64)
    with kprof.session(args.logdir, run="train", wait=2, warmup=2, active=10) as s:
        cfg = s.config
        for _ in range(cfg.skip_first + cfg.wait + cfg.warmup + cfg.active):
            with s.region("forward"):
                loss = model(x).square().mean()
            if args.extra_ms:
                with s.region("extra"):
                    time.sleep(args.extra_ms / 1000)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            s.step()


if __name__ == "__main__":
    main()
