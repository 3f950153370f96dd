"""The min-cut partitioner: invariants, eager parity, bytes saved, checkpoint policies.

Every partition is checked with `verify_partition`; every compiled model against eager
(outputs and gradients, on identical copies)."""

import contextlib
import copy
import functools
import itertools
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.utils.checkpoint import (CheckpointPolicy, checkpoint,
                                    create_selective_checkpoint_contexts)

import aotgrad
from aotgrad.partition.flow import FlowNetwork
from aotgrad.partition.split import default_partition, joint_of
from aotgrad.partition.remat import Rule, forward_rules, min_cut_rematerialization_partition
from aotgrad.partition.schedule import as_early_as_possible, just_in_time_order
from aotgrad.verify import verify_partition

aten = torch.ops.aten


# ---- models ---------------------------------------------------------------------------------

class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(16, 64), nn.Linear(64, 64), nn.Linear(64, 4)

    def forward(self, x):
        return self.c(F.relu(self.b(F.gelu(self.a(x))))).sum()


class AttentionBlock(nn.Module):
    """LayerNorm, then attention (scaled_dot_product_attention)."""

    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads, self.ln, self.qkv, self.proj = heads, nn.LayerNorm(d), nn.Linear(d, 3 * d), \
            nn.Linear(d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2)
                   for t in self.qkv(self.ln(x)).split(d, dim=-1))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.proj(a.transpose(1, 2).reshape(b, s, d))


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn, self.conv2 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), \
            nn.Conv2d(8, 4, 3)

    def forward(self, x):
        return self.conv2(F.relu(self.bn(self.conv1(x)))).mean()


class TransformerBlock(AttentionBlock):
    """Pre-norm attention plus an MLP with tanh-GELU, as in GPT-2."""

    def __init__(self, d=32, heads=4):
        super().__init__(d, heads)
        self.ln2, self.fc, self.out = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        x = super().forward(x)
        return (x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))).pow(2).mean()


MODELS = {
    "mlp": (MLP, lambda: torch.randn(8, 16)),
    "attention": (lambda: _Loss(AttentionBlock()), lambda: torch.randn(2, 8, 32)),
    "conv_bn": (ConvBN, lambda: torch.randn(2, 3, 8, 8)),
    "transformer": (TransformerBlock, lambda: torch.randn(2, 8, 32)),
}


class _Loss(nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x):
        return self.module(x).sum()


PARTITIONS = {
    "min_cut": {},
    "budget_0": {"memory_budget": 0.0},
    "budget_0.5": {"memory_budget": 0.5},
    "budget_1": {"memory_budget": 1.0},
}


def compile_model(name, **options):
    """(compiled, eager twin, input), the model built under a fixed seed."""
    build, inputs = MODELS[name]
    torch.manual_seed(0)
    model = build()
    twin = copy.deepcopy(model)
    torch.manual_seed(1)
    return aotgrad.compile(model, backend="eager", **options), twin, inputs()


def saved_bytes(artifact):
    return sum(s.nbytes for s in artifact.saved if s.op != "placeholder")


# ---- partitions of real models --------------------------------------------------------------

@pytest.mark.parametrize("partition", PARTITIONS)
@pytest.mark.parametrize("model", MODELS)
def test_partition_matches_eager_and_holds_invariants(model, partition):
    compiled, eager, x = compile_model(model, **PARTITIONS[partition])
    for _ in range(2):  # the second call reuses the compiled graphs
        compiled.zero_grad()
        eager.zero_grad()
        out, expected = compiled(x), eager(x)
        out.backward()
        expected.backward()
        torch.testing.assert_close(out, expected)
        for (name, p), q in zip(compiled.named_parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad, msg=name)
        for b, c in zip(compiled.buffers(), eager.buffers()):
            torch.testing.assert_close(b, c)  # BatchNorm's running statistics
    a = compiled.artifacts[0]
    verify_partition(a.forward_graph, a.backward_graph, a.info.num_graph_outputs)


@pytest.mark.parametrize("model", MODELS)
def test_min_cut_saves_no_more_than_default_partition(model):
    mincut = compile_model(model)[0]
    default = compile_model(model, partitioner=default_partition)[0]
    for c in (mincut, default):
        c(MODELS[model][1]()).backward()
    assert saved_bytes(mincut.artifacts[0]) <= saved_bytes(default.artifacts[0])


def test_min_cut_saves_less_than_default_on_a_pointwise_chain():
    """Saving the input of a chain of pointwise ops beats saving each op's result."""
    def f(x):
        return x.sin().cos().exp().tanh().sum()
    x = torch.randn(64, requires_grad=True)
    sizes = {}
    for name, partitioner in [("min_cut", None), ("default", default_partition)]:
        c = aotgrad.compile(f, backend="eager", partitioner=partitioner)
        c(x).backward()
        sizes[name] = saved_bytes(c.artifacts[0])
    assert sizes["min_cut"] == 0 < sizes["default"]  # min-cut saves the input alone


def test_min_cut_is_the_default_and_exported_with_functorch_signature():
    from aotgrad import compat
    assert compat.min_cut_rematerialization_partition is min_cut_rematerialization_partition
    compiled = compat.aot_function(lambda x: x.sin().cos().sum(), fw_compiler=compat.nop,
                                   partition_fn=min_cut_rematerialization_partition)
    x = torch.randn(5, requires_grad=True)
    compiled(x).backward()
    torch.testing.assert_close(x.grad, -torch.sin(x.sin()) * x.cos())


def test_expensive_and_random_values_are_never_recomputed():
    def f(x, w):
        y = F.dropout(x @ w, 0.5, training=True)
        return (y.sin() @ w).sum()
    x, w = torch.randn(8, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)
    compiled = aotgrad.compile(f, backend="eager")
    torch.manual_seed(0)
    compiled(x, w).backward()
    bw = compiled.artifacts[0].backward_graph
    recomputed = {n.target for n in bw.graph.nodes if n.op == "call_function"}
    assert aten.mm.default in recomputed  # the gradients' own matmuls
    fw_ops = [n for n in compiled.artifacts[0].forward_graph.graph.nodes
              if n.op == "call_function"]
    bw_names = {n.name for n in bw.graph.nodes}
    for node in fw_ops:
        if node.target in (aten.mm.default, aten.native_dropout.default):
            assert node.name not in bw_names, f"{node.name} was recomputed"
    # and the gradients are eager's, under the same random numbers
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    torch.manual_seed(0)
    f(x, w).backward()
    torch.testing.assert_close((gx, gw), (x.grad, w.grad))


def test_recomputation_runs_just_before_its_first_use():
    """A recomputed value is made next to its reader, not at the start of the backward."""
    def f(x, w):
        h = x
        for _ in range(3):
            h = (h @ w).sin()
        return h.sum()
    compiled = aotgrad.compile(f, backend="eager")
    compiled(torch.randn(4, 8), torch.randn(8, 8, requires_grad=True)).backward()
    a = compiled.artifacts[0]
    forward = {n.name for n in joint_of(a.joint_graph, a.info.num_graph_outputs).forward}
    order = [n for n in a.backward_graph.graph.nodes if n.op == "call_function"]
    for i, node in enumerate(order):
        if node.name in forward:  # recomputed: its first user comes right after its inputs
            first_use = min(order.index(u) for u in node.users if u.op == "call_function")
            between = order[i + 1:first_use]
            assert all(n.name in forward for n in between), (node, between)


def test_just_in_time_order_keeps_the_others_in_order():
    g = fx.Graph()
    x = g.placeholder("x")
    a = g.call_function(aten.sin.default, (x,))
    b = g.call_function(aten.cos.default, (x,))
    c = g.call_function(aten.neg.default, (b,))
    d = g.call_function(aten.mul.Tensor, (a, c))
    nodes = [a, b, c, d]
    assert just_in_time_order(nodes, {a}.__contains__) == [b, c, a, d]
    assert just_in_time_order(nodes, {a, b}.__contains__) == [b, c, a, d]
    assert just_in_time_order(nodes, lambda n: False) == nodes
    assert just_in_time_order([a, b], {a, b}.__contains__) == [a, b]  # only outputs read them


def test_as_early_as_possible_moves_nodes_up_to_their_last_input():
    g = fx.Graph()
    x, y = g.placeholder("x"), g.placeholder("y")
    a = g.call_function(aten.sin.default, (x,))
    b = g.call_function(aten.cos.default, (y,))
    c = g.call_function(aten.neg.default, (a,))
    d = g.call_function(aten.le.Scalar, (a, 0))  # early: right after `a`
    e = g.call_function(aten.logical_not.default, (d,))  # early, reading an early node
    f = g.call_function(aten.mul.Tensor, (a, b))  # early: after `b`, its last input
    nodes = [x, y, a, b, c, d, e, f]
    assert as_early_as_possible(nodes, {d, e, f}) == [x, y, a, d, e, b, f, c]
    assert as_early_as_possible(nodes, set()) == nodes


# ---- activation checkpointing ---------------------------------------------------------------

def block(x, w1, w2):
    return (torch.sin(x @ w1).cos() * 3) @ w2


def checkpointed(x, w1, w2):
    return checkpoint(block, x, w1, w2, use_reentrant=False).relu().sum()


def selective(policy):
    def fn(x, w1, w2):
        context = functools.partial(create_selective_checkpoint_contexts, policy)
        return checkpoint(block, x, w1, w2, use_reentrant=False, context_fn=context).relu().sum()
    return fn


def run_both(fn, *shapes, **options):
    """The artifact, after checking gradients against eager on the same inputs."""
    torch.manual_seed(0)
    args = [torch.randn(*s, requires_grad=True) for s in shapes]
    twins = [a.detach().clone().requires_grad_() for a in args]
    compiled = aotgrad.compile(fn, backend="eager", **options)
    torch.manual_seed(1)
    compiled(*args).backward()
    torch.manual_seed(1)
    fn(*twins).backward()
    for a, t in zip(args, twins):
        torch.testing.assert_close(a.grad, t.grad)
    art = compiled.artifacts[0]
    verify_partition(art.forward_graph, art.backward_graph, art.info.num_graph_outputs)
    return art


def grads_match(fn, args, backend, **tolerance):
    """`fn` compiled, and eager's inputs, after checking gradients against eager's."""
    args = [a.requires_grad_() for a in args]
    twins = [a.detach().clone().requires_grad_() for a in args]
    compiled = aotgrad.compile(fn, backend=backend)
    compiled(*args).backward()
    fn(*twins).backward()
    for a, b in zip(args, twins):
        torch.testing.assert_close(a.grad, b.grad, **tolerance)
    return compiled, twins


SHAPES = [(4, 8), (8, 16), (16, 8)]


def saved_ops(artifact):
    return {s.op for s in artifact.saved}


def ops(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_checkpoint_recomputes_its_region():
    plain = run_both(lambda *a: block(*a).relu().sum(), *SHAPES)
    art = run_both(checkpointed, *SHAPES)
    # Without checkpointing the matmul's result is saved; with it, only inputs and the value
    # after the region are, and the backward runs the region again: its first matmul and
    # the pointwise ops (not the last matmul, whose result nothing needs: early stop).
    assert "aten.mm.default" in saved_ops(plain)
    assert saved_ops(art) <= {"placeholder", "aten.relu.default"}
    assert ops(art.backward_graph).count(aten.mm.default) == \
        ops(plain.backward_graph).count(aten.mm.default) + 1
    assert {aten.sin.default, aten.cos.default} <= set(ops(art.backward_graph))


def test_checkpoint_with_dropout_replays_the_same_mask():
    def fn(x, w1, w2):
        return checkpoint(lambda x: F.dropout(x @ w1, 0.5, training=True).sin() @ w2, x,
                          use_reentrant=False).sum()
    run_both(fn, (64, 8), (8, 16), (16, 8))


class Checkpointed(nn.Module):
    def __init__(self, *layers, reentrant=False):
        super().__init__()
        self.block = nn.Sequential(*layers)
        self.reentrant = reentrant

    def forward(self, x):
        return checkpoint(self.block, x, use_reentrant=self.reentrant)


CHECKPOINT_DOORS = pytest.mark.parametrize("door", [
    lambda m: aotgrad.compile(m, backend="eager"),
    lambda m: aotgrad.compile(m, backend="inductor"),
    lambda m: torch.compile(m, backend=aotgrad.backend(backend="eager"))],
    ids=["compile", "compile-inductor", "dynamo"])


@CHECKPOINT_DOORS
@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_checkpoint_with_an_in_place_op_matches_eager(door, reentrant):
    """`ReLU(inplace=True)` after a linear layer, inside a plain checkpoint: torch's
    selective-checkpoint caching (torch.compile's way for plain checkpoints too) refuses a
    write to a cached value; aotgrad runs the region once, tagged, and matches eager. A
    reentrant checkpoint (an autograd.Function calling `backward` inside its backward,
    which the trace's `autograd.grad` refused) is run the same way."""
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Linear(3, 8), Checkpointed(
        nn.Linear(8, 8), nn.ReLU(inplace=True), nn.Linear(8, 8), nn.Tanh(),
        reentrant=reentrant), nn.Linear(8, 1))
    model = copy.deepcopy(eager)
    compiled = door(model)
    x = torch.randn(6, 3)
    for m in (eager, compiled):
        m(x).sum().backward()
    for (name, p), q in zip(eager.named_parameters(), model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, msg=name)


@pytest.mark.parametrize("door", [
    lambda m: aotgrad.compile(m, backend="eager"),
    pytest.param(lambda m: torch.compile(m, backend=aotgrad.backend(backend="eager")),
                 marks=pytest.mark.xfail(strict=True, reason=(
                     "Dynamo lifts the parameters the region reads into the checkpoint's "
                     "operands: whether the user's input requires grad cannot be told "
                     "apart, and the region's parameters get gradients, as torch.compile's "
                     "do")))], ids=["compile", "dynamo"])
def test_reentrant_checkpoint_of_an_input_without_grad_passes_no_gradient(door):
    """Eager's reentrant checkpoint runs its region under no_grad and passes gradients
    back only if one of its inputs requires grad: a first layer checkpointed on the batch
    gets none."""
    torch.manual_seed(0)
    eager = nn.Sequential(Checkpointed(nn.Linear(3, 8), nn.Tanh(), reentrant=True),
                          nn.Linear(8, 1))
    model = copy.deepcopy(eager)
    x = torch.randn(6, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager's "None of the inputs have requires_grad"
        eager(x).sum().backward()
        door(model)(x).sum().backward()
    assert [p.grad is None for p in model.parameters()] == \
        [p.grad is None for p in eager.parameters()] == [True, True, False, False]


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_checkpoint_closing_over_a_tensor_changed_after_the_region_is_refused(reentrant):
    """Eager's backward recomputes the region with the closed-over tensor's new value and
    raises nothing; aotgrad's stale-value analysis ran the checkpoint as torch does (a
    reentrant one raising torch's `.grad()` error at the compile) or found nothing and
    asked for a bug report. Through Dynamo the tensor is an operand of the region: the
    backward raises eager's error for a changed argument."""
    def fn(x, w0):
        w = w0 * 1
        y = checkpoint(lambda x: (x @ w).sin(), x, use_reentrant=reentrant)
        w.mul_(2)
        return y.sum()
    x, w = torch.randn(4, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True)
    fn(x, w).backward()  # eager runs it
    with pytest.raises(NotImplementedError, match="aotgrad: a torch.utils.checkpoint region "
                                                  "reads a tensor of shape .4, 4. from outside"):
        aotgrad.compile(fn, backend="eager")(x, w)
    torch._dynamo.reset()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.compile(fn, backend=aotgrad.backend(backend="eager"))(x, w).backward()


@pytest.mark.xfail(strict=True, reason=(
    "eager's reentrant checkpoint raises at torch.autograd.grad (its backward finds "
    "_is_checkpoint_valid() False); the compiled node, which holds the region, gives the "
    "gradient: whether eager's engine would reach the region depends on the inputs asked for"))
def test_reentrant_checkpoint_under_autograd_grad_raises_as_eager():
    def fn(x, w):
        return checkpoint(lambda x: (x @ w).sin(), x, use_reentrant=True).sum()
    x, w = torch.randn(3, 3, requires_grad=True), torch.randn(3, 3, requires_grad=True)
    with pytest.raises(RuntimeError, match="incompatible with .grad()"):
        torch.autograd.grad(fn(x, w), x)
    with pytest.raises(RuntimeError, match="incompatible with .grad()"):
        torch.autograd.grad(aotgrad.compile(fn, backend="eager")(x, w), x)


@CHECKPOINT_DOORS
def test_checkpoint_writing_batch_norm_statistics_is_refused_unless_no_backward_can(door):
    """Eager writes BatchNorm's running statistics again when the backward recomputes the
    region; a compiled backward does not (torch.compile updates them once, silently):
    refused, naming the write. Under no_grad eager writes once, in eval mode not at all:
    those compile, and write as eager does."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 8), Checkpointed(nn.Linear(8, 8), nn.BatchNorm1d(8)))
    with pytest.raises(Exception, match="checkpoint region writes in place to a tensor from "
                                        "outside it") as raised:
        door(model)(torch.randn(6, 3)).sum().backward()
    assert "aotgrad" in str(raised.value)
    for mode in ("no_grad", "eval"):  # no backward recomputes the region / nothing written
        torch._dynamo.reset()
        model.train(mode != "eval")
        eager = copy.deepcopy(model)
        x = torch.randn(6, 3)
        with torch.no_grad() if mode == "no_grad" else contextlib.nullcontext():
            torch.testing.assert_close(door(model)(x), eager(x))
        for b, e in zip(model.buffers(), eager.buffers()):
            torch.testing.assert_close(b, e)


def _dropout_block(x, w):
    return F.dropout((x @ w).sin(), 0.5, training=True) @ w


def _save_mm(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op is aten.mm.default else \
        CheckpointPolicy.PREFER_RECOMPUTE


UNPRESERVED = {  # checkpoints whose recompute draws with the generator as the backward finds it
    "plain": dict(use_reentrant=False),
    "reentrant": dict(use_reentrant=True),
    "selective": dict(use_reentrant=False, context_fn=functools.partial(
        create_selective_checkpoint_contexts, _save_mm)),
}


def _unpreserved_step(fn, kind, x, w):
    torch.manual_seed(0)
    out = fn(x, w, kind)
    out.sum().backward()
    return out, x.grad


def _unpreserved(x, w, kind):
    return checkpoint(_dropout_block, x, w, preserve_rng_state=False, **UNPRESERVED[kind])


def _must_recompute(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_RECOMPUTE


PRESERVED = {**UNPRESERVED, "recompute everything": dict(
    use_reentrant=False, context_fn=functools.partial(
        create_selective_checkpoint_contexts, _must_recompute))}


@pytest.mark.parametrize("kind", PRESERVED)
@pytest.mark.parametrize("door", [
    lambda f: aotgrad.compile(f, backend="eager"),
    lambda f: torch.compile(f, backend=aotgrad.backend(backend="eager"))],
    ids=["compile", "dynamo"])
def test_checkpoint_preserving_rng_state_around_dropout_matches_eager(door, kind):
    """Dynamo's op for a selective region calls checkpoint() with preserve_rng_state=False
    itself: that is not the user's, whose own (the default here) is the op's kwarg."""
    torch._dynamo.reset()

    def fn(x, w, kind):
        return checkpoint(_dropout_block, x, w, **PRESERVED[kind])
    x, w = torch.randn(4, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)
    out, grad = _unpreserved_step(fn, kind, x, w)
    x.grad = None
    got_out, got_grad = _unpreserved_step(door(fn), kind, x, w)
    torch.testing.assert_close(got_out, out)
    torch.testing.assert_close(got_grad, grad)


@pytest.mark.parametrize("kind", UNPRESERVED)
@pytest.mark.parametrize("door", [
    lambda f: aotgrad.compile(f, backend="eager"),
    lambda f: torch.compile(f, backend=aotgrad.backend(backend="eager"))],
    ids=["compile", "dynamo"])
def test_checkpoint_not_preserving_rng_state_around_dropout_is_refused(door, kind):
    """Eager's backward recomputes the region with fresh draws: another mask than the
    forward's (and the generator moved on). The compiled backward used the forward's mask:
    gradients 8 apart from eager's, silently. Refused, where a backward may recompute; under
    no_grad, and without random ops, the function runs as eager."""
    torch._dynamo.reset()
    x, w = torch.randn(4, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)
    _, expected = _unpreserved_step(_unpreserved, kind, x, w)
    x.grad = w.grad = None
    _, as_if_preserved = _unpreserved_step(lambda x, w, kind: checkpoint(
        _dropout_block, x, w, **UNPRESERVED[kind]), kind, x, w)
    assert not torch.allclose(expected, as_if_preserved)
    compiled = door(_unpreserved)
    with pytest.raises(Exception, match="aotgrad: a torch.utils.checkpoint region with "
                                        "preserve_rng_state=False draws random numbers"):
        _unpreserved_step(compiled, kind, x, w)
    with torch.no_grad():
        torch.manual_seed(0)
        out = compiled(x, w, kind)
        torch.manual_seed(0)
        torch.testing.assert_close(out, _unpreserved(x, w, kind))

    def no_draws(x, w, kind):
        return checkpoint(lambda x, w: (x @ w).sin() @ w, x, w, preserve_rng_state=False,
                          **UNPRESERVED[kind])
    torch._dynamo.reset()
    x.grad = None
    _, got = _unpreserved_step(door(no_draws), kind, x, w)
    x.grad = None
    torch.testing.assert_close(got, _unpreserved_step(no_draws, kind, x, w)[1])


@pytest.mark.parametrize("door", [
    lambda f: aotgrad.compile(f, backend="eager"),
    lambda f: torch.compile(f, backend=aotgrad.backend(backend="eager"))],
    ids=["compile", "dynamo"])
def test_a_context_fn_of_other_contexts_is_refused_by_aotgrad(door):
    """Torch's assertion spoke of "torch.compile mode" to an aotgrad.compile user."""
    torch._dynamo.reset()

    def contexts():
        return contextlib.nullcontext(), contextlib.nullcontext()

    def fn(x, w):
        return checkpoint(lambda x: (x @ w).sin(), x, use_reentrant=False, context_fn=contexts)
    x, w = torch.randn(4, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)
    fn(x, w).sum().backward()  # eager runs it
    with pytest.raises(Exception, match="aotgrad: a torch.utils.checkpoint context_fn is "
                                        "traced by torch's selective checkpointing"):
        door(fn)(x, w)


def test_a_selective_checkpoints_policy_does_not_tag_later_traces():
    """torch's selective checkpoint, traced, leaves each op's policy in the tracer's current
    metadata: an analysis or a double backward's replay of one left it there, and every
    later trace in the process was tagged "prefer recompute": its matmuls recomputed."""
    context = functools.partial(create_selective_checkpoint_contexts, policy_save_sin)
    fn = aotgrad.compile(lambda x, w: checkpoint(lambda x: (x @ w).sin(), x, use_reentrant=False,
                                                 context_fn=context).sum(), backend="eager")
    x, w = torch.randn(4, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)
    (gx,) = torch.autograd.grad(fn(x, w), x, create_graph=True)
    torch.testing.assert_close(gx, torch.autograd.grad(
        (x @ w).sin().sum(), x, create_graph=True)[0])
    plain = run_both(lambda *a: block(*a).relu().sum(), *SHAPES)
    assert "aten.mm.default" in saved_ops(plain)


def policy_save_sin(ctx, op, *args, **kwargs):
    if op == aten.sin.default:
        return CheckpointPolicy.MUST_SAVE
    if op == aten.mm.default:
        return CheckpointPolicy.MUST_RECOMPUTE
    return CheckpointPolicy.PREFER_RECOMPUTE


def test_selective_checkpoint_policy_binds_the_min_cut():
    """MUST_SAVE sin is saved though it is cheap; MUST_RECOMPUTE mm is recomputed though it
    is expensive; PREFER_RECOMPUTE cos is recomputed."""
    art = run_both(selective(policy_save_sin), *SHAPES)
    saved = {s.name for s in art.saved}
    assert "sin" in saved and "mm" not in saved and "cos" not in saved
    bw = [n for n in art.backward_graph.graph.nodes if n.op == "call_function"]
    assert any(n.name == "mm" and n.target == aten.mm.default for n in bw)  # recomputed
    assert any(n.name == "cos" for n in bw)
    assert not any(n.name == "sin" for n in bw)


def test_without_the_policy_min_cut_would_choose_otherwise():
    """The same graph, policy tags stripped: the min-cut saves the matmul, not sin."""
    compiled = aotgrad.compile(selective(policy_save_sin), backend="eager")
    compiled(*[torch.randn(*s, requires_grad=True) for s in SHAPES])
    joint = compiled.artifacts[0].joint_graph
    tags = {node: node.meta.pop("recompute") for node in joint.graph.nodes
            if "recompute" in node.meta}
    fw, _ = min_cut_rematerialization_partition(joint, num_fwd_outputs=1)
    for node, tag in tags.items():
        node.meta["recompute"] = tag
    saved = {n.name for n in list(fw.graph.output_node().args[0])[1:]}
    assert "mm" in saved and "sin" not in saved


def test_selective_checkpoint_saving_matmuls():
    """The common policy: save matmuls, recompute the rest."""
    def policy(ctx, op, *args, **kwargs):
        return (CheckpointPolicy.MUST_SAVE if op == aten.mm.default
                else CheckpointPolicy.PREFER_RECOMPUTE)
    art = run_both(selective(policy), *SHAPES)
    assert "aten.mm.default" in saved_ops(art)
    assert not {"aten.sin.default", "aten.cos.default", "aten.mul.Tensor"} & saved_ops(art)


def test_selective_checkpoint_never_recomputes_random_ops():
    """A MUST_RECOMPUTE dropout is saved anyway: a second run would draw a new mask."""
    def fn(x, w1, w2):
        context = functools.partial(create_selective_checkpoint_contexts,
                                    lambda *a, **k: CheckpointPolicy.MUST_RECOMPUTE)
        inner = lambda x: F.dropout(x @ w1, 0.5, training=True).sin() @ w2  # noqa: E731
        return checkpoint(inner, x, use_reentrant=False, context_fn=context).sum()
    art = run_both(fn, (64, 8), (8, 16), (16, 8))
    assert aten.native_dropout.default not in ops(art.backward_graph)


@pytest.mark.parametrize("budget", [0.0, 1.0])
def test_selective_checkpoint_policy_binds_the_budget(budget):
    art = run_both(selective(policy_save_sin), *SHAPES, memory_budget=budget)
    saved = {s.name for s in art.saved}
    assert "sin" in saved and "mm" not in saved


def test_rules_of_a_selective_region():
    compiled = aotgrad.compile(selective(policy_save_sin), backend="eager")
    compiled(*[torch.randn(*s, requires_grad=True) for s in SHAPES])
    art = compiled.artifacts[0]
    rules = forward_rules(joint_of(art.joint_graph, 1))
    by_name = {n.name: r for n, r in rules.items()}
    assert by_name["sin"] == Rule.SAVE  # MUST_SAVE
    assert by_name["mm"] == Rule.RECOMPUTE  # MUST_RECOMPUTE, inside the region
    assert by_name["cos"] == Rule.RECOMPUTE  # PREFER_RECOMPUTE
    assert by_name["mm_1"] == Rule.COSTLY  # the region's output: an expensive op, as usual
    assert by_name["relu"] == Rule.CHOOSE  # after the region: a cheap op
    assert by_name["primals_1"] == Rule.INPUT


# ---- the flow network -----------------------------------------------------------------------

def brute_force_min_cut(edges, n):
    """Smallest capacity over every source/sink split of vertices 0 (source) .. n-1 (sink)."""
    best = None
    for bits in itertools.product([0, 1], repeat=n - 2):
        side = {0, *(i + 1 for i, b in enumerate(bits) if b)}
        value = sum(c for u, v, c in edges if u in side and v not in side)
        best = value if best is None else min(best, value)
    return best


def random_network(seed, n=6):
    gen = torch.Generator().manual_seed(seed)
    edges = [(u, v, int(torch.randint(0, 10, (), generator=gen)))
             for u in range(n) for v in range(n)
             if u != v and v != 0 and u != n - 1 and torch.rand((), generator=gen) < 0.5]
    return edges, n


def network(edges, n):
    net = FlowNetwork()
    for u, v, c in edges:
        net.add_edge(u, v, c)
    net.vertex(0), net.vertex(n - 1)
    return net


@pytest.mark.parametrize("seed", range(30))
def test_min_cut_value_matches_brute_force(seed):
    edges, n = random_network(seed)
    value, side = network(edges, n).min_cut(0, n - 1)
    assert value == brute_force_min_cut(edges, n)
    assert 0 in side and n - 1 not in side
    assert value == sum(c for u, v, c in edges if u in side and v not in side)


def test_latest_min_cut_is_minimal_and_past_the_earliest():
    for seed in range(30):
        edges, n = random_network(seed)
        early, late = network(edges, n), network(edges, n)
        value, early_side = early.min_cut(0, n - 1)
        late_value, late_side = late.min_cut(0, n - 1, latest=True)
        assert late_value == value
        assert late_value == sum(c for u, v, c in edges if u in late_side and v not in late_side)
        assert early_side <= late_side and n - 1 not in late_side


# ---- small values broadcast in the backward -------------------------------------------------

def inductor_decomposed_eager():
    """The eager backend with Inductor's decompositions: the graphs Inductor would get."""
    from aotgrad.backends.compilers import _inductor_decompositions, eager_compiler
    from aotgrad.backends.passes import undo_transpose_pairs
    from aotgrad.schema import Backend
    return Backend(eager_compiler, eager_compiler, eager_compiler, _inductor_decompositions(),
                   undo_transpose_pairs)


def normalize(x, w):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return ((x - mean) * torch.rsqrt(var + 1e-5) * w).sum()


def shifted_label_loss(logits, labels):
    labels = F.pad(labels, (0, 1), value=-100)[..., 1:]
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


@pytest.mark.parametrize("fn, args, saved, recomputed", [
    (normalize, lambda: (torch.randn(4, 64, requires_grad=True),
                         torch.randn(64, requires_grad=True)), "rsqrt", "add"),
    # The padded labels, not the labels (an input, free to save): recomputing the pad
    # inside the loss backward's kernel would run it once per vocabulary entry. Saved
    # flattened (`view_1`, of the padded `clone`), as the loss reads them.
    (shifted_label_loss, lambda: (torch.randn(2, 8, 50, requires_grad=True),
                                  torch.randint(0, 50, (2, 8))), "view_1", "primals_2"),
], ids=["layer_norm_statistics", "padded_labels"])
def test_small_values_broadcast_in_the_backward_are_saved(fn, args, saved, recomputed):
    inputs = args()
    twins = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    compiled = aotgrad.compile(fn, backend=inductor_decomposed_eager())
    compiled(*inputs).backward()
    fn(*twins).backward()
    for a, b in zip(inputs, twins):
        torch.testing.assert_close(a.grad, b.grad)
    names = {s.name for s in compiled.artifacts[0].saved}
    assert saved in names and recomputed not in names


def language_model_loss(h, w, labels):
    return F.cross_entropy(h @ w, labels)


def padded_language_model_loss(h, w, labels):
    """As Inductor's pad_mm rewrites the loss on a GPU: the matmul's output has 4 more
    columns than the logits, a slice of it."""
    return F.cross_entropy((h @ F.pad(w, (0, 4)))[:, :w.shape[1]], labels)


@pytest.mark.parametrize("loss, columns", [(language_model_loss, 4096),
                                           (padded_language_model_loss, 4100)],
                         ids=["plain", "padded_matmul"])
def test_a_loss_saves_the_logits_written_anyway_not_their_log_softmax(loss, columns):
    """The log-softmax costs the same bytes but for two per-row statistics (a few less, with
    the matmul's padding); it is written only if saved, though (the loss and its backward
    read it inside their kernels), while the matmul writes the logits anyway, and the
    backward may overwrite them with their gradient."""
    h, w = torch.randn(64, 16, requires_grad=True), torch.randn(16, 4096, requires_grad=True)
    labels = torch.randint(0, 4096, (64,))
    compiled = aotgrad.compile(loss, backend=inductor_decomposed_eager())
    grads = torch.autograd.grad(compiled(h, w, labels), (h, w))
    expected = torch.autograd.grad(loss(h, w, labels), (h, w))
    torch.testing.assert_close(grads, expected)
    saved = {s.op: s for s in compiled.artifacts[0].saved}
    assert saved["aten.mm.default"].nbytes == 64 * columns * 4
    assert "aten.sub.Tensor" not in saved  # the log-softmax, recomputed from the logits


class _ProjectedBackward(torch.autograd.Function):
    """A value whose backward reads it with one large matmul, and whose forward only sums
    it (inside the sum's kernel: written nowhere unless saved)."""

    @staticmethod
    def forward(ctx, v, m):
        ctx.save_for_backward(v, m)
        return v.sum()

    @staticmethod
    def backward(ctx, g):
        v, m = ctx.saved_tensors
        return g * ((v @ m) @ m.t()), None


def doubled_then_projected_backward(x, w, m):
    return _ProjectedBackward.apply((x @ w) * 2, m)


def test_a_value_a_backward_matmul_reads_is_saved_without_the_write_surcharge():
    """Recomputed, the doubled product would be written by the backward for its matmul: one
    write either way, so the forward saves it (sparing the recomputation), not the product."""
    x, w, m = torch.randn(4096, 32), torch.randn(32, 16, requires_grad=True), torch.randn(16, 4096)
    compiled = aotgrad.compile(doubled_then_projected_backward,
                               backend=inductor_decomposed_eager())
    (grad,) = torch.autograd.grad(compiled(x, w, m), w)
    torch.testing.assert_close(
        grad, torch.autograd.grad(doubled_then_projected_backward(x, w, m), w)[0])
    saved = {s.op for s in compiled.artifacts[0].saved}
    assert "aten.mul.Tensor" in saved and "aten.mm.default" not in saved


# ---- boolean masks the backward computes --------------------------------------------------

def relu_then_mean(x, w):
    """The backward of the relu needs only where its output is positive: a mask, a byte per
    element, where the output (nothing else in the backward reads it) takes four."""
    return torch.relu(x @ w).mean()


def test_a_relus_mask_is_saved_instead_of_its_output():
    x, w = torch.randn(64, 8), torch.randn(8, 128, requires_grad=True)
    compiled = aotgrad.compile(relu_then_mean, backend=inductor_decomposed_eager())
    (grad,) = torch.autograd.grad(compiled(x, w), w)
    torch.testing.assert_close(grad, torch.autograd.grad(relu_then_mean(x, w), w)[0])
    saved = {s.name: s for s in compiled.artifacts[0].saved}
    (mask,) = [s for s in saved.values() if s.op == "aten.le.Scalar"]
    assert mask.dtype == torch.bool and "relu" not in saved
    # The forward computes it next to the relu, while the relu's output is alive anyway.
    order = [n.name for n in compiled.artifacts[0].forward_graph.graph.nodes]
    assert order.index(mask.name) < order.index("mean")


def checkpointed_relus(x, w1, w2):
    return checkpoint(lambda *a: torch.relu(torch.relu(a[0] @ a[1]) @ a[2]), x, w1, w2,
                      use_reentrant=False).sum()


def test_a_checkpointed_region_saves_no_mask_of_its_values():
    """The region is recomputed as a whole: a mask of one of its values, saved by the
    forward, would keep part of it (and made its relu a value read after the region)."""
    x, w1, w2 = torch.randn(64, 32), torch.randn(32, 128), torch.randn(128, 32)
    weights = [w.requires_grad_() for w in (w1, w2)]
    compiled = aotgrad.compile(checkpointed_relus, backend=inductor_decomposed_eager())
    grads = torch.autograd.grad(compiled(x, *weights), weights)
    expected = torch.autograd.grad(checkpointed_relus(x, *weights), weights)
    torch.testing.assert_close(grads, expected)
    assert saved_ops(compiled.artifacts[0]) == {"placeholder"}


class _NarrowBackward(torch.autograd.Function):
    """A float32 matmul whose weight gradient reads its input cast to bfloat16 (as CUDA's
    autocast runs a backward matmul, on attention's float32 operands)."""

    @staticmethod
    def forward(ctx, h, w):
        ctx.save_for_backward(h)
        return h @ w

    @staticmethod
    def backward(ctx, g):
        (h,) = ctx.saved_tensors
        return None, (h.t().to(torch.bfloat16) @ g.to(torch.bfloat16)).float()


def project_then_narrow_backward(x, v, w):
    return _NarrowBackward.apply(x @ v, w).sum()


def test_a_cast_the_backward_makes_of_a_forward_value_is_saved_at_its_width():
    """Only the bfloat16 copy of the projection reaches the backward: the forward saves that
    copy (two bytes an element, as torch's partitioner does) rather than the projection
    (four), which the backward cast again (a copy kernel and its chain of views)."""
    x, v, w = torch.randn(64, 24), torch.randn(24, 32), torch.randn(32, 16, requires_grad=True)
    compiled = aotgrad.compile(project_then_narrow_backward, backend=inductor_decomposed_eager())
    (grad,) = torch.autograd.grad(compiled(x, v, w), w)
    torch.testing.assert_close(
        grad, torch.autograd.grad(project_then_narrow_backward(x, v, w), w)[0])
    (saved,) = [s for s in compiled.artifacts[0].saved if s.op != "placeholder"]
    assert saved.dtype == torch.bfloat16
    casts = [op for op in ops(compiled.artifacts[0].backward_graph)
             if op == torch.ops.prims.convert_element_type.default]
    assert len(casts) == 2  # the gradient's, to bfloat16 and back: the saved copy's is gone


def test_a_linears_backward_reads_its_weight_without_undone_transposes():
    """The forward's `permute(w)`, transposed back in the backward, is `w` there: two nodes
    fewer per linear for the backend to compile."""
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    compiled = aotgrad.compile(copy.deepcopy(model), backend=inductor_decomposed_eager())
    x = torch.randn(5, 8)
    compiled(x).sum().backward()
    model(x).sum().backward()
    for ours, theirs in zip(compiled.parameters(), model.parameters()):
        torch.testing.assert_close(ours.grad, theirs.grad)
    backward = compiled.artifacts[0].backward_graph.graph
    outputs = backward.output_node().all_input_nodes  # a gradient keeps its own view
    mms = backward.find_nodes(op="call_function", target=torch.ops.aten.mm.default)
    assert any(i.op == "placeholder" and i.meta["val"].shape == (4, 16)  # the last weight
               for mm in mms for i in mm.all_input_nodes)
    permute = torch.ops.aten.permute.default
    assert not [p for p in backward.find_nodes(op="call_function", target=permute)
                if p not in outputs and getattr(p.args[0], "target", None) == permute]


def _undone_pairs(graph) -> list:
    """Views that undo the reordering view they read, outside the graph's outputs."""
    from aotgrad.backends.passes import _dims_order
    outputs = set(graph.output_node().all_input_nodes)
    undone = []
    for node in graph.nodes:
        second = _dims_order(node)
        first = _dims_order(node.args[0]) if second is not None else None
        if first is not None and node not in outputs and \
                [first[d] for d in second] == list(range(len(second))):
            undone.append(node)
    return undone


def test_transpose_pairs_are_undone_for_a_backend_that_runs_each_view():
    """backend="eager" runs `aten.t` and `aten.transpose` as traced: a linear's backward read
    its weight through `t(t(w))`, two dispatches a linear. The pair is `w`; mixed pairs and
    negative dims too, and a gradient keeps its own view, as eager's does."""
    def fn(x, w, v):
        y = torch.nn.functional.linear(x, w).transpose(-1, 0)
        return (y.transpose(1, 0).sin() @ v.transpose(0, 1).t()).sum()
    args = (torch.randn(5, 8), torch.randn(16, 8, requires_grad=True),
            torch.randn(16, 3, requires_grad=True))
    compiled = aotgrad.compile(fn, backend="eager")
    grads = torch.autograd.grad(compiled(*args), args[1:])
    expected = torch.autograd.grad(fn(*args), args[1:])
    for ours, theirs in zip(grads, expected):
        torch.testing.assert_close(ours, theirs)
        assert ours.stride() == theirs.stride() and ours._is_view() == theirs._is_view()
    artifact = compiled.artifacts[0]
    for graph in (artifact.forward_graph.graph, artifact.backward_graph.graph):
        assert not _undone_pairs(graph), graph


# ---- recomputation that would outlive a kernel ----------------------------------------------

def residual_stream(x, *weights):
    """A float32 residual stream with bfloat16 layer outputs: saving each layer's output
    (half the bytes) and re-adding the stream in the backward is the least-byte cut."""
    h = x
    for w in weights:
        n = h * torch.rsqrt((h * h).sum(-1, keepdim=True))
        h = h + (n.to(torch.bfloat16) @ w).float()
    return h.sum()


def _stream_partition(x, weights):
    compiled = aotgrad.compile(residual_stream, backend="eager")
    ours, twins = ([t.detach().clone().requires_grad_() for t in (x, *weights)] for _ in "ab")
    compiled(*ours).backward()
    residual_stream(*twins).backward()
    for a, b in zip(ours, twins):
        torch.testing.assert_close(a.grad, b.grad)
    return compiled.artifacts[0]


@pytest.mark.parametrize("refinements", [1, 3])
def test_recomputed_values_outlive_a_backward_matmul_only_below_the_peak(refinements,
                                                                         monkeypatch):
    """A deep stream: the first cut recomputes the stream values, each alive across the
    matmuls between its use to rebuild a later layer's and its own layer's backward. The
    next cuts save those recomputed near the backward's start (saved, they cost its peak
    nothing) and leave recomputed those further on, where the backward has freed more than
    their bytes: the estimated peak is below saving them all."""
    from aotgrad.partition.memory import estimate_peak
    monkeypatch.setattr(aotgrad.partition.remat, "REFINEMENTS", refinements)
    x = torch.randn(16, 32, requires_grad=True)
    weights = [torch.randn(32, 32, dtype=torch.bfloat16, requires_grad=True) for _ in range(8)]
    art = _stream_partition(x, weights)
    n = art.info.num_graph_outputs
    joint, saved_names = art.joint_graph, {s.name for s in art.saved}
    saved = [node for node in joint.graph.nodes if node.name in saved_names]
    j = joint_of(joint, n)
    remat = aotgrad.partition.remat
    spanning = remat.recomputed_across_kernels(joint, j.forward, saved, j.tangents, j.bw_roots)
    assert spanning
    if refinements == 1:
        return
    assert "add" in saved_names  # the first layer's stream value, read last
    monkeypatch.setattr(remat, "saved_below_peak", lambda spanning, *args: spanning)
    all_saved = _stream_partition(x, weights)
    peak = estimate_peak(art.forward_graph, art.backward_graph, n).peak_bytes
    assert peak < estimate_peak(all_saved.forward_graph, all_saved.backward_graph, n).peak_bytes


def stream_of_equal_bytes(x, *weights):
    """A pre-norm residual stream whose branch outputs have the stream's dtype (Swin-T, issue
    20): saving each stream value or each branch output costs the same bytes."""
    h = x
    for w in weights:
        n = h * torch.rsqrt((h * h).mean(-1, keepdim=True) + 1e-6)
        h = h + n @ w
    return h.sum()


def _equal_bytes_stream(weights):
    fresh = [w.detach().clone() for w in weights]  # grads_match accumulates into its inputs
    compiled, _ = grads_match(stream_of_equal_bytes, [torch.randn(64, 32), *fresh],
                              inductor_decomposed_eager())
    return compiled.artifacts[0]


def _spanning(art) -> list:
    """The recomputed values the backward keeps alive across a matmul, in `art`'s partition."""
    joint, names = art.joint_graph, {s.name for s in art.saved}
    saved = [node for node in joint.graph.nodes if node.name in names]
    j = joint_of(joint, art.info.num_graph_outputs)
    return aotgrad.partition.remat.recomputed_across_kernels(joint, j.forward, saved,
                                                             j.tangents, j.bw_roots)


def test_a_stream_is_saved_where_it_costs_what_its_branch_outputs_do():
    """The first cut saves the branch outputs (the matmul writes them anyway) and rebuilds the
    stream from them in the backward, where each stream value is then alive across the
    matmuls up to its own layer's backward: a buffer the backward writes. Saving the stream
    values instead frees the branch outputs, read only to rebuild them: the same bytes, and
    no rebuilt value outlives a matmul (torch's partitioner saves the stream too)."""
    torch.manual_seed(0)
    weights = [torch.randn(32, 32) / 8 for _ in range(6)]
    art = _equal_bytes_stream(weights)
    assert not _spanning(art)
    # The first layer reads the input; the last stream value is rebuilt at the backward's
    # start from the last branch output, read by that layer's backward alone.
    computed = [s.op for s in art.saved if s.op != "placeholder" and s.shape == (64, 32)]
    assert computed.count("aten.add.Tensor") == len(weights) - 2
    assert computed.count("aten.mm.default") == 1


def test_the_last_refinements_choices_are_cut_too(monkeypatch):
    """Each refinement marks the recomputed values that span a matmul, for the next cut to
    save. The last refinement's marks were once left uncut: ViT-S/16 (12 layers, 3
    refinements) rebuilt 3 layers' stream from up to 10 saved pieces in its backward."""
    torch.manual_seed(0)
    weights = [torch.randn(32, 32) / 8 for _ in range(6)]
    left = []
    for refinements in (0, 1):
        monkeypatch.setattr(aotgrad.partition.remat, "REFINEMENTS", refinements)
        left.append(len(_spanning(_equal_bytes_stream(weights))))
    assert left[0] > left[1]


# ---- values a backward matmul reads ---------------------------------------------------------

@pytest.mark.parametrize("share, gelu_saved", [(0.0, True), (1e6, False)])
def test_a_matmul_input_is_recomputed_when_the_matmul_hides_it(share, gelu_saved, monkeypatch):
    """A value a backward matmul reads is saved, unless recomputing it moves few enough bytes
    to hide behind the matmul's arithmetic (HIDDEN_SHARE of its time)."""
    monkeypatch.setattr(aotgrad.partition.remat, "HIDDEN_SHARE", share)
    model = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 64))
    twin = copy.deepcopy(model)
    x = torch.randn(32, 64)
    compiled = aotgrad.compile(model, backend="eager")
    compiled(x).square().sum().backward()
    twin(x).square().sum().backward()
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(a.grad, b.grad)
    ops_saved = saved_ops(compiled.artifacts[0])
    assert "aten.addmm.default" in ops_saved
    assert ("aten.gelu.default" in ops_saved) == gelu_saved


def test_a_float32_mlp_saves_only_its_matmul_outputs_at_scale():
    """At the benchmark's size (8192 x 4096, float32) a GELU output hides behind the weight
    gradient's matmul: the backward recomputes it from the saved pre-activation, just before
    that matmul (autograd's alias of it is deferred too, not taken at the backward's start).
    Meta tensors: shapes only, nothing computed."""
    model = nn.Sequential(nn.Linear(4096, 4096), nn.GELU(), nn.Linear(4096, 4096)).to("meta")
    compiled = aotgrad.compile(model, backend=inductor_decomposed_eager())
    compiled(torch.randn(8192, 4096, device="meta")).sum().backward()
    assert saved_ops(compiled.artifacts[0]) == {"placeholder", "aten.addmm.default"}


def test_a_small_weights_cast_is_saved_however_many_tokens_read_it():
    """The bfloat16 cast of a small weight, which the backward's matmul for the input's
    gradient reads, would be a kernel of its own recomputed: its few bytes hide behind the
    matmul's arithmetic (65536 tokens), its launch does not. Saved, as torch's partitioner
    saves it (Swin-T: 42 such kernels, issue 20). Meta tensors: shapes only."""
    def project(x, w):
        return F.linear(x.bfloat16(), w.bfloat16()).float().sum()
    x, w = (torch.randn(*shape, device="meta", requires_grad=True)
            for shape in [(65536, 64), (64, 64)])
    compiled = aotgrad.compile(project, backend=inductor_decomposed_eager())
    compiled(x, w).backward()
    casts = [s for s in compiled.artifacts[0].saved
             if s.op == "prims.convert_element_type.default" and s.shape == (64, 64)]
    assert [s.dtype for s in casts] == [torch.bfloat16]


# ---- a kernel input built from values the backward reads after it --------------------------

def gelu_norm_head(x, w, b, norm_w, norm_b, decoder):
    """ALBERT's masked-LM head as CUDA's bf16 autocast runs it (issue 20): a bf16 projection,
    gelu_new with its pow in float32 (autocast's float32 list), layer norm in float32, a
    decoder over a large vocabulary."""
    h = F.linear(x.bfloat16(), w.bfloat16(), b.bfloat16())
    p = torch.pow(h.float(), 3.0)
    g = 0.5 * h * (1.0 + torch.tanh(0.7978845608028654 * (h + 0.044715 * p)))
    y = F.layer_norm(g, (g.shape[-1],), norm_w, norm_b, 1e-12)
    return F.linear(y.bfloat16(), decoder.bfloat16()).float().logsumexp(-1).mean()


def torch_saved_bytes(fn, args) -> int:
    """Bytes of the non-input values torch's AOTAutograd (min cut, Inductor's decompositions)
    saves for the backward."""
    from functorch.compile import aot_function, make_boxed_func, min_cut_rematerialization_partition
    from torch._inductor.decomposition import select_decomp_table
    saved = []

    def forward_compiler(gm, _):
        outs = gm.graph.output_node().args[0]
        saved.extend(n for n in outs[1:] if isinstance(n, fx.Node) and n.op != "placeholder")
        return make_boxed_func(gm)

    compiled = aot_function(fn, forward_compiler, lambda gm, _: make_boxed_func(gm),
                            partition_fn=min_cut_rematerialization_partition,
                            decompositions=select_decomp_table())
    compiled(*args).backward()
    bases = {n.args[0] if n.target == aten.permute.default else n for n in saved}
    return sum(n.meta["val"].nbytes for n in bases)


def test_a_matmul_input_is_saved_rather_than_what_it_is_built_from():
    """The layer norm's bf16 output, which the decoder's weight gradient reads, is recomputed
    (it hides behind that matmul); the gelu and layer-norm values it is built from would then
    be alive across the matmul, for the layer norm's backward after it. Saving each of those
    (18 bytes an element, the forward kernel then writing five more tensors: issue 20's Triton
    failure) costs more than saving the bf16 output, as torch does (2 bytes an element)."""
    torch.manual_seed(0)
    args = [torch.randn(64, 256), torch.randn(128, 256) / 16, torch.zeros(128),
            torch.ones(128), torch.zeros(128), torch.randn(16384, 128) / 16]
    compiled, twins = grads_match(gelu_norm_head, args, inductor_decomposed_eager())
    art = compiled.artifacts[0]
    computed = [s for s in art.saved if s.op != "placeholder"]
    head_sized = [(s.op, s.dtype) for s in computed if s.shape == (64, 128)]
    assert head_sized == [("aten.addmm.default", torch.bfloat16),
                          ("prims.convert_element_type.default", torch.bfloat16)]
    assert sum(s.nbytes for s in computed) <= torch_saved_bytes(gelu_norm_head, twins)


def _reshape_graph(dims) -> torch.fx.GraphModule:
    """x.permute(dims).reshape(-1, 4), as Inductor's decompositions leave it: `aten.reshape`."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    aten = torch.ops.aten
    g = torch.fx.Graph()
    x = g.placeholder("x")
    p = g.call_function(aten.permute.default, (x, dims))
    r = g.call_function(aten.reshape.default, (p, [-1, 4]))
    g.output([r])
    with FakeTensorMode() as mode:
        x.meta["val"] = mode.from_tensor(torch.randn(2, 4, 3, 3) if dims[-1] == 1
                                         else torch.randn(2, 3, 3, 4))
        p.meta["val"] = x.meta["val"].permute(dims)
        r.meta["val"] = p.meta["val"].reshape(-1, 4)
    return torch.fx.GraphModule({}, g)


def test_a_reshape_that_copies_becomes_a_clone_and_a_view():
    """A permuted activation flattened for a matmul (ConvNeXt) is copied: the partitioner must
    see a copy, which it may save, not a free view of its input."""
    from aotgrad.backends.passes import split_copying_reshapes
    copying, viewing = _reshape_graph([0, 2, 3, 1]), _reshape_graph([0, 1, 2, 3])
    split_copying_reshapes(copying)
    split_copying_reshapes(viewing)
    targets = [n.target for n in copying.graph.nodes if n.op == "call_function"]
    assert targets == [torch.ops.aten.permute.default, torch.ops.aten.clone.default,
                       torch.ops.aten.view.default]
    assert torch.ops.aten.reshape.default in [n.target for n in viewing.graph.nodes]
    x = torch.randn(2, 4, 3, 3)
    assert torch.equal(copying(x)[0], x.permute(0, 2, 3, 1).reshape(-1, 4))


# ---- saved values Inductor lays out channels-last ------------------------------------------

class ConvNeXtBlocks(nn.Module):
    """ConvNeXt's block (timm's convnext_tiny, issue 20) between two convolutions: a depthwise
    convolution, then a layer norm and an MLP over [N, H, W, C], back to [N, C, H, W]."""

    def __init__(self, c=8):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 4, 4)
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm, self.fc1, self.fc2 = nn.LayerNorm(c), nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        self.gamma = nn.Parameter(torch.full((c,), 0.5))
        self.head = nn.Conv2d(c, c, 1)

    def forward(self, x):
        x = self.stem(x)
        y = self.fc2(F.gelu(self.fc1(self.norm(self.dw(x).permute(0, 2, 3, 1)))))
        return self.head(y.permute(0, 3, 1, 2) * self.gamma.view(1, -1, 1, 1) + x).mean()


def copied_to_reshape(backward: fx.GraphModule) -> list[str]:
    """The saved values, with the strides the compiled forward produced them in, that the
    backward must copy to reshape."""
    copied = []
    for p in backward.graph.find_nodes(op="placeholder"):
        val = p.meta.get("val")
        for user in p.users:
            if user.target in (aten.view.default, aten.reshape.default, aten._unsafe_view.default):
                try:
                    val.view(user.args[1])
                except (RuntimeError, ValueError):
                    copied.append(p.name)
    return copied


def test_saved_values_keep_a_layout_the_backward_can_flatten():
    """Inductor's layout optimization (on by itself on a GPU, forced here) gives every 4-D
    value upstream of a convolution channels-last strides unless the graph must return it
    with fixed ones. Saving ConvNeXt's [N, H, W, C] layer-norm and GELU outputs whole, the
    forward wrote them transposed and the backward copied each back to flatten it for its
    matmul's weight gradient: 0.48 ms a kernel on an H200 (issue 20). Saved as the 2-D views
    the matmuls read, as torch's partitioner saves them, they keep their traced strides."""
    import torch._inductor.config as inductor_config
    torch.manual_seed(0)
    model, x = ConvNeXtBlocks(), torch.randn(2, 3, 32, 32)
    twin = copy.deepcopy(model)
    with inductor_config.patch(force_layout_optimization=True):
        compiled = aotgrad.compile(model, backend="inductor")
        compiled(x).backward()
    twin(x).backward()
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)
    art = compiled.artifacts[0]
    assert copied_to_reshape(art.backward_graph) == []
    views = ("aten.view.default", "aten.reshape.default", "aten._unsafe_view.default")
    flat = [s.shape for s in art.saved if s.op in views]
    assert sorted(flat) == [(128, 8), (128, 32)]  # the layer norm's and the GELU's outputs


# ---- a recomputed value that spans a kernel only late in the backward -----------------------

def squeeze_excite_blocks(x, *weights):
    """EfficientNet's blocks (timm's efficientnet_b0, issue 20) under bf16 autocast: a
    convolution, batch norm and SiLU, then squeeze-and-excitation (a mean, two 1x1
    convolutions) scaling the SiLU's output. The backward reads the batch norm's output
    before the excitation's convolutions (to rebuild the SiLU's output) and after them (for
    the SiLU's backward)."""
    with torch.autocast("cpu", torch.bfloat16):
        for conv, reduce, expand in zip(*[iter(weights)] * 3):
            h = F.silu(F.batch_norm(F.conv2d(x, conv, padding=1), None, None, training=True))
            s = torch.sigmoid(F.conv2d(F.silu(F.conv2d(h.mean((2, 3), keepdim=True), reduce)),
                                       expand))
            x = h * s
        return x.float().square().mean()


def test_a_value_spanning_a_late_backward_kernel_is_recomputed_as_torch_does():
    """Saving the batch norm's output would keep it from the backward's start; recomputed, it
    is alive only across its block's small convolutions, after the backward has freed the
    later blocks' values. Torch's partitioner recomputes it; aotgrad saved it (16 such values
    in EfficientNet-B0, 281 MiB at batch 64: 1.17x torch's saved bytes)."""
    torch.manual_seed(0)
    c, r = 16, 4
    shapes = [(c, c, 3, 3), (r, c, 1, 1), (c, r, 1, 1)] * 3
    args = [torch.randn(8, c, 16, 16)] + [torch.randn(s) / 4 for s in shapes]
    compiled, twins = grads_match(squeeze_excite_blocks, args, inductor_decomposed_eager(),
                                  rtol=2e-2, atol=2e-2)
    computed = [s for s in compiled.artifacts[0].saved if s.op != "placeholder"]
    assert sum(s.nbytes for s in computed) <= torch_saved_bytes(squeeze_excite_blocks, twins)


def residual_relu_pooled(x, weight, bias, fc):
    """ResNet's last block: batch norm, the block's input added back, a ReLU that only the
    average pool reads (its backward needs no value), then the classifier."""
    h = F.batch_norm(x, None, None, weight, bias, training=True) + x
    return (torch.relu(h).mean((2, 3)) @ fc).sum()


def test_a_mask_is_saved_where_recomputing_it_would_make_inductor_write_a_gradient():
    """Recomputed from values the backward holds anyway, the ReLU's mask costs the min cut
    nothing; but the gradient through the ReLU then reads six buffers and has four readers,
    so Inductor's reuse rule writes it out, twice the mask's bytes, at the backward's peak
    (ResNet-50: +6 MB against torch's partitioner, which saves the mask)."""
    torch.manual_seed(0)
    args = [torch.randn(4, 8, 6, 6), torch.rand(8) + 0.5, torch.randn(8), torch.randn(8, 3)]
    compiled, _ = grads_match(residual_relu_pooled, args, inductor_decomposed_eager(),
                              rtol=1e-4, atol=1e-4)
    artifact = compiled.artifacts[0]
    assert "aten.le.Scalar" in saved_ops(artifact)
    from aotgrad.partition.memory import fused_in_kernels, realized_on_reuse
    backward = list(artifact.backward_graph.graph.nodes)
    assert not realized_on_reuse(backward, fused_in_kernels(backward))


def drop_path_residual(x, w):
    """timm's drop path: a per-sample mask scaled by 1/keep, broadcast over the block."""
    keep = 0.9
    scale = torch.empty(x.shape[0], 1).bernoulli_(keep).div_(keep)
    return (x + torch.tanh(x @ w) * scale).sum()


def test_a_drop_path_scale_is_recomputed_from_its_mask_not_saved():
    """The scale (`mask / keep`) is as small as the mask and read at the block's size, so
    the broadcast rule kept it, and its surcharge rounded to nothing: the forward saved it
    and wrote it in a kernel of its own (Swin-T: 22), where the mask is saved anyway."""
    torch.manual_seed(0)
    x, w = torch.randn(8, 64, requires_grad=True), torch.randn(64, 64, requires_grad=True)
    compiled = aotgrad.compile(drop_path_residual, backend=inductor_decomposed_eager())
    grads = []
    for f in (compiled, drop_path_residual):
        torch.manual_seed(1)
        f(x, w).backward()
        grads.append((x.grad, w.grad))
        x.grad = w.grad = None
    torch.testing.assert_close(grads[0], grads[1])
    saved = saved_ops(compiled.artifacts[0])
    assert "aten.bernoulli.p" in saved and "aten.div.Tensor" not in saved, saved
