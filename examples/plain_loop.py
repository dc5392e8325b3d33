"""Profile a plain PyTorch training loop with kprof.session.

A tiny GPT-style language model (embedding, two transformer blocks, LM head) learns to continue a repeating
sequence of synthetic tokens. The session records steps 5-9 and 15-19 (wait=3, warmup=2, active=5, repeat=2),
labels forward/backward/optimizer, and writes traces TensorBoard reads.

    python examples/plain_loop.py            # CPU or the first GPU
    tensorboard --logdir log                 # PyTorch Profiler tab (and Scalars: step time of every step)
    kprof summary log/plain-loop             # the same traces summarized in the terminal
"""

import torch
from torch import nn

import kprof_callbacks as kprof

VOCAB, CONTEXT, WIDTH, BATCH, STEPS = 64, 32, 128, 32, 40


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.pos = nn.Parameter(torch.zeros(CONTEXT, WIDTH))
        layer = nn.TransformerEncoderLayer(
            WIDTH, nhead=4, dim_feedforward=4 * WIDTH, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.shape[1], device=tokens.device)
        return self.head(self.blocks(self.embed(tokens) + self.pos, mask=mask, is_causal=True))


def batches(device: str):
    """Sequences of a fixed random pattern from random offsets: a next-token task the model can learn."""
    gen = torch.Generator().manual_seed(0)
    pattern = torch.randint(VOCAB, (CONTEXT * 4,), generator=gen)
    for _ in range(STEPS):
        starts = torch.randint(CONTEXT * 3, (BATCH,), generator=gen)
        seq = torch.stack([pattern[s : s + CONTEXT + 1] for s in starts.tolist()])
        yield seq[:, :-1].to(device), seq[:, 1:].to(device)


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = TinyLM().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    flops = 6 * sum(p.numel() for p in model.parameters()) * BATCH * CONTEXT  # forward + backward, per step
    with kprof.session(
        "log", run="plain-loop", model=model, wait=3, warmup=2, active=5, repeat=2, record_shapes=True
    ) as s:
        for step, (x, y) in enumerate(batches(device)):
            with s.region("forward"):
                loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
            with s.region("backward"):
                loss.backward()
            with s.region("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
            s.step(samples=BATCH, flops=flops)  # throughput, and TFLOP/s / MFU in the summary
            if step % 10 == 0:
                print(f"step {step:3d}  loss {loss.item():.3f}")
    print(f"\nmedian step {sorted(s.step_times)[len(s.step_times) // 2] * 1e3:.2f} ms on {device}")
    print("traces:", *s.trace_files, sep="\n  ")
    print(s.summary())
    print("\nopen them: tensorboard --logdir log")


if __name__ == "__main__":
    main()
