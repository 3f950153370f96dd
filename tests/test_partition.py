"""Partition invariants, and `verify` catching graphs that break them."""

import pytest
import torch
from torch import fx

import aotgrad
from aotgrad.compat import aot_function, nop
from aotgrad.partition.split import default_partition, joint_of, split_joint
from aotgrad.verify import GraphInvariantError, verify, verify_partition


def mlp(x, w1, w2):
    return (torch.nn.functional.gelu(x @ w1) @ w2).relu().sum()


def layer_norm_attention(x, w):
    q = torch.nn.functional.layer_norm(x @ w, (8,))
    return torch.nn.functional.scaled_dot_product_attention(q, q, q).sum()


FUNCTIONS = [mlp, layer_norm_attention]
ARGS = {
    mlp: lambda: (torch.randn(4, 8), torch.randn(8, 16, requires_grad=True),
                  torch.randn(16, 8, requires_grad=True)),
    layer_norm_attention: lambda: (torch.randn(2, 4, 8), torch.randn(8, 8, requires_grad=True)),
}


def artifact(fn, partitioner=default_partition):
    compiled = aotgrad.compile(fn, backend="eager", partitioner=partitioner)
    compiled(*ARGS[fn]())
    return compiled.artifacts[0]


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
def test_partition_holds_invariants(fn):
    a = artifact(fn)
    verify(a.joint_graph)
    verify_partition(a.forward_graph, a.backward_graph, a.info.num_graph_outputs)


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
def test_forward_and_backward_recompose_the_joint(fn):
    """Running forward then backward gives what the joint graph gives."""
    a = artifact(fn)
    args = ARGS[fn]()
    n = a.info.num_graph_outputs
    tangents = [torch.ones(())]
    joint_out = a.joint_graph(*args, *tangents)
    fw_out = a.forward_graph(*args)
    grads = a.backward_graph(*fw_out[n:], *tangents)
    for x, y in zip(joint_out, list(fw_out[:n]) + list(grads)):
        if x is None:
            assert y is None
        else:
            torch.testing.assert_close(x, y)


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
def test_default_partition_recomputes_nothing(fn):
    a = artifact(fn)
    fw_ops = {n.name for n in a.forward_graph.graph.nodes if n.op == "call_function"}
    bw_ops = {n.name for n in a.backward_graph.graph.nodes if n.op == "call_function"}
    assert not fw_ops & bw_ops



def _einsum(x, w):
    return torch.einsum("bij,jk->bik", x, w).pow(2).sum()


@pytest.mark.parametrize("door", ["compile", "compat"])
def test_default_partition_saves_nothing_a_dead_op_alone_reads(door):
    """einsum's trace leaves a `permute` of an input's view that nothing reads; the default
    partition counted it as a backward op and saved that view, which the pruned backward
    never reads: GraphInvariantError at the first call, where eager runs (found through
    `compat.aot_function(fn, nop)`)."""
    x, w = torch.randn(2, 3, 4, requires_grad=True), torch.randn(4, 3, requires_grad=True)
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    compiled = (aotgrad.compile(_einsum, backend="eager", partitioner=default_partition)
                if door == "compile" else aot_function(_einsum, nop))
    out = compiled(x2, w2)
    out.backward()
    expected = _einsum(x, w)
    expected.backward()
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close((x2.grad, w2.grad), (x.grad, w.grad))

def test_tuple_results_are_saved_by_element():
    a = artifact(layer_norm_attention)
    for value in list(a.forward_graph.graph.output_node().args[0]):
        assert isinstance(value.meta["val"], torch.Tensor)


def test_split_joint_with_explicit_saved_set():
    a = artifact(mlp)
    primals = joint_of(a.joint_graph, a.info.num_graph_outputs).primals
    # Saving only the primals forces the backward to recompute everything.
    fw, bw = split_joint(a.joint_graph, a.info.num_graph_outputs, primals)
    verify_partition(fw, bw, a.info.num_graph_outputs)


def _graph(build):
    graph = fx.Graph()
    build(graph)
    gm = fx.GraphModule(torch.nn.Module(), graph)
    for node in graph.nodes:
        node.meta.setdefault("val", torch.empty(2))
    return gm


def test_verify_rejects_mutation():
    def build(g):
        x = g.placeholder("primals_1")
        y = g.call_function(torch.ops.aten.mul.Tensor, (x, 2))
        g.output([g.call_function(torch.ops.aten.add_.Tensor, (y, x))])
    with pytest.raises(GraphInvariantError, match="mutates"):
        verify(_graph(build))


def test_verify_allows_trailing_input_copy_only_when_asked():
    def build(g):
        x = g.placeholder("primals_1")
        y = g.call_function(torch.ops.aten.mul.Tensor, (x, 2))
        g.call_function(torch.ops.aten.copy_.default, (x, y))
        g.output([y])
    verify(_graph(build))
    with pytest.raises(GraphInvariantError):
        verify(_graph(build), allow_input_mutation=False)


def test_verify_rejects_missing_fake_value():
    def build(g):
        x = g.placeholder("primals_1")
        g.output([g.call_function(torch.ops.aten.neg.default, (x,))])
    gm = _graph(build)
    del next(iter(gm.graph.nodes)).meta["val"]
    with pytest.raises(GraphInvariantError, match="meta"):
        verify(gm)


def test_verify_partition_rejects_unused_saved_value():
    def forward(g):
        x = g.placeholder("primals_1")
        y = g.call_function(torch.ops.aten.neg.default, (x,))
        g.output([y, y])

    def backward(g):
        g.placeholder("neg")
        t = g.placeholder("tangents_1")
        g.output([g.call_function(torch.ops.aten.neg.default, (t,))])
    with pytest.raises(GraphInvariantError, match="never read"):
        verify_partition(_graph(forward), _graph(backward), 1)


def _dropout_twice(x, w):  # functionalized trace: native_dropout
    return torch.nn.functional.dropout(torch.nn.functional.dropout(x @ w, 0.3) @ w, 0.3).sum()


def _rand_like(x, w):  # the plain trace (capture/pure.py): rand_like
    h = torch.nn.functional.gelu(x @ w)
    return (h + torch.rand_like(h)).sin().sum()


@pytest.mark.parametrize("fn", [_dropout_twice, _rand_like])
def test_torch_default_partition_keeps_random_ops_in_the_forward(fn):
    # torch's default_partition finds the forward by the tag torch's AOTAutograd puts on the
    # forward's ops; untagged, it moved the random ops to the backward, which drew new
    # numbers: gradients silently differed from eager's.
    from functorch.compile import default_partition as torch_default_partition
    x, w = torch.randn(4, 4), torch.randn(4, 4, requires_grad=True)
    compiled = aotgrad.compile(fn, backend="eager", partitioner=torch_default_partition)
    torch.manual_seed(3)
    expected = torch.autograd.grad(fn(x, w), w)[0]
    torch.manual_seed(3)
    got = torch.autograd.grad(compiled(x, w), w)[0]
    torch.testing.assert_close(got, expected)
