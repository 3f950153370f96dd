"""The peak-memory model against peaks computed by hand."""

import torch
from torch import fx

import aotgrad
from aotgrad.partition.memory import MemoryEstimate, estimate_peak, tensor_bytes
from aotgrad.partition.split import default_partition

aten = torch.ops.aten


def graph_module(build) -> fx.GraphModule:
    """A graph built by `build(graph, value)`, where `value(numel)` is a float32 fake value."""
    graph = fx.Graph()
    build(graph, lambda numel: torch.empty(numel))
    return fx.GraphModule(torch.nn.Module(), graph)


def node(graph, target, args, val):
    n = graph.call_function(target, args)
    n.meta["val"] = val
    return n


def placeholder(graph, name, val):
    n = graph.placeholder(name)
    n.meta["val"] = val
    return n


def forward(g, v):
    """x (400 B) -> a = sin(x) (400, saved) -> b = a * 2 (400) -> s = sum(b) (4)."""
    x = placeholder(g, "primals_1", v(100))
    a = node(g, aten.sin.default, (x,), v(100))
    b = node(g, aten.mul.Tensor, (a, 2), v(100))
    s = node(g, aten.sum.default, (b,), v(1))
    g.output([s, a])


def backward(g, v):
    """t (4 B) -> e = expand(t) (a view) -> g1 = e * 2 -> c = cos(a) -> grad = g1 * c."""
    a = placeholder(g, "sin", v(100))
    t = placeholder(g, "tangents_1", v(1))
    e = node(g, aten.expand.default, (t, [100]), torch.empty(1).expand(100))
    g1 = node(g, aten.mul.Tensor, (e, 2), v(100))
    c = node(g, aten.cos.default, (a,), v(100))
    grad = node(g, aten.mul.Tensor, (g1, c), v(100))
    g.output([grad])


def test_peak_matches_hand_computation():
    fw, bw = graph_module(forward), graph_module(backward)
    # forward: x 400 alive; sin +400 = 800 (a is saved: written out); b = a * 2 is read
    # only by the sum, which computes it inside (no allocation); sum +4 = 804 (peak).
    # backward: starts with x 400 + s 4 (user output) + a 400 + t 4 = 808; expand is a view
    # of t (no allocation); g1 and c are read only by the pointwise grad, which a fusing
    # backend computes them inside (no allocation); grad +400 = 1208 (peak), reading t and a
    # through them, which are then freed -> 804.
    assert estimate_peak(fw, bw, 1) == MemoryEstimate(
        input_bytes=400, saved_bytes=400, forward_peak_bytes=804, backward_peak_bytes=1208)
    assert estimate_peak(fw, bw, 1).peak_bytes == 1208


def test_a_backward_value_a_matmul_reads_has_a_buffer():
    """Fusion stops at an op that is no pointwise op or reduction: c = cos(a) is written out
    for the matmul that reads it, and g1 is still fused into grad."""
    def bw_build(g, v):
        a = placeholder(g, "sin", torch.empty(10, 10))
        t = placeholder(g, "tangents_1", v(1))
        e = node(g, aten.expand.default, (t, [10, 10]), torch.empty(1).expand(10, 10))
        g1 = node(g, aten.mul.Tensor, (e, 2), torch.empty(10, 10))
        c = node(g, aten.cos.default, (a,), torch.empty(10, 10))
        m = node(g, aten.mm.default, (c, c), torch.empty(10, 10))
        grad = node(g, aten.mul.Tensor, (g1, m), torch.empty(10, 10))
        g.output([grad])

    def fw_build(g, v):
        x = placeholder(g, "primals_1", torch.empty(10, 10))
        a = node(g, aten.sin.default, (x,), torch.empty(10, 10))
        s = node(g, aten.sum.default, (a,), v(1))
        g.output([s, a])
    m = estimate_peak(graph_module(fw_build), graph_module(bw_build), 1)
    # backward: x 400 + s 4 + a 400 + t 4 = 808; c +400 = 1208, then a is freed -> 808;
    # m +400 = 1208, then c -> 808; grad +400 = 1208 (g1 fused into it).
    assert m.backward_peak_bytes == 1208
    bw = graph_module(bw_build)
    fused = aotgrad.partition.memory.fused_in_kernels(list(bw.graph.nodes))
    # g1 = e * 2 alone: c (cos) is read by the matmul, grad is returned
    assert [n.args[0].target for n in fused] == [aten.expand.default]


def test_a_saved_view_keeps_its_whole_base_alive():
    """Saving a[:10] (40 B) keeps all of a (400 B) until the backward reads the view."""
    def fw_build(g, v):
        x = placeholder(g, "primals_1", v(100))
        a = node(g, aten.sin.default, (x,), v(100))
        head = node(g, aten.slice.Tensor, (a, 0, 0, 10), torch.empty(100)[:10])
        s = node(g, aten.sum.default, (a,), v(1))
        g.output([s, head])

    def bw_build(g, v):
        head = placeholder(g, "slice_1", torch.empty(100)[:10])
        t = placeholder(g, "tangents_1", v(1))
        grad = node(g, aten.mul.Tensor, (head, t), v(10))
        g.output([grad])
    m = estimate_peak(graph_module(fw_build), graph_module(bw_build), 1)
    assert m.saved_bytes == 400  # the base's buffer, not the view's 40 bytes
    # backward: x 400 + s 4 + a 400 + t 4 = 808, then grad +40 = 848
    assert m.backward_peak_bytes == 848


def test_elements_of_a_view_op_share_its_base():
    """split returns views: its elements allocate nothing."""
    def fw_build(g, v):
        x = placeholder(g, "primals_1", v(100))
        parts = node(g, aten.split.Tensor, (x, 50), [torch.empty(50), torch.empty(50)])
        first = node(g, __import__("operator").getitem, (parts, 0), torch.empty(50))
        s = node(g, aten.sum.default, (first,), v(1))
        g.output([s])

    def bw_build(g, v):
        t = placeholder(g, "tangents_1", v(1))
        g.output([node(g, aten.expand.default, (t, [100]), torch.empty(1).expand(100))])
    m = estimate_peak(graph_module(fw_build), graph_module(bw_build), 1)
    assert m.forward_peak_bytes == 404  # x, and the 4-byte sum


def test_estimate_of_a_compiled_function():
    """f(x) = (x.sin() * 2).sum() as traced; default partition saves cos(x)'s input."""
    compiled = aotgrad.compile(lambda x: (x.sin() * 2).sum(), backend="eager",
                               partitioner=default_partition)
    x = torch.randn(100, requires_grad=True)
    compiled(x).backward()
    a = compiled.artifacts[0]
    m = estimate_peak(a.forward_graph, a.backward_graph, a.info.num_graph_outputs)
    assert m.input_bytes == tensor_bytes(x) == 400
    # the forward holds x and the 4-byte loss: sin(x) * 2 is computed inside the sum
    assert m.forward_peak_bytes == 404
    # the backward ends holding x, the loss and x's gradient
    assert m.backward_peak_bytes >= 400 + 4 + 400


def test_a_chain_of_graphs_holds_what_the_earlier_ones_keep():
    """A model split at a graph break: the second graph runs (forward and backward) while
    the first holds its inputs and saved values."""
    first = MemoryEstimate(input_bytes=400, saved_bytes=400, forward_peak_bytes=1204,
                           backward_peak_bytes=1604)
    small = MemoryEstimate(input_bytes=100, saved_bytes=50, forward_peak_bytes=300,
                           backward_peak_bytes=500)
    large = MemoryEstimate(input_bytes=100, saved_bytes=50, forward_peak_bytes=300,
                           backward_peak_bytes=1500)
    assert aotgrad.partition.memory.chain_peak([first]) == 1604
    assert aotgrad.partition.memory.chain_peak([first, small]) == 1604  # the first's backward
    assert aotgrad.partition.memory.chain_peak([first, large]) == 400 + 400 + 1500


def test_inductor_writes_out_a_value_read_twice_that_reads_too_many_buffers():
    """`realized_on_reuse`: a value inlined into two readers that, with what it inlines,
    reads five buffers is written out; one reading four, or read once, is not; a value made
    from no tensor (`full`) and a view read no buffer of their own."""
    from aotgrad.partition.memory import fused_in_kernels, realized_on_reuse

    def build(reads, readers):
        def body(g, v):
            inputs = [placeholder(g, f"primals_{i}", v(8)) for i in range(reads)]
            value = node(g, aten.mul.Tensor, (inputs[0], node(g, aten.full.default, ([8], 1.0),
                                                                v(8))), v(8))
            for i in inputs[1:]:
                value = node(g, aten.add.Tensor, (node(g, aten.view.default, (i, [8]), v(8)),
                                                  value), v(8))
            g.output([node(g, aten.sum.default, (node(g, aten.sin.default, (value,), v(8)),), v(1))
                      for _ in range(readers)])
        nodes = list(graph_module(body).graph.nodes)
        return {n.target for n in realized_on_reuse(nodes, fused_in_kernels(nodes))}

    assert build(reads=5, readers=2) == {aten.add.Tensor}
    assert build(reads=4, readers=2) == set()
    assert build(reads=5, readers=1) == set()
