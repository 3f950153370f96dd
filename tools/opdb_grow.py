"""The dynamic pass's second sample: the OpInfo sample grown to other sizes.

Every dim of size n >= 2 becomes n + 1: sizes that were equal stay equal and keep their
order, 0 and 1 stay (PyTorch specializes them), so shape constraints between inputs mostly
still hold. Values are tiled from the original, so index tensors stay in range.
"""

from __future__ import annotations

from typing import Sequence

import torch


def grow_tensors(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor] | None:
    """Grown copies (a tensor given twice grown once); None if no dim can grow."""
    if not any(n >= 2 for t in tensors for n in t.shape) or any(
            t.layout != torch.strided for t in tensors):
        return None
    grown: dict[int, torch.Tensor] = {}
    for t in tensors:
        if id(t) not in grown:
            grown[id(t)] = _grow(t)
    return [grown[id(t)] for t in tensors]


def _grow(t: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        g = t.detach()
        for d, n in enumerate(t.shape):
            if n >= 2:
                g = g.index_select(d, torch.arange(n + 1) % n)
        order = sorted(range(t.dim()), key=lambda d: -t.stride(d))  # keep the layout's order
        g = g.permute(order).contiguous().permute([order.index(d) for d in range(t.dim())])
    return g.requires_grad_(t.requires_grad)
