"""``dtype="int8"`` for the local policy: int8 weights for decoding, bfloat16 for everything else.

Decoding a token reads every weight of the model once, so on a CPU its time follows the bytes
read: 540 MB in float32 for SmolLM2-135M. :func:`to_int8` turns a bfloat16 model's linear layers
(attention, MLP and the output head) into :class:`Int8Linear`, which keeps each weight as well
as an int8 copy of it, with one scale per output row (symmetric, round to nearest). A forward
pass over a few tokens (a decoding step of up to ``small_batch`` tokens) multiplies by the int8
copy with PyTorch's weight-only kernel (``torch._weight_int8pack_mm``: activations stay
bfloat16); a longer one (a larger step, a prompt's prefill) multiplies by the bfloat16 weight,
laid out for oneDNN where it can be (:mod:`~nemo_gym_env.policies.packed`): the int8 kernel's
cost grows with the tokens, and past 4 the packed bfloat16 product is quicker. Embeddings, norms
and the key/value cache are bfloat16.

What it changes (``benchmarks/local_dtypes.py`` measures it): decoding steps of up to
:data:`SMALL_BATCH` tokens are faster than in bfloat16 or float32 (one conversation alone most of
all); larger steps use the bfloat16 weights, as ``dtype="bfloat16"`` does; the int8 copies add
half the weights' bytes to memory; the tokens differ from float32's (as bfloat16's do), so greedy
outputs and rewards are those of a slightly different model. Training never uses this copy: a
trainer keeps its own weights.

Dynamic int8 quantization (``torch.ao.quantization.quantize_dynamic``, which also quantizes
activations) was measured too and is not offered: SmolLM2's activation outliers cost it about 2
nats of log-probability per token against float32, where weight-only int8 costs 0.05.
"""

from __future__ import annotations

import torch
from torch import nn

from nemo_gym_env.policies.packed import PackedLinear, packable, shared_weights

__all__ = ["Int8Linear", "supports_int8", "to_int8"]

SMALL_BATCH = 4
"""Inputs of up to this many tokens use the int8 weights. Every linear layer of SmolLM2-135M for one decoding step,
weights from memory (the int8 kernel against packed bfloat16, 2 cores): 1 token 12.2 against 19.0 ms, 4 tokens 16.3
against 22.3, 6 tokens 26.5 against 17.6, 8 tokens 28.7 against 20.7 (the int8 kernel's cost grows with the tokens,
the bfloat16 product's hardly)."""


def supports_int8() -> bool:
    """Whether this PyTorch has the weight-only int8 kernel :class:`Int8Linear` needs."""
    return hasattr(torch, "_weight_int8pack_mm")


class Int8Linear(nn.Module):
    """A linear layer without bias, computed from int8 weights for small inputs (see the module docstring).

    Args:
        linear: A bias-free ``nn.Linear`` with bfloat16 weights.
        small_batch: Inputs of up to this many tokens use the int8 copy.
        packed: Larger inputs use a oneDNN-packed copy of the bfloat16 weight
            (:class:`~nemo_gym_env.policies.packed.PackedLinear`) where this CPU packs bfloat16, and the layer
            keeps no plain weight; False, or where it cannot, they use ``linear``'s weight, shared, not copied (a
            tied output head stays tied to the embedding).
    """

    def __init__(self, linear: nn.Linear, small_batch: int = SMALL_BATCH, *, packed: bool = True):
        super().__init__()
        if linear.bias is not None or linear.weight.dtype != torch.bfloat16:
            raise ValueError("Int8Linear takes a bias-free nn.Linear with bfloat16 weights")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.small_batch = small_batch
        self.large: nn.Module = PackedLinear(linear) if packed and packable(linear) else linear
        with torch.no_grad():
            rows = linear.weight.detach().float()
            scales = rows.abs().amax(dim=1).clamp(min=1e-12) / 127
            self.register_buffer("qweight", torch.round(rows / scales[:, None]).clamp(-127, 127).to(torch.int8))
            self.register_buffer("scales", scales.to(torch.bfloat16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        if flat.shape[0] > self.small_batch or flat.dtype != torch.bfloat16 or flat.device.type != "cpu":
            return self.large(x)
        return torch._weight_int8pack_mm(flat.contiguous(), self.qweight, self.scales).reshape(*x.shape[:-1], -1)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, small_batch={self.small_batch}"


def to_int8(model: nn.Module, small_batch: int = SMALL_BATCH, *, packed: bool = True) -> int:
    """Replace every bias-free bfloat16 ``nn.Linear`` of ``model`` by an :class:`Int8Linear` (``packed``: see there),
    in place.

    Returns:
        How many layers were replaced.

    Raises:
        RuntimeError: This PyTorch lacks the kernel (:func:`supports_int8`).
    """
    if not supports_int8():
        raise RuntimeError(f"dtype='int8' needs torch._weight_int8pack_mm, which torch {torch.__version__} lacks")
    shared = shared_weights(model)
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and child.bias is None and child.weight.dtype == torch.bfloat16:
                # a head tied to the embedding keeps the shared weight for its larger inputs (see packed.py)
                setattr(parent, name, Int8Linear(child, small_batch, packed=packed and id(child.weight) not in shared))
                replaced += 1
    return replaced
