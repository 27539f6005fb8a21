"""Linear layers whose weights are laid out ahead of time for oneDNN's matrix products, on the CPU.

A decoding step multiplies a few rows of activations by every weight of the model, and on a CPU its
time follows how fast the weights stream through: ``nn.functional.linear`` on a plain (out, in)
weight reads SmolLM2-135M's 270 MB of bfloat16 weights at about 10 GB/s in a step of 8 rows, where
the same machine streams memory at 23-26 GB/s. oneDNN can lay a weight out in its own blocked
format once (``torch.ops.mkldnn._reorder_linear_weight``, as PyTorch's compiler does for frozen
models) and multiply by it from then on (``torch.ops.mkldnn._linear_pointwise``): the model's
linear layers in a step of 8 rows take 18 ms instead of 27, 16 rows 23 instead of 35, and a step of
8 rows 49 ms instead of 56-63 (``benchmarks/local_dtypes.py``: ``packed_linear``). In bfloat16 the
products are the same numbers as ``nn.functional.linear``'s; in float32 they differ in the last
bits (another order of accumulation), as two BLAS libraries' do.

:func:`to_packed` replaces a model's bias-free linear layers by :class:`PackedLinear`. The model
is then for inference only: the packed weights are not parameters (no gradients, no state dict
entries). An output head tied to the embedding keeps the shared plain weight: packed, it would
hold a copy of its own (57 MB for SmolLM2, which took the README's main job from 1,388 to 1,488
MiB at its peak, for about 2.7 ms of a 45 ms step of 8 rows). :class:`~nemo_gym_env.policies.local.LocalPolicy` packs its own
model on the CPU; a trainer's model (``adapters/trl``) is never packed.

Example::

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    if supports_packed(torch.bfloat16):
        to_packed(model)
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["PackedLinear", "packable", "shared_weights", "supports_packed", "to_packed"]

_BATCH_HINT = 8
"""The rows oneDNN is told to lay the weights out for; the products take any number of rows (a step of 1 to 32
rows, a prefill of hundreds). Laid out for 1, 8 or 16 rows, the layers of a step of 8 rows took 20.2, 18.9 and
19.4 ms."""


def supports_packed(dtype: torch.dtype) -> bool:
    """Whether this PyTorch can pack linear layers of ``dtype`` (float32, or bfloat16 where oneDNN computes it)."""
    mkldnn = getattr(torch.ops, "mkldnn", None)
    if not torch.backends.mkldnn.is_available() or not all(
            hasattr(mkldnn, name) for name in ("_reorder_linear_weight", "_linear_pointwise")):
        return False
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return dtype == torch.float32


def packable(linear: nn.Linear) -> bool:
    """Whether :class:`PackedLinear` takes ``linear``: bias-free, on the CPU, of a dtype :func:`supports_packed`."""
    return linear.bias is None and linear.weight.device.type == "cpu" and supports_packed(linear.weight.dtype)


class PackedLinear(nn.Module):
    """A bias-free linear layer computed from a oneDNN-packed copy of its weight (see the module docstring).

    Args:
        linear: A bias-free ``nn.Linear`` on the CPU, float32 or bfloat16 (:func:`supports_packed`). Its weight is
            read, not kept.
    """

    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight = linear.weight
        if not packable(linear):
            raise ValueError("PackedLinear takes a bias-free nn.Linear on the CPU whose dtype oneDNN packs "
                             f"(float32, or bfloat16 where supported); got bias={linear.bias is not None}, "
                             f"{weight.dtype} on {weight.device}")
        self.in_features, self.out_features, self.dtype = linear.in_features, linear.out_features, weight.dtype
        with torch.no_grad():
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), _BATCH_HINT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != self.dtype or x.shape[-1] != self.in_features:
            raise ValueError(f"PackedLinear({self.in_features} -> {self.out_features}, {self.dtype}) takes "
                             f"(..., {self.in_features}) {self.dtype} inputs, got {tuple(x.shape)} {x.dtype}")
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, dtype={self.dtype}"


def shared_weights(model: nn.Module) -> set[int]:
    """The ``id`` of every parameter a module other than an ``nn.Linear`` holds: an embedding's weight, which a tied
    output head reads too (packing that head would hold the weight twice)."""
    return {id(parameter) for module in model.modules() if not isinstance(module, nn.Linear)
            for parameter in module.parameters(recurse=False)}


def to_packed(model: nn.Module, *, tied: bool = False) -> int:
    """Replace every bias-free ``nn.Linear`` of ``model`` whose dtype oneDNN packs by a :class:`PackedLinear`, in
    place (for inference: see the module docstring).

    ``tied``: also a layer whose weight another module holds (an output head tied to the embedding), which then
    takes a packed copy of its own; by default it keeps the shared weight.

    Returns:
        How many layers were replaced (0 where this PyTorch packs none of them).
    """
    shared = shared_weights(model)
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and packable(child) and (tied or id(child.weight) not in shared):
                setattr(parent, name, PackedLinear(child))
                replaced += 1
    return replaced
