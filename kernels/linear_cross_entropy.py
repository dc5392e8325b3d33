"""``kernels.linear_cross_entropy``: the cross-entropy of ``hidden @ weight.T (+ bias)`` against class targets without
the [tokens, vocab] logits ever in memory, on the operators ``torch.ops.kprof.linear_cross_entropy`` (``_fwd``,
``_backward``); ``LinearCrossEntropy``, the output layer with it as its loss.

The tokens go in chunks whose logits take at most 256 MiB (a multiple of 128 rows, at least 128): each chunk's logits
come from one matrix product in the input dtype (float32 accumulation), one kernel turns them into the rows' losses
and, in place, into d loss / d logits, and two more products give the chunk's share of d hidden and d weight. With
reduction "mean" or "sum" and a gradient to compute, that all happens in the forward (three products in all, as
torch's own, none repeated) and the backward scales the saved gradients; with "none", or without gradients, the
forward computes the losses only and the backward recomputes the chunks. Memory beyond the inputs: one chunk of
logits plus the gradients themselves. Dtypes: float32/float16/bfloat16 on CUDA and also float64 on the CPU (hidden,
weight and bias of one dtype); the loss is float32 (float64 for float64 inputs). Under autocast the products run in
the autocast dtype, as ``F.linear``'s do.
"""

from __future__ import annotations

import numbers

import torch
import torch.nn.functional as F
from torch import nn

from . import _build
from ._layer import KernelLayer, Kernels, check_choice, check_supported
from ._library import OpLibrary

LIBRARY = OpLibrary(
    "linear_cross_entropy",
    lambda: _build.load("linear_cross_entropy", ["linear_cross_entropy.cpp", "linear_cross_entropy.cu"]),
    ops=("linear_cross_entropy", "linear_cross_entropy_fwd", "linear_cross_entropy_backward"),
)
KERNELS = Kernels(LIBRARY)
REDUCTIONS = ("mean", "sum", "none")


def _loss_dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _empty_unless(wanted: bool, like: torch.Tensor, shape: tuple) -> torch.Tensor:
    return like.new_empty(shape if wanted else (0,))


@LIBRARY.fake("linear_cross_entropy_fwd")
def _fwd_fake(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None,
    ignore_index: int,
    reduction: str,
    label_smoothing: float,
    softcap: float | None,
    output_mask: list[bool],
    chunk: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    loss = hidden.new_empty(target.shape if reduction == "none" else (), dtype=_loss_dtype(hidden))
    return (loss, *_grads_fake(hidden, weight, bias, output_mask))


@LIBRARY.fake("linear_cross_entropy_backward")
def _backward_fake(
    grad: torch.Tensor,
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None,
    *options: object,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``options``: the forward's ignore_index, reduction, label_smoothing, softcap, output_mask and chunk."""
    return _grads_fake(hidden, weight, bias, options[4])


def _grads_fake(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, mask: object
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (
        _empty_unless(mask[0], hidden, hidden.shape),
        _empty_unless(mask[1], weight, weight.shape),
        _empty_unless(mask[2] and bias is not None, weight, (weight.shape[0],)),
    )


def reference(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    softcap: float | None = None,
) -> torch.Tensor:
    """What the kernels compute, in torch ops: the logits in the input dtype, then the loss in float32 (float64 for
    float64 inputs), as nanoGPT computes it under autocast. It holds [tokens, vocab] logits in memory."""
    logits = F.linear(hidden, weight, bias)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        target.reshape(-1),
        ignore_index=ignore_index,
        reduction=reduction,
        label_smoothing=label_smoothing,
    ).view(target.shape if reduction == "none" else ())


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    softcap: float | None = None,
    *,
    impl: str | None = None,
) -> torch.Tensor:
    """``F.cross_entropy(F.linear(hidden, weight, bias).float(), target, ...)`` (with Gemma 2's
    ``softcap * tanh(logits / softcap)`` first when ``softcap`` is given) for hidden [..., H], weight [vocab, H],
    target [...] (int64), never holding the [tokens, vocab] logits. ``impl``: None (by device), "cuda", "cpp" or
    "torch" (``reference``). Unlike the other layers, an automatic impl keeps the kernel under torch.compile: inductor
    cannot compute this loss without the logits, so its own is slower and holds them (docs/kernels.md)."""
    if impl == "torch":
        return reference(hidden, weight, target, bias, ignore_index, reduction, label_smoothing, softcap)
    library = KERNELS.pick(impl, hidden, "kprof linear_cross_entropy")
    cap = None if softcap is None else float(softcap)
    return library.linear_cross_entropy(
        hidden, weight, target, bias, ignore_index, reduction, float(label_smoothing), cap
    )


class LinearCrossEntropy(KernelLayer):
    """An output layer with its loss fused: ``layer(hidden, target)`` is ``linear_cross_entropy`` of hidden with the
    layer's weight (and bias), ``layer(hidden)`` the logits (``F.linear``, then the softcap if any), so a model calls
    it where it called its lm_head. Parameters and state_dict keys are ``nn.Linear``'s (``weight``, ``bias``)."""

    kernels = KERNELS

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        *,
        ignore_index: int = -100,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
        softcap: float | None = None,
        impl: str | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(impl)
        linear = nn.Linear(in_features, out_features, bias, device=device, dtype=dtype)
        self._adopt(linear, ignore_index, reduction, label_smoothing, softcap)
        self.build()

    def _adopt(
        self, linear: nn.Linear, ignore_index: int, reduction: str, label_smoothing: float, softcap: float | None
    ) -> None:
        name = type(self).__name__
        if not isinstance(ignore_index, numbers.Integral):
            raise TypeError(f"{name}: ignore_index must be an int, got {ignore_index!r}")
        if not (isinstance(label_smoothing, numbers.Real) and 0.0 <= label_smoothing <= 1.0):
            raise ValueError(f"{name}: label_smoothing must be in [0, 1], got {label_smoothing!r}")
        if softcap is not None and not (isinstance(softcap, numbers.Real) and softcap > 0):
            raise ValueError(f"{name}: softcap must be a number > 0 or None, got {softcap!r}")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        if linear.bias is None:
            self.register_parameter("bias", None)
        else:
            self.bias = linear.bias
        self.ignore_index = int(ignore_index)
        self.reduction = check_choice("reduction", reduction, REDUCTIONS)
        self.label_smoothing = float(label_smoothing)
        self.softcap = None if softcap is None else float(softcap)

    @classmethod
    def from_module(cls, module: nn.Linear, *, impl: str | None = None, **loss: object) -> LinearCrossEntropy:
        """A LinearCrossEntropy sharing ``module``'s weight and bias (not copies: a weight tied to an embedding stays
        tied). ``module`` is an ``nn.Linear`` or a subclass whose forward takes ``(hidden, targets=None)`` (as
        ``models.LMHead``); its ``ignore_index``, ``reduction``, ``label_smoothing`` and ``softcap`` attributes, where
        it has them, are the loss's, unless ``loss`` names them."""
        name = f"{cls.__name__}.from_module"
        if not isinstance(module, nn.Linear):
            raise TypeError(
                f"{name}: expected torch.nn.Linear (or a loss head built on it), got {type(module).__name__}"
            )
        if impl != "torch":
            check_supported(module.weight, "weight", name, impl)
        keys = ("ignore_index", "reduction", "label_smoothing", "softcap")
        unknown = sorted(set(loss) - set(keys))
        if unknown:
            raise TypeError(f"{name}: unknown loss option(s) {unknown}; known: {keys}")
        defaults = {"ignore_index": -100, "reduction": "mean", "label_smoothing": 0.0, "softcap": None}
        options = {key: loss.get(key, getattr(module, key, defaults[key])) for key in keys}
        new = cls.__new__(cls)
        KernelLayer.__init__(new, impl)
        new._adopt(module, **options)
        new.train(module.training)
        return new

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        if targets is None:
            logits = F.linear(hidden, self.weight, self.bias)
            return logits if self.softcap is None else self.softcap * torch.tanh(logits / self.softcap)
        return linear_cross_entropy(
            hidden,
            self.weight,
            targets,
            self.bias,
            self.ignore_index,
            self.reduction,
            self.label_smoothing,
            self.softcap,
            impl=self.impl,
        )

    def extra_repr(self) -> str:
        options = f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
        if self.ignore_index != -100:
            options += f", ignore_index={self.ignore_index}"
        if self.reduction != "mean":
            options += f", reduction={self.reduction!r}"
        if self.label_smoothing:
            options += f", label_smoothing={self.label_smoothing}"
        if self.softcap is not None:
            options += f", softcap={self.softcap}"
        return f"{options}, {self.impl_repr()}"
