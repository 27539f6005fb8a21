"""Attention for decoding steps on the CPU: a row's newest token (and its draft tokens) against the key/value cache.

SmolLM2 has 9 query heads on 3 key/value heads. For a step whose rows need a padding mask,
transformers' SDPA path stacks the 3 query heads of each key/value head into one query block
and calls PyTorch's fused kernel on that; for a step without one (a row decoding alone, or rows
of one length) it passes the 9 heads with ``enable_gqa=True`` instead, and PyTorch's CPU kernel
is far slower there: 344 us a layer in bfloat16 over 550 cached positions, against 69 us
stacked (``benchmarks/local_dtypes.py``, ``results/local_dtypes.json``: ``attention_step``),
a quarter of a lone conversation's decoding step in int8. :func:`decode_attention` stacks the
heads whether or not there is a mask, for one-token queries on the CPU; anything else (longer
queries, other devices, dropout, biases) goes to transformers' own SDPA path unchanged.

Where the step is large (rows x positions of 1,024 or more) the stacked heads go through two
matrix products and a softmax in float32 instead of the fused kernel, as transformers' eager
attention computes it: the fused kernel splits its work into blocks too small to keep both cores
busy, and the products read each key and value once (16 rows over 1,394 positions, bfloat16: 1.1
ms a layer against 2.2 ms; ``benchmarks/local_dtypes.py``: ``attention_step``). Below that size
the fused kernel is quicker (one row over 300 positions: 49 us against 87 us).

The running batch (:class:`~nemo_gym_env.policies.decoding.RunningBatch`) keeps its rows in
groups of similar length, each group padded only to its own longest row, and hands this function
a :class:`GroupedStates` for a step's keys and values: one attention call per group. A step that
feeds draft tokens (:mod:`~nemo_gym_env.policies.drafts`) has a few queries a row, each masked to
the positions before it (:func:`group_mask`); they are stacked with the heads the same way.

:func:`use_decode_attention` switches a model to it (``attn_implementation`` ``"nge_decode"``,
registered with transformers' ``AttentionInterface``; the masks are SDPA's);
:class:`~nemo_gym_env.policies.batching.BatchGenerator` does for every CPU model it decodes.

Example::

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    use_decode_attention(model)   # True: its decoding steps take the path above
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

__all__ = ["NAME", "GroupedStates", "decode_attention", "group_mask", "use_decode_attention"]

NAME = "nge_decode"

_PRODUCTS_FROM = 1024
"""Rows x positions from which a step's attention is two matrix products rather than the fused kernel."""


class GroupedStates:
    """One layer's keys and values for a decoding step whose rows are held in groups (each padded to its own width).

    ``parts``: per group, in the order of the step's rows, ``(first_row, end_row, keys, values, mask)``: ``keys``
    and ``values`` (rows, kv_heads, positions, dim) with the ``mask`` :func:`group_mask` gave for them.
    """

    __slots__ = ("parts",)

    def __init__(self, parts: list[tuple[int, int, torch.Tensor, torch.Tensor, torch.Tensor | None]]):
        self.parts = parts


def group_mask(mask: torch.Tensor, capacity: int, dtype: torch.dtype, queries: int = 1) -> tuple[bool, torch.Tensor | None]:
    """How a group's step attends, from its (rows, width) 0/1 mask and its buffers' ``capacity`` (width and room).

    ``queries``: positions fed per row this step, the last ``queries`` columns of ``mask``; each sees the columns
    before it and itself (a row's newest token and its drafts, :mod:`~nemo_gym_env.policies.drafts`).

    Returns ``(whole, mask)``. A large step (rows x capacity of 1,024 or more) reads the whole buffers (``whole``
    True: a view of their first ``width`` positions would make the matrix product copy them) with an additive
    mask (``dtype``, -inf on padding and on the room not written yet, which must hold finite values). A small
    one reads the first ``width`` positions with a boolean mask, or None where every position counts.
    Masks are (rows, 1, queries, positions).
    """
    rows, width = mask.shape
    allowed = mask.bool()[:, None, None, :]
    if queries > 1:
        column = torch.arange(width, device=mask.device)
        allowed = allowed & (column[None, :] <= (width - queries + torch.arange(queries, device=mask.device))[:, None])
    if rows * capacity >= _PRODUCTS_FROM:
        full = torch.full((rows, 1, queries, capacity), float("-inf"), dtype=dtype, device=mask.device)
        full[..., :width].masked_fill_(allowed, 0.0)
        return True, full
    if queries == 1 and bool(mask.all()):
        return False, None
    return False, allowed.expand(rows, 1, queries, width)


def _attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
            scaling: float | None, *, products: bool) -> torch.Tensor:
    """Queries (rows, heads, q, dim) against (rows, kv_heads, positions, dim): (rows, heads, q, dim), through the
    matrix products (``mask`` additive or None) or the fused kernel (see the module docstring); ``mask`` is
    (rows, 1, q, positions) or None."""
    rows, heads, length, dim = query.shape
    kv_heads, positions = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    # The query heads that share a key/value head become that head's queries: (rows, kv_heads, groups x q, dim).
    stacked = query.reshape(rows, kv_heads, groups * length, dim)
    if products:
        scores = torch.matmul(stacked, key.transpose(-1, -2)).mul_(dim ** -0.5 if scaling is None else scaling)
        if mask is not None:  # each stacked head's q queries take the mask's q rows (broadcast, not copied)
            scores.view(rows, kv_heads, groups, length, positions).add_(mask[:, :, None])
        out = torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype), value)
    else:
        if length > 1 and mask is not None:  # the fused kernel takes a mask of the stacked queries' shape
            mask = mask[:, :, None].expand(rows, 1, groups, length, positions).reshape(rows, 1, groups * length,
                                                                                       positions)
        out = torch.nn.functional.scaled_dot_product_attention(stacked, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(rows, heads, length, dim)


def decode_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: ``query`` (batch, heads, q, dim), ``key``/``value``
    (batch, kv_heads, kv, dim), a boolean or additive mask (batch or 1, 1, q, kv) or None; returns
    (batch, q, heads, dim)."""
    if isinstance(key, GroupedStates):
        if dropout or any(kwargs.get(name) is not None for name in ("sliding_window", "softcap", "s_aux", "position_bias")):
            raise ValueError("grouped decoding steps take plain attention only (no dropout, sliding window, soft cap, "
                             "sinks or position bias); this model's running batch must keep one group")
        parts = [_attend(query[first:end], keys, values, mask, scaling, products=mask is not None and mask.dtype != torch.bool)
                 for first, end, keys, values, mask in key.parts]
        out = parts[0] if len(parts) == 1 else torch.cat(parts)
        return out.transpose(1, 2).contiguous(), None
    heads, length = query.shape[1], query.shape[2]
    kv_heads = key.shape[1]
    if (query.device.type != "cpu" or length != 1 or dropout or heads % kv_heads or heads == kv_heads
            or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None
            or (attention_mask is not None and (attention_mask.dim() != 4 or attention_mask.shape[1] != 1))):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    return _attend(query, key, value, attention_mask, scaling, products=False).transpose(1, 2).contiguous(), None


def use_decode_attention(model: Any) -> bool:
    """Switch ``model`` to :func:`decode_attention` if it runs SDPA on the CPU; whether it did."""
    config = getattr(model, "config", None)
    device = getattr(model, "device", None)
    current = getattr(config, "_attn_implementation", None)
    if current == NAME:
        return True
    if current != "sdpa" or getattr(device, "type", None) != "cpu":
        return False
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(NAME, decode_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    try:
        model.set_attn_implementation(NAME)
    except (ValueError, AttributeError, TypeError):  # a model class that cannot switch keeps SDPA
        return False
    return getattr(model.config, "_attn_implementation", None) == NAME
