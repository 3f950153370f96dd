"""SDPA's mask as its fast kernels take it: made dense in our traces, folded into the call
in Dynamo's graph where it is a constant.

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

Better still, a mask that is a constant: transformers builds, under Dynamo, the mask eager
would have dropped (BERT's padding mask with no padding: all true) or replaced by
`is_causal=True` (GPT-2's and Llama's causal mask) from `arange`s alone. Such a mask is
evaluated when the Dynamo graph arrives (`fold_constant_masks`); all true, the call gets no
mask; equal to SDPA's own causal mask, `is_causal=True`. The values are the same by
definition; the kernels differ as eager's: no bias to read, and a causal kernel skips the
blocks above the diagonal. Only boolean masks of static shape built from no input by
integer and boolean ops (exact everywhere), none of which draws, writes or allocates
without filling.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import fx
from torch._C import DispatchKey
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.utils._python_dispatch import TorchDispatchMode

from ..semantics.mends import python_kernels
from ..tables import UNINITIALIZED

log = logging.getLogger(__name__)
SDPA = torch.ops.aten.scaled_dot_product_attention.default
_SDPA_ARGUMENTS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
                   "enable_gqa")
# A mask of more elements than this, intermediates included, is not evaluated.
_MAX_FOLDED_ELEMENTS = 2**26


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


# ---- constant masks, in Dynamo's graph --------------------------------------------------------

def fold_constant_masks(gm: fx.GraphModule) -> None:
    """Each SDPA call of Dynamo's graph whose mask is a constant all-true or causal boolean
    gets no mask, or `is_causal=True` instead; what built the mask goes if nothing else
    reads it."""
    folded = False
    for node in gm.graph.find_nodes(op="call_function", target=F.scaled_dot_product_attention):
        arguments = {**dict(zip(_SDPA_ARGUMENTS, node.args)), **node.kwargs}
        mask = arguments.get("attn_mask")
        if not isinstance(mask, fx.Node) or arguments.get("is_causal", False) is not False:
            continue
        kind = _constant_kind(mask, arguments["query"], arguments["key"])
        if kind is None:
            continue
        arguments.update(attn_mask=None, is_causal=kind == "causal")
        node.args, node.kwargs = (), arguments
        _erase_unread(mask, gm.graph)
        folded = True
        log.debug("SDPA call %s: its constant mask is %s", node.name, kind)
    if folded:  # a graph of no SDPA call or no constant mask keeps its code
        gm.recompile()


def _constant_kind(mask: fx.Node, query: fx.Node, key: fx.Node) -> str | None:
    """'all true' or 'causal' (SDPA's own, aligned top left) for a boolean mask computed
    from constants alone; None for any other."""
    nodes = _builders(mask)
    if nodes is None:
        return None
    q, k = query.meta["example_value"], key.meta["example_value"]
    if not _broadcasts_within(mask.meta["example_value"].shape, (*q.shape[:-1], k.shape[-2])):
        return None
    value = _evaluate(nodes, mask)
    if value is None or value.dtype != torch.bool:
        return None
    if value.all():
        return "all true"
    length, keys = q.size(-2), k.size(-2)
    if not (isinstance(length, int) and isinstance(keys, int)):
        # a symbolic length (dynamic=True, the mask static): building the causal mask from
        # it raised out of the compile; asking its value would guard on it
        return None
    causal = torch.ones(length, keys, dtype=torch.bool, device=value.device).tril()
    try:
        return "causal" if (value == causal).all() else None
    except RuntimeError:  # its last dimensions do not broadcast against (queries, keys)
        return None


def _broadcasts_within(mask_shape, attention_shape) -> bool:
    """Whether the mask broadcasts to the attention's (..., queries, keys) shape without
    growing it. A mask of more dimensions (a leading one over 3-d inputs) or larger where
    the attention has size 1 makes eager's SDPA raise (its in-place add cannot grow the
    scores), or broadcast the output; with the mask dropped the call would silently return
    the smaller output. Symbolic sizes of the attention count as unknown: refused."""
    if len(mask_shape) > len(attention_shape):
        return False
    for m, a in zip(reversed(mask_shape), reversed(attention_shape)):
        if m != 1 and not (isinstance(a, int) and m == a):
            return False
    return True


def _builders(mask: fx.Node) -> list[fx.Node] | None:
    """The nodes that compute `mask`, in graph order; None where one reads an input, a
    module or an attribute, calls into functorch (vmap's levels live outside the graph),
    or computes a value not `_exact_small_static`."""
    seen, stack = set(), [mask]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if node.op not in ("call_function", "call_method") or "example_value" not in node.meta \
                or "functorch" in getattr(node.target, "__module__", "") \
                or not _exact_small_static(node.meta["example_value"]) \
                or _written(node.meta["example_value"]):
            return None
        stack.extend(node.all_input_nodes)
    return [n for n in mask.graph.nodes if n in seen]


def _written(value) -> bool:
    """Whether Dynamo's trace wrote into the tensor, or a view of it, anywhere in the graph
    (`mask[:, 0] = False`, `mask.masked_fill_(...)`, `mask.tril_()`, `mask.view(-1)[i].fill_`):
    the write is a user of the node, not one of the nodes that compute it, so evaluating
    those alone gave the value before the write (an all-ones `torch.ones` folded to no mask,
    the user's edits lost). Dynamo's fake tensors count writes in their version counter,
    shared with their views; a write after the SDPA call is refused too (conservative)."""
    return isinstance(value, torch.Tensor) and value._version != 0


def _exact_small_static(value) -> bool:
    """A Python number, or a tensor of integers or booleans (whose arithmetic is exact on
    every device and under autocast), of static shape and not large."""
    if isinstance(value, (int, float, bool)):
        return True
    return isinstance(value, torch.Tensor) and not value.is_floating_point() \
        and not value.is_complex() and value.numel() <= _MAX_FOLDED_ELEMENTS \
        and not any(isinstance(n, torch.SymInt) for n in (*value.shape, *value.stride()))


def _evaluate(nodes: list[fx.Node], mask: fx.Node) -> torch.Tensor | None:
    """`mask`'s value, from a copy of the nodes run on real tensors; None where an op draws
    random numbers or writes (folding it away would change the generator or a value read
    elsewhere) or where the copy cannot run."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in nodes:
        env[node] = graph.node_copy(node, env.__getitem__)
    graph.output(env[mask])
    try:
        with unset_fake_temporarily(), torch.no_grad(), _PureOps() as ops:
            value = fx.GraphModule(torch.nn.Module(), graph)()
    except Exception as e:  # noqa: BLE001  (an optimization: a mask it cannot run stays)
        log.debug("a constant SDPA mask not evaluated: %s", e)
        return None
    return value if ops.pure and isinstance(value, torch.Tensor) else None


class _PureOps(TorchDispatchMode):
    """Notes whether every ATen op run draws nothing, writes nothing and reads no memory
    left uninitialized (`empty`: its contents differ from run to run)."""

    def __init__(self):
        super().__init__()
        self.pure = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if torch.Tag.nondeterministic_seeded in func.tags or func._schema.is_mutable \
                or func in UNINITIALIZED:
            self.pure = False
        return func(*args, **(kwargs or {}))


def _erase_unread(node: fx.Node, graph: fx.Graph) -> None:
    """`node` and what computed it, where nothing else reads them (all pure: _evaluate)."""
    if node.users or node.op not in ("call_function", "call_method"):
        return
    inputs = node.all_input_nodes
    graph.erase_node(node)
    for source in inputs:
        _erase_unread(source, graph)
