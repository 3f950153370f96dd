"""Common subexpression elimination (aotgrad/capture/cse.py): repeated pure work merges, and nothing
that would make eager's tensors differ does."""

import operator

import torch
import torch.nn.functional as F
from torch import fx

import aotgrad
from aotgrad.capture.cse import eliminate_common_subexpressions

aten = torch.ops.aten


def count(gm, op):
    return sum(n.target == op for n in gm.graph.nodes)


def test_a_mask_built_in_every_layer_is_computed_and_saved_once():
    def layers(x, w):
        h = x
        for _ in range(3):
            keep = torch.sigmoid(x @ w) > 0.5  # the same in every layer
            h = torch.where(keep, h @ w, 0.0)
        return h.sum()

    x, w = torch.randn(8, 8), torch.randn(8, 8, requires_grad=True)
    compiled = aotgrad.compile(layers, backend="eager")
    w2 = w.detach().clone().requires_grad_()
    compiled(x, w).backward()
    layers(x, w2).backward()
    torch.testing.assert_close(w.grad, w2.grad)
    art = compiled.artifacts[0]
    assert count(art.forward_graph, aten.gt.Scalar) == 1
    assert sum(s.op == "aten.gt.Scalar" for s in art.saved) == 1


def test_equal_outputs_stay_distinct_tensors():
    compiled = aotgrad.compile(lambda x: (x * 2, x * 2), backend="eager")
    a, b = compiled(torch.randn(4, requires_grad=True))
    assert a.data_ptr() != b.data_ptr()
    a.detach().add_(1)
    assert not torch.equal(a, b)


def test_equal_gradients_stay_distinct_tensors():
    compiled = aotgrad.compile(lambda x, y: (x * 3).sum() + (y * 3).sum(), backend="eager")
    x, y = torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)
    compiled(x, y).backward()
    assert x.grad.data_ptr() != y.grad.data_ptr()


def test_random_ops_are_never_merged():
    compiled = aotgrad.compile(lambda x: (F.dropout(x, 0.5) - F.dropout(x, 0.5)).abs().sum(),
                               backend="eager")
    x = torch.ones(1000, requires_grad=True)
    assert compiled(x) > 0  # two different masks; one merged mask would give exactly 0


def test_signed_zeros_and_views_are_not_merged():
    graph = fx.Graph()
    x = graph.placeholder("x")
    pos = graph.call_function(aten.full.default, ([2], 0.0))
    neg = graph.call_function(aten.full.default, ([2], -0.0))
    v1 = graph.call_function(aten.view.default, (x, [2]))
    v2 = graph.call_function(aten.view.default, (x, [2]))
    same1 = graph.call_function(aten.mul.Tensor, (v1, pos))
    same2 = graph.call_function(aten.mul.Tensor, (v1, pos))
    total = graph.call_function(aten.add.Tensor, (same1, same2))
    graph.output((graph.call_function(aten.div.Tensor, (total, neg)), v2))
    gm = eliminate_common_subexpressions(fx.GraphModule({}, graph))
    assert count(gm, aten.full.default) == 2
    assert count(gm, aten.view.default) == 2
    assert count(gm, aten.mul.Tensor) == 1


def test_a_shared_value_viewed_again_in_every_layer_is_computed_once():
    """DeBERTa views its shared relative positions again in each layer: the views merge, and
    with them every op after them (12 copies of each position clamp before)."""
    def layers(x, positions):
        h = x
        for _ in range(3):
            index = (positions.unsqueeze(0) + 2).clamp(0, 7)  # the same in every layer
            h = h @ h.T + torch.gather(h, 1, index.expand(8, 8))
        return h.sum()

    x, positions = torch.randn(8, 8, requires_grad=True), torch.randint(-4, 4, (8,))
    compiled = aotgrad.compile(layers, backend="eager")
    (got,), (want,) = (torch.autograd.grad(f(x, positions), x) for f in (compiled, layers))
    torch.testing.assert_close(got, want)
    forward = compiled.artifacts[0].forward_graph
    assert count(forward, aten.unsqueeze.default) == 1
    assert count(forward, aten.clamp.default) == 1


def test_views_do_not_merge_in_a_graph_that_writes():
    """A write through one of two equal views is seen by the other only if they stay two."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    v1 = graph.call_function(aten.view.default, (x, [2]))
    v2 = graph.call_function(aten.view.default, (x, [2]))
    graph.call_function(aten.add_.Tensor, (v1, 1.0))
    graph.output((graph.call_function(aten.mul.Tensor, (v2, 2.0)),))
    gm = eliminate_common_subexpressions(fx.GraphModule({}, graph))
    assert count(gm, aten.view.default) == 2


def test_a_normalized_value_is_one_node_for_both_sides_of_the_joint():
    """A decomposed layer norm's backward computes `(x - mean) * rstd` again: that merges
    with the forward's, so the partitioner may save it (issue 20). Other twins across the
    sides stay apart: GELU's backward keeps its own `erf`."""
    from test_remat import inductor_decomposed_eager
    x, y = torch.randn(32, 64, requires_grad=True), torch.randn(32, 64, requires_grad=True)
    w, b = torch.randn(64, requires_grad=True), torch.randn(64, requires_grad=True)
    compiled = aotgrad.compile(lambda x, y, w, b: F.gelu(F.layer_norm(x + y, (64,), w, b)).sum(),
                               backend=inductor_decomposed_eager())
    compiled(x, y, w, b).backward()
    joint = compiled.artifacts[0].joint_graph
    centred = [n for n in joint.graph.nodes if n.target == aten.sub.Tensor
               and any(a.target is operator.getitem for a in n.all_input_nodes)]
    assert len(centred) == 1
    assert count(joint, aten.erf.default) == 2
