"""A nanoGPT-style GPT to try features on a real model: token + position embeddings, pre-LayerNorm blocks of causal
self-attention (``F.scaled_dot_product_attention``) and an MLP (Linear -> nn.GELU -> Linear), a final LayerNorm and
an lm_head tied to the token embedding (``LMHead``, which also computes the loss), initialised as nanoGPT does.

    cfg = models.tiny()                      # 2 layers, 64 wide, vocab 128, 32 tokens: CPU tests
    cfg = models.gpt2_small()                # 12 x 768, vocab 50304, 512 tokens: 124M parameters, benchmarks
    model = models.GPT(cfg)
    loss = model(idx, targets)               # logits = model(idx)
    batches = models.random_batches(cfg, n=8, batch=4, device="cpu")   # [(idx, targets), ...]
    kprof compare --model kprof_callbacks.models:compare_setup   # torch against kprof.swap, bf16 on a GPU

Its LayerNorm and GELU layers, and its loss head, are the ones ``kprof.swap`` replaces. ``extra_work`` and ``rank_ms``
are what the multi-rank examples use to make one rank a straggler (``--straggler 2:20``).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time

import torch
import torch.nn.functional as F
from torch import nn


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    """The model's size: layers, heads, width, vocabulary and context length."""

    n_layer: int
    n_head: int
    n_embd: int
    vocab_size: int
    block_size: int
    dropout: float = 0.0
    bias: bool = True

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "n_embd", "vocab_size", "block_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"GPTConfig.{name} must be a positive int, got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig: n_embd ({self.n_embd}) must be a multiple of n_head ({self.n_head})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout must be in [0, 1), got {self.dropout!r}")


def tiny() -> GPTConfig:
    """2 layers, 2 heads, 64 wide, vocabulary 128, 32 tokens: a step takes milliseconds on a CPU."""
    return GPTConfig(n_layer=2, n_head=2, n_embd=64, vocab_size=128, block_size=32)


def gpt2_small() -> GPTConfig:
    """GPT-2 small as nanoGPT trains it: 12 layers of 12 heads, 768 wide, vocabulary 50304 (50257 padded to a
    multiple of 64), here with 512-token sequences: 124M parameters."""
    return GPTConfig(n_layer=12, n_head=12, n_embd=768, vocab_size=50304, block_size=512)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: one Linear for q, k, v, flash/efficient attention, an output Linear."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.dropout = cfg.dropout
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        q, k, v = (
            t.view(batch, tokens, self.n_head, width // self.n_head).transpose(1, 2)
            for t in self.c_attn(x).split(width, dim=2)
        )
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(batch, tokens, width)))


class MLP(nn.Module):
    """Linear (4x wider) -> GELU -> Linear."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class LMHead(nn.Linear):
    """The output layer and its loss: ``head(x)`` gives the logits (an ``nn.Linear`` without bias, whose weight GPT
    ties to the token embedding); ``head(x, targets)`` the mean cross-entropy of those logits over every token, as
    nanoGPT computes it (under bf16 autocast, on bf16 logits upcast to float32). ``kprof.swap`` replaces it with
    ``kernels.LinearCrossEntropy``, which computes the same loss without holding the logits."""

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        logits = super().forward(x)
        if targets is None:
            return logits
        return F.cross_entropy(logits.flatten(0, -2), targets.flatten())


class GPT(nn.Module):
    """The GPT of ``cfg``: ``model(idx)`` gives logits [batch, tokens, vocab]; ``model(idx, targets)`` the mean
    next-token cross-entropy loss (a scalar), the form ``kprof.compare``'s step functions return."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        if not isinstance(cfg, GPTConfig):
            raise TypeError(f"cfg must be a GPTConfig (models.tiny(), models.gpt2_small()), got {type(cfg).__name__}")
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.lm_head = LMHead(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as in GPT-2
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # GPT-2's scaled init of the residual projections
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        tokens = idx.shape[1]
        if tokens > self.cfg.block_size:
            raise ValueError(f"GPT: {tokens} tokens do not fit the context of {self.cfg.block_size}")
        pos = torch.arange(tokens, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x), targets)


def random_batches(
    cfg: GPTConfig, n: int, batch: int, device: torch.device | str = "cpu", seed: int = 0
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n`` batches of (idx, targets), each [batch, block_size] random tokens with targets shifted by one, drawn
    from a generator seeded with ``seed`` (the same batches every call)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        tokens = torch.randint(cfg.vocab_size, (batch, cfg.block_size + 1), generator=gen).to(device)
        out.append((tokens[:, :-1], tokens[:, 1:]))
    return out


def rank_ms(text: str) -> tuple[int, float]:
    """``R:MS`` (a rank and milliseconds, 20 when left out) from a command line, as the examples' ``--straggler`` and
    ``--slow-data`` take them."""
    rank, _, ms = text.partition(":")
    try:
        return int(rank), float(ms or 20)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected RANK:MILLISECONDS, got {text!r}") from None


def extra_work(device: torch.device, ms: float) -> None:
    """A straggler's extra computation: matrix products for about ``ms`` milliseconds (on a GPU, queued without the
    host waiting: an fp32 4096^3 product takes ~3 ms on an H100)."""
    x = torch.ones(4096 if device.type == "cuda" else 512, device=device).diag()
    if device.type == "cuda":
        for _ in range(max(round(ms / 3), 1)):
            x = x @ x
        return
    deadline = time.perf_counter() + ms / 1000.0
    while time.perf_counter() < deadline:
        x = x @ x


def compare_setup(device: str) -> tuple[GPT, object, list[tuple[torch.Tensor, torch.Tensor]]]:
    """``(model, step_fn, batches)`` for ``kprof compare --model kprof_callbacks.models:compare_setup``: GPT-2 small,
    batch 8 x 512, bf16 autocast on a GPU; the tiny GPT in float32 on a CPU."""
    cuda = str(device).startswith("cuda")
    cfg, batch = (gpt2_small(), 8) if cuda else (tiny(), 4)
    torch.manual_seed(0)
    model = GPT(cfg).to(device)

    def step_fn(m: nn.Module, data: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
            return m(*data)

    return model, step_fn, random_batches(cfg, 4, batch, device)
