"""Composite ops whose kernel choice hangs on a layout that a trace can put right.

`scaled_dot_product_attention` picks its kernel from its arguments. On CUDA every fused
kernel (flash, memory-efficient, cuDNN) refuses a mask whose last dimension is not dense
(stride 1), and the call falls back to the math path: the whole attention matrix in float32,
its probabilities saved for the backward. transformers builds such a mask under Dynamo:
eager drops an all-ones padding mask after looking at its values, a trace cannot look, so
BERT's compiled graph holds an `expand`ed boolean mask, stride 0 along the keys. The user's
eager step runs cuDNN's kernel; the compiled one ran the math path, as slow under
torch.compile as under ours (issue 20: BERT's step 1.22x torch's, its peak 1.35x, from the
float32 backward).

Traced, such a mask is made dense before SDPA chooses (`attention_masks_dense`): a copy of a
few MB, one per graph where the layers share the mask (the copies are common
subexpressions). SDPA then chooses as for a mask built in memory. Its results are the fused
kernel's, equal to the math path's up to rounding; its dropout draws inside the kernel, as
eager's does without the mask (backends draw differently from eager anyway).

A double backward replays eager's kernels (replay/), here the math path, differentiable
twice: without dropout it runs as eager's; with dropout the replay would draw where the
forward's kernel drew, and is refused by name.

Only CUDA: the CPU kernels choose by other rules, which a mask's layout does not move.
"""

from __future__ import annotations

import torch
from torch._C import DispatchKey

from ..semantics.mends import python_kernels

SDPA = torch.ops.aten.scaled_dot_product_attention.default


def attention_masks_dense():
    """Around a trace: SDPA's composite kernel (the one eager runs, choosing the fused
    kernel) is given a mask dense in its last dimension on CUDA."""
    def attend(query, key, value, attn_mask=None, *args, **kwargs):
        if query.device.type == "cuda" and _sparse_last_dimension(attn_mask):
            attn_mask = attn_mask.contiguous()
        return SDPA._op_dk(DispatchKey.CompositeImplicitAutograd, query, key, value, attn_mask,
                           *args, **kwargs)
    return python_kernels(SDPA, {DispatchKey.CompositeImplicitAutograd: attend})


def _sparse_last_dimension(mask) -> bool:
    """A mask whose last stride is a known int other than 1. A symbolic stride is left
    alone (asking would guard on it); a symbolic size is at least 2 (Dynamo specializes
    sizes 0 and 1)."""
    if not isinstance(mask, torch.Tensor) or mask.dim() == 0:
        return False
    size, stride = mask.size(-1), mask.stride(-1)
    return isinstance(stride, int) and stride != 1 and not (isinstance(size, int) and size <= 1)
