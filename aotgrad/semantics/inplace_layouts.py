"""In-place and out= ops keep their target's layout, functionalized too.

Eager's `y.masked_fill_(m, 0)` writes into `y`'s memory: `y` keeps its strides. The
functional form functionalization puts in its place, `masked_fill(y, m, 0)`, returns a new
tensor of the op's own layout (contiguous, for `masked_fill`, `triu`, `scatter`,
`index_add`, `cumsum`...), which becomes `y`'s value: a channels-last or transposed `y`
came out of the compiled function contiguous, and a later `y.view(-1)`, which eager refuses,
worked. Where the functional form would change the target's layout, the op is traced as
that form followed by a `copy_` into the target, which functionalizes to a value in the
target's layout (Inductor fuses the copy into the op's kernel). The same for an out= op
(`torch.cumsum(x, 0, out=y)`) whose out tensor has its result's shape and dtype: eager's
kernel writes into it in its strides.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._subclasses.functional_tensor import FunctionalTensor
from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

from .dynamic import hint

COPY_ = torch.ops.aten.copy_.default
BERNOULLI_ = torch.ops.aten.bernoulli_.float


def inplace_keeping_layout(mode: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    """Inside `mode.__torch_dispatch__`: `func`, an in-place op, traced as its functional
    form and a copy into its target where that form would change the target's layout, or
    NotImplemented where nothing needs doing."""
    if func is BERNOULLI_:
        return bernoulli_in_memory_order(mode, args, kwargs)
    functional = functional_form(func)
    # `copy_` is this rewrite's own write-back: rewritten in turn, it recursed without end
    # where the target's value had another layout than its wrapper (a random fill such as
    # dropout's `bernoulli_` into a transposed tensor, which functionalization draws
    # contiguous: TransformerEncoderLayer(batch_first=True) in training).
    if func is COPY_ or functional is None or not args or \
            not isinstance(args[0], FunctionalTensor) or \
            significant_strides(args[0]) == contiguous_strides(args[0].shape):
        return NotImplemented
    probe = _probe(functional, args, kwargs)
    if probe is None or significant_strides(probe) == significant_strides(args[0]):
        return NotImplemented
    with mode:  # both ops functionalized in turn
        return args[0].copy_(functional(*args, **kwargs))


def bernoulli_in_memory_order(mode: Any, args: tuple, kwargs: dict) -> Any:
    """`t.bernoulli_(p)` on a dense, non-contiguous `t` (dropout's noise, `empty_like` of a
    transposed input): eager's kernel draws in memory order, in place. Functionalization
    draws `bernoulli.p`, which fills a contiguous tensor in logical order: other numbers at
    each position, and `t` came out contiguous. Traced as a draw of `t`'s memory order (the
    permuted shape, contiguous), permuted back and copied into `t`; NotImplemented where
    nothing needs doing (contiguous or overlapping)."""
    target = args[0]
    order = _memory_order(target) if isinstance(target, FunctionalTensor) else None
    if order is None:
        return NotImplemented
    p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
    inverse = sorted(range(len(order)), key=order.__getitem__)
    with mode:  # the draw and the copy functionalized in turn
        drawn = torch.ops.aten.bernoulli.p(target.permute(order), p,
                                           generator=kwargs.get("generator"))
        return target.copy_(drawn.permute(inverse))


def _memory_order(t: torch.Tensor) -> list[int] | None:
    """The dimensions of a dense, non-overlapping `t` from outermost to innermost in memory,
    where that is not their order; None otherwise. Symbolic sizes and strides are read by
    their example values (no guard), as `significant_strides` reads them."""
    strides, shape = [hint(s) for s in t.stride()], [hint(n) for n in t.shape]
    order = memory_order(t)
    step = 1
    for d in reversed(order):
        if shape[d] != 1 and strides[d] != step:
            return None
        step *= shape[d]
    layout_differs = significant_strides(t) != contiguous_strides(t.shape)
    return order if step and layout_differs else None


def out_keeping_layout(mode: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    """As `inplace_keeping_layout`, for an out= op: its functional form, then a copy into
    each out tensor; NotImplemented where nothing needs doing."""
    functional, names = out_form(func)
    outs = [kwargs.get(n) for n in names]
    if functional is None or not all(isinstance(o, FunctionalTensor) for o in outs) or \
            all(significant_strides(o) == contiguous_strides(o.shape) for o in outs):
        return NotImplemented
    rest = {k: v for k, v in kwargs.items() if k not in names}
    probes = pytree.tree_leaves(_probe(functional, args, rest))
    if len(probes) != len(outs) or not all(_writable_in_place(o, p) for o, p in zip(outs, probes)) \
            or all(significant_strides(o) == significant_strides(p) for o, p in zip(outs, probes)):
        return NotImplemented
    with mode:  # each op functionalized in turn
        results = pytree.tree_leaves(functional(*args, **rest))
        written = [o.copy_(r) for o, r in zip(outs, results)]
    return written[0] if len(written) == 1 else tuple(written)


def _writable_in_place(out: torch.Tensor, result: Any) -> bool:
    """Eager writes a result of the out tensor's shape and dtype into it as it is (another
    shape resizes it; another dtype casts or refuses)."""
    return isinstance(result, torch.Tensor) and result.dtype == out.dtype and \
        tuple(hint(n) for n in result.shape) == tuple(hint(n) for n in out.shape)


@functools.cache
def out_form(func: Any) -> tuple[torch._ops.OpOverload | None, tuple[str, ...]]:
    """(`aten.cumsum.default`, ("out",)) for `aten.cumsum.out`: the overload of the same op
    that takes the other arguments and returns as many tensors as it writes."""
    if not isinstance(func, torch._ops.OpOverload) or func.namespace != "aten":
        return None, ()
    names = tuple(a.name for a in func._schema.arguments if a.is_out)
    others = [a.name for a in func._schema.arguments if not a.is_out]
    for overload in func.overloadpacket.overloads() if names else ():
        candidate = getattr(func.overloadpacket, overload)
        schema = candidate._schema
        if not schema.is_mutable and [a.name for a in schema.arguments] == others and \
                len(schema.returns) == len(names):
            return candidate, names
    return None, ()


@functools.cache
def functional_form(func: Any) -> torch._ops.OpOverload | None:
    """`aten.triu.default` for `aten.triu_.default`: an ATen op that writes its first
    argument alone and returns it, through an out-of-place op of the same overload."""
    if not isinstance(func, torch._ops.OpOverload) or func.namespace != "aten" or \
            torch.Tag.inplace_view in func.tags:
        return None
    schema = func._schema
    writes = [a for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    name = schema.name.split("::")[1]
    if not name.endswith("_") or writes != schema.arguments[:1] or len(schema.returns) != 1:
        return None
    packet = getattr(torch.ops.aten, name[:-1], None)
    return getattr(packet, func._overloadname, None) if packet is not None else None


def _probe(functional: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    """What `functional` returns on the fake values inside, not traced."""
    inner_args, inner_kwargs = pytree.tree_map_only(
        FunctionalTensor, FunctionalTensor.from_functional, (args, kwargs))
    try:
        with disable_proxy_modes_tracing():
            return functional(*inner_args, **inner_kwargs)
    except Exception:  # let the op itself raise, as eager's would
        return None


def memory_order(t: torch.Tensor) -> list[int]:
    """`t`'s dimensions from outermost to innermost in memory (by stride, ties in order),
    read by their example values where symbolic (no guard)."""
    return sorted(range(t.dim()), key=lambda d: (-hint(t.stride(d)), d))


def significant_strides(t: Any) -> tuple | None:
    """The strides that make a layout (of dimensions longer than one), by their values in
    the example inputs where symbolic (no guard)."""
    if not isinstance(t, torch.Tensor) or t.layout is not torch.strided:
        return None
    return tuple(hint(s) for n, s in zip(t.shape, t.stride()) if hint(n) > 1)


def contiguous_strides(shape) -> tuple:
    """`significant_strides` of a contiguous tensor of `shape` (computed: a tensor made
    inside a trace would be a node of it)."""
    strides, step = [], 1
    for n in reversed([hint(n) for n in shape]):
        if n > 1:
            strides.append(step)
        step *= n
    return tuple(reversed(strides))
