"""SDPA's kernel choice (capture/kernel_choice.py, backends/passes.py).

- A mask that is not dense in its last dimension (transformers' padding mask under Dynamo:
  an expanded boolean, stride 0 along the keys) takes a fused kernel in our traces, where
  eager falls back to the float32 math path. Against eager on the same mask (math path), on
  the mask made dense (the fused kernel), and against float64.
- cuDNN's backward gets its gradient laid out like its output (torch 2.11's caches its
  kernel without the gradient's strides).
- Through Dynamo, a constant all-true or causal boolean mask is folded into the call; every
  other mask stays. Against eager.

The CUDA tests ran on the GPU machine (bench/results/h200-2026-12-01-session32), before the
folding, which the CPU tests cover.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import aotgrad
from aotgrad.backends.passes import attention_grads_laid_like_outputs
from aotgrad.capture.kernel_choice import _sparse_last_dimension

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA-only: the kernel choice")
FUSED = ("_scaled_dot_product_cudnn_attention", "_scaled_dot_product_efficient_attention",
         "_scaled_dot_product_flash_attention")


def padding_mask(b: int, t: int, device) -> torch.Tensor:
    """As transformers builds it under Dynamo: a comparison, expanded over batch and keys."""
    return (torch.arange(t, device=device)[None, None, :, None] >= 0).expand(b, 1, t, t)


def attend(q, k, v, mask, p: float = 0.0):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)


def recording_backend(graphs: list) -> aotgrad.Backend:
    """The graphs kept, and run as they are."""
    def record(gm, example_inputs):
        graphs.append(gm)
        return gm
    return aotgrad.Backend(record, record, record)


def attention_ops(gm) -> set[str]:
    return {n.target.__name__.split(".")[0] for n in gm.graph.nodes
            if n.op == "call_function" and "attention" in str(n.target)}


def qkv(device, dtype, b=2, h=4, t=64, d=32):
    torch.manual_seed(0)
    # [b, t, h, d] transposed to [b, h, t, d], as a model's projections give them
    return [torch.randn(b, t, h, d, device=device, dtype=dtype).transpose(1, 2)
            .requires_grad_() for _ in range(3)]


@pytest.mark.parametrize("mask", [
    (torch.ones(4, 1, 8, 8, dtype=torch.bool).expand(4, 1, 8, 8), False),
    (torch.ones(4, 1, 8, 1, dtype=torch.bool).expand(4, 1, 8, 8), True),
    (torch.ones(4, 1, 8, 8).transpose(-1, -2), True),
    (torch.ones(4, 1, 8, 1), False),
    (None, False),
], ids=["dense", "expanded-keys", "transposed", "one-key", "none"])
def test_which_masks_are_made_dense(mask):
    mask, sparse = mask
    assert _sparse_last_dimension(mask) is sparse


def test_cpu_trace_keeps_the_mask_as_it_is():
    """The CPU kernels choose by other rules: the trace holds no copy of the mask."""
    graphs = []
    q, k, v = qkv("cpu", torch.float32)
    mask = padding_mask(2, 64, "cpu")
    out = aotgrad.compile(attend, backend=recording_backend(graphs))(q, k, v, mask)
    expected = attend(*(t.detach() for t in (q, k, v)), mask)
    torch.testing.assert_close(out, expected)
    copies = [n for n in graphs[0].graph.nodes if "clone" in str(n.target)]
    assert not copies, graphs[0].code


@CUDA
def test_expanded_mask_takes_a_fused_kernel_with_eager_values():
    graphs = []
    q, k, v = qkv("cuda", torch.bfloat16)
    mask = padding_mask(2, 64, "cuda")
    assert torch._fused_sdp_choice(q, k, v, attn_mask=mask) == 0  # eager: the math path
    compiled = aotgrad.compile(attend, backend=recording_backend(graphs))
    out = compiled(q, k, v, mask)
    out.float().square().sum().backward()
    grads = [t.grad for t in (q, k, v)]
    assert attention_ops(graphs[0]) & set(FUSED), graphs[0].code
    for t in (q, k, v):
        t.grad = None
    dense = mask.contiguous()
    expected = attend(q, k, v, dense)  # the fused kernel, as eager takes it for this mask
    expected.float().square().sum().backward()
    torch.testing.assert_close(out, expected)
    for got, want in zip(grads, (q.grad, k.grad, v.grad)):
        torch.testing.assert_close(got, want)
    math = attend(*(t.detach() for t in (q, k, v)), mask)  # eager on the mask as given
    torch.testing.assert_close(out, math, atol=2e-2, rtol=2e-2)


@CUDA
def test_dropout_in_the_fused_kernel_trains_and_refuses_double_backward():
    """Dropout draws inside the fused kernel; a double backward, which replays eager's math
    path, is refused by name rather than drawing other numbers."""
    q, k, v = qkv("cuda", torch.bfloat16)
    mask = padding_mask(2, 64, "cuda")
    compiled = aotgrad.compile(lambda q, k, v, m: attend(q, k, v, m, 0.5))
    out = compiled(q, k, v, mask)
    assert not torch.allclose(out, attend(q, k, v, mask))  # dropped out
    (g,) = torch.autograd.grad(out.float().sum(), q)
    assert torch.isfinite(g).all() and g.abs().sum() > 0
    with pytest.raises(NotImplementedError, match="aotgrad: double backward"):
        torch.autograd.grad(compiled(q, k, v, mask).float().sum(), q, create_graph=True)


@CUDA
def test_torch_compile_of_a_padded_attention_block_matches_eager():
    """Through Dynamo, with the mask built inside the compiled code, as transformers does."""
    torch.manual_seed(0)
    proj = torch.nn.Linear(64, 192, device="cuda")

    def block(x):
        b, t, _ = x.shape
        q, k, v = proj(x).view(b, t, 3, 4, 16).permute(2, 0, 3, 1, 4)
        out = attend(q, k, v, padding_mask(b, t, x.device))
        return out.transpose(1, 2).reshape(b, t, 64)

    x = torch.randn(2, 128, 64, device="cuda")
    with torch.autocast("cuda", torch.bfloat16):
        out = torch.compile(block, backend="aotgrad")(x)
    out.float().sum().backward()
    grad = proj.weight.grad.clone()
    proj.weight.grad = None
    with torch.autocast("cuda", torch.bfloat16):
        expected = block(x)
    expected.float().sum().backward()
    torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(grad, proj.weight.grad, atol=5e-2, rtol=5e-2)


@CUDA
def test_double_backward_without_dropout_replays_the_math_path_as_eager():
    """The replay runs eager's kernels (the math path, differentiable twice) where the
    forward ran the fused kernel; without dropout neither draws."""
    q, k, v = qkv("cuda", torch.float32)
    mask = padding_mask(2, 64, "cuda")

    def penalty(fn):
        (g,) = torch.autograd.grad(fn(q, k, v, mask).square().sum(), q, create_graph=True)
        (gg,) = torch.autograd.grad(g.square().sum(), k)
        return g, gg
    got = penalty(aotgrad.compile(attend))
    want = penalty(attend)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-3, rtol=1e-3)


def reference_grads(q, k, v, go, mask=None):
    """float64 math path: the gradients every kernel approximates."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return torch.autograd.grad(out, (q, k, v), go.double())


@CUDA
def test_cudnn_backward_is_right_whatever_the_gradients_layout_before_it():
    """torch 2.11's cuDNN attention backward keys its cached kernel without the gradient's
    strides: after one call, a gradient in another layout got wrong values. Our backward
    hands it the gradient in the output's layout (backends/passes.py), as eager's
    transformer blocks do; an eager call after ours, with that layout, stays right."""
    q, k, v = qkv("cuda", torch.bfloat16, b=3, h=2, t=96, d=64)  # shapes no other test uses
    if torch._fused_sdp_choice(q, k, v) != 3:
        pytest.skip("cuDNN attention is not SDPA's choice on this GPU")
    graphs = []
    compiled = aotgrad.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
                               backend=recording_backend(graphs))
    out = compiled(q, k, v)
    torch.manual_seed(1)
    base = torch.randn(out.shape, device="cuda", dtype=torch.bfloat16)
    layouts = {"contiguous": base.contiguous(),
               "like the output": torch.empty_like(out).copy_(base)}
    runs = [("aotgrad", compiled, "contiguous"), ("eager", None, "like the output"),
            ("aotgrad", compiled, "like the output"), ("eager", None, "like the output")]
    for name, fn, layout in runs:
        go = layouts[layout]
        out = (fn or (lambda q, k, v: F.scaled_dot_product_attention(q, k, v)))(q, k, v)
        got = torch.autograd.grad(out, (q, k, v), go)
        for g, want in zip(got, reference_grads(q, k, v, go)):
            torch.testing.assert_close(g.double(), want, atol=3e-2, rtol=3e-2,
                                       msg=f"{name}, gradient {layout}")


def _cudnn_backward_graph(grad_strides) -> torch.fx.GraphModule:
    """cuDNN attention's backward alone, on fake CUDA values (no GPU needed to rewrite it)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    shape, like_out = (2, 4, 64, 32), (8192, 32, 128, 1)
    with FakeTensorMode():
        def t(strides=like_out, size=shape, dtype=torch.bfloat16):
            return torch.empty_strided(size, strides, device="cuda", dtype=dtype)
        vals = {"grad": t(grad_strides), "q": t(), "k": t(), "v": t(), "out": t(),
                "lse": t((256, 64, 1), (2, 4, 64), torch.float32),
                "seed": torch.empty((), device="cuda", dtype=torch.int64),
                "offset": torch.empty((), device="cuda", dtype=torch.int64)}
    graph = torch.fx.Graph()
    nodes = {}
    for name, val in vals.items():
        nodes[name] = graph.placeholder(name)
        nodes[name].meta["val"] = val
    op = torch.ops.aten._scaled_dot_product_cudnn_attention_backward.default
    args = [nodes[n] for n in ("grad", "q", "k", "v", "out", "lse", "seed", "offset")]
    backward = graph.call_function(op, (*args, None, None, None, 64, 64, 0.0, False))
    graph.output((backward,))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


@pytest.mark.parametrize("strides, copied", [((8192, 2048, 32, 1), True),
                                             ((8192, 32, 128, 1), False)],
                         ids=["contiguous gradient", "gradient like the output"])
def test_cudnn_backward_gets_its_gradient_laid_out_like_its_output(strides, copied):
    gm = _cudnn_backward_graph(strides)
    attention_grads_laid_like_outputs(gm)
    backward = next(n for n in gm.graph.nodes if "cudnn" in str(n.target))
    grad, out = backward.args[0], backward.args[4]
    assert (grad.op == "call_function") is copied, gm.code
    assert grad.meta["val"].stride() == out.meta["val"].stride()


# ---- constant masks folded in Dynamo's graph (kernel_choice.fold_constant_masks) -------------

def attention_calls(gm) -> list[tuple[bool, bool]]:
    """(is_causal, has a mask) of each fused attention op of an ATen graph."""
    calls = []
    for node in gm.graph.nodes:
        if node.op == "call_function" and "_scaled_dot_product" in str(node.target):
            names = [a.name for a in node.target._schema.arguments]
            bound = {**dict(zip(names, node.args)), **node.kwargs}
            mask = bound.get("attn_mask", bound.get("attn_bias"))
            calls.append((bool(bound.get("is_causal", False)), mask is not None))
    return calls


def through_dynamo(fn, *args, dynamic=False):
    """fn's outputs and the gradients of their sum, compiled, with the forward graph."""
    graphs = []
    compiled = torch.compile(fn, backend=aotgrad.backend(backend=recording_backend(graphs)),
                             dynamic=dynamic)
    torch._dynamo.reset()
    return run_and_grads(compiled, *args), graphs[0]


def run_and_grads(fn, *args):
    outs = fn(*args)
    outs = outs if isinstance(outs, tuple) else (outs,)
    grads = torch.autograd.grad(sum(o.sum() for o in outs), args)
    return [o.detach() for o in outs], grads


def attend_with(make_mask, q_len=None):
    """Self-attention over x's projection with the mask `make_mask(i_q, i_k, x)` built from
    positions, as transformers builds its masks under Dynamo."""
    def block(x, w):
        b, t, _ = x.shape
        q, k, v = (x @ w).view(b, t, 3, 2, 8).permute(2, 0, 3, 1, 4)
        q = q if q_len is None else q[:, :, -q_len:]
        i_q = torch.arange(t - q.shape[2], t, device=x.device)[:, None]
        i_k = torch.arange(t, device=x.device)[None, :]
        mask = make_mask(i_q, i_k, x)[None, None].expand(b, 1, q.shape[2], t)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return block


def block_inputs():
    torch.manual_seed(0)
    return torch.randn(2, 16, 16, requires_grad=True), torch.randn(16, 48, requires_grad=True)


CONSTANT_MASKS = {  # name: (mask, the call's (is_causal, has a mask) once compiled)
    "causal": (lambda i, j, x: j <= i, (True, False)),
    "all true": (lambda i, j, x: (j >= 0) & (i >= 0), (False, False)),
    "sliding window": (lambda i, j, x: (j <= i) & (i - j < 4), (False, True)),
    "from an input": (lambda i, j, x: (j <= i) & (x[0, :, :1] > -10).T, (False, True)),
    "drawn": (lambda i, j, x: (j <= i) & (torch.rand(16, device=x.device) >= 0), (False, True)),
    "float": (lambda i, j, x: torch.zeros(i.shape[0], j.shape[1], device=x.device), (False, True)),
    "through floats": (lambda i, j, x: j.float() * 0.5 <= i.float() * 0.5, (False, True)),
}


@pytest.mark.parametrize("name", list(CONSTANT_MASKS))
def test_a_constant_mask_is_folded_into_the_call_and_nothing_else(name):
    """All true: no mask; SDPA's own causal mask: is_causal=True. Not a mask read from an
    input, drawn at random (folding it away would move the generator), of other values, a
    float one or one computed through floats (autocast could round them otherwise). Values
    and gradients as eager's either way."""
    make_mask, expected = CONSTANT_MASKS[name]
    block = attend_with(make_mask)
    torch.manual_seed(1)
    (outs, grads), graph = through_dynamo(block, *block_inputs())
    torch.manual_seed(1)
    want_outs, want_grads = run_and_grads(block, *block_inputs())
    assert attention_calls(graph) == [expected], graph.code
    for got, want in zip((*outs, *grads), (*want_outs, *want_grads)):
        torch.testing.assert_close(got, want)


def test_a_mask_read_from_uninitialized_memory_stays():
    """Its values are whatever `empty` left: not the same two runs apart (eager's neither)."""
    block = attend_with(lambda i, j, x: (j <= i) | torch.empty_like(j <= i))
    _, graph = through_dynamo(block, *block_inputs())
    assert attention_calls(graph) == [(False, True)], graph.code


@pytest.mark.parametrize("empty", [
    lambda: torch.empty(6, 6, dtype=torch.bool),
    lambda: torch.empty_like(torch.ones(6, 6, dtype=torch.bool)),
    lambda: torch.empty_permuted((6, 6), (1, 0), dtype=torch.bool),  # was taken as pure
])
def test_every_uninitialized_allocation_is_impure(empty):
    """`empty_permuted` reaches the mode as itself: a mask read from it was evaluated (its
    garbage at compile time folded in, when all set or causal). The garbage is not
    reproducible, so the check itself is tested."""
    from aotgrad.capture.kernel_choice import _PureOps
    with _PureOps() as ops:
        empty()
    assert not ops.pure


def test_a_causal_mask_aligned_bottom_right_stays():
    """Fewer queries than keys, each query the last positions (a cache's): the mask is
    aligned bottom right, SDPA's is_causal top left. Not folded."""
    block = attend_with(lambda i, j, x: j <= i, q_len=4)
    (outs, grads), graph = through_dynamo(block, *block_inputs())
    assert attention_calls(graph) == [(False, True)], graph.code
    want_outs, want_grads = run_and_grads(block, *block_inputs())
    for got, want in zip((*outs, *grads), (*want_outs, *want_grads)):
        torch.testing.assert_close(got, want)


def test_a_mask_of_symbolic_shape_stays():
    block = attend_with(lambda i, j, x: j <= i)
    (outs, grads), graph = through_dynamo(block, *block_inputs(), dynamic=True)
    assert attention_calls(graph) == [(False, True)], graph.code
    want_outs, _ = run_and_grads(block, *block_inputs())
    torch.testing.assert_close(outs[0], want_outs[0])


def _written_mask(write):
    """A mask built as all ones (or causal), then written into before the call: Dynamo's
    graph passes SDPA the node of `torch.ones`, the write a separate user of it."""
    def block(q, k, v):
        t = q.shape[-2]
        mask = torch.ones(t, t, dtype=torch.bool)
        write(mask)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return block


def _index_put(mask):
    mask.index_put_((torch.tensor([0]), torch.tensor([3])), torch.tensor(False))


WRITTEN_MASKS = {
    "setitem": lambda m: m.__setitem__((slice(None), 0), False),
    "masked_fill_": lambda m: m.masked_fill_(torch.ones_like(m).triu(1), False),
    "tril_": lambda m: m.tril_(),
    "through a view": lambda m: m.view(-1)[1:3].fill_(False),
    "index_put_": _index_put,
}


@pytest.mark.parametrize("name", list(WRITTEN_MASKS))
def test_a_mask_written_in_place_before_the_call_stays(name):
    """The write is no node that computes the mask, so evaluating those gave `ones`: folded
    to no mask, the user's edits lost (out 1.26 off eager's for masked_fill_, gradients 2.0).
    A tensor written anywhere in the graph is not folded."""
    block = _written_mask(WRITTEN_MASKS[name])
    torch.manual_seed(0)
    args = [torch.randn(2, 2, 6, 4, requires_grad=True) for _ in range(3)]
    (outs, grads), graph = through_dynamo(block, *args)
    want_outs, want_grads = run_and_grads(block, *args)
    assert attention_calls(graph) == [(False, True)], graph.code
    for got, want in zip((*outs, *grads), (*want_outs, *want_grads)):
        torch.testing.assert_close(got, want)


def _growing_mask_block(kind):
    def block(q, k, v):
        mask = torch.ones(2, 6, 6, dtype=torch.bool)
        mask = mask.tril() if kind == "causal" else mask
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return block


@pytest.mark.parametrize("kind", ["all true", "causal"])
def test_a_mask_that_would_grow_the_output_stays(kind):
    """A constant mask of more dimensions than 3-d inputs (or larger where they have size 1).
    Folded away, the call returned the inputs' [6, 4] where the trace with the mask (as
    for a mask from an input) gives [2, 6, 4]: the fold changed the output's shape. Not
    folded."""
    args = [torch.randn(6, 4, requires_grad=True) for _ in range(3)]
    (outs, _), graph = through_dynamo(_growing_mask_block(kind), *args)
    # 3-d inputs take the math path: the mask stays as the `ones` that builds it
    assert "aten.ones.default([2, 6, 6]" in graph.code, graph.code
    assert outs[0].shape == (2, 6, 4)


@pytest.mark.xfail(strict=True, reason="eager's SDPA raises ('output with shape [6, 6] "
                   "doesn't match the broadcast shape [2, 6, 6]'); ours broadcasts the output to "
                   "[2, 6, 4], as with a mask from an input: not the fold's doing")
def test_a_mask_that_would_grow_the_output_raises_as_eager():
    block = _growing_mask_block("all true")
    args = [torch.randn(6, 4, requires_grad=True) for _ in range(3)]
    with pytest.raises(RuntimeError, match="broadcast shape"):
        block(*args)
    compiled = torch.compile(block, backend=aotgrad.backend(backend="eager"))
    torch._dynamo.reset()
    with pytest.raises(Exception, match="broadcast shape"):
        compiled(*args)


def test_a_static_causal_mask_with_symbolic_queries_compiles_as_eager():
    """dynamic=True, the mask of a constant size: building SDPA's causal mask from the
    queries' symbolic length raised out of the compile (BackendCompilerFailed)."""
    def block(q, k, v):
        mask = torch.ones(6, 6, dtype=torch.bool).tril()
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.manual_seed(0)
    args = [torch.randn(2, 2, 6, 4, requires_grad=True) for _ in range(3)]
    (outs, grads), _ = through_dynamo(block, *args, dynamic=True)
    want_outs, want_grads = run_and_grads(block, *args)
    for got, want in zip((*outs, *grads), (*want_outs, *want_grads)):
        torch.testing.assert_close(got, want)
