"""Analysis and tracing without functionalization (pure.py), against the functionalized way."""

import collections
import dataclasses

import pytest
import torch
import torch.nn.functional as F

import aotgrad
from aotgrad.capture import analysis, joint, pure
from aotgrad import pipeline
from aotgrad.capture.inputs import flatten
from corpus import CASES
from harness import CONTEXTS, SEED_BASE


def _facts(info: analysis.FunctionInfo) -> analysis.FunctionInfo:
    """The info without its view-replay callables, which compare by identity."""
    return dataclasses.replace(info, outputs=tuple(dataclasses.replace(o, replay=None)
                                                   for o in info.outputs))


@pytest.fixture
def cross_checked(monkeypatch) -> list:
    """Every analysis without functionalization is checked against the functionalized one;
    the list collects those that were."""
    checked, analyze = [], pure.analyze

    def both(graph_fn, fakes, is_leaf, box, fake_mode):
        info = analyze(graph_fn, fakes, is_leaf, box, fake_mode)
        if info is not None:
            assert _facts(info) == _facts(analysis.analyze(graph_fn, fakes, is_leaf, box,
                                                           fake_mode))
            checked.append(info)
        return info

    monkeypatch.setattr(pure, "analyze", both)
    return checked


def _capture(case) -> None:
    torch.manual_seed(SEED_BASE)
    flat, spec = flatten(case.inputs())
    try:
        with CONTEXTS[case.context]():
            pipeline.capture_and_analyze(case.fn, flat, spec)
    except AssertionError:
        raise
    except Exception:  # noqa: BLE001 - cases of errors: the doors' tests compare them
        pass


@pytest.mark.parametrize("case", [c for c in CASES if c.fn is not None], ids=lambda c: c.name)
def test_analysis_without_functionalization_is_the_functionalized_one(case, cross_checked):
    _capture(case)


def test_most_corpus_functions_mutate_nothing(cross_checked):
    cases = [c for c in CASES if c.fn is not None]
    for case in cases:
        _capture(case)
    assert len(cross_checked) > len(cases) / 2


@pytest.fixture
def functional_traces(monkeypatch) -> list:
    traced, trace_joint = [], joint.trace_joint

    def counted(*args, **kwargs):
        traced.append(args[0])
        return trace_joint(*args, **kwargs)

    monkeypatch.setattr(joint, "trace_joint", counted)
    return traced


def _mlp_step(x, w1, w2):
    h = F.gelu(x @ w1.t()).reshape(2, -1, 8).transpose(0, 1)
    return (h.softmax(-1) @ w2).sum()


def _grads_match_eager(fn, args) -> None:
    compiled = aotgrad.compile(fn, backend="eager")
    mine = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    torch.testing.assert_close(compiled(*mine), fn(*args))
    torch.autograd.backward(compiled(*mine))
    torch.autograd.backward(fn(*args))
    for a, m in zip(args, mine):
        torch.testing.assert_close(m.grad, a.grad)


def _mlp_args():
    torch.manual_seed(0)
    return [torch.randn(4, 6, requires_grad=True), torch.randn(8, 6, requires_grad=True),
            torch.randn(8, 3, requires_grad=True)]


def test_a_function_that_mutates_nothing_is_traced_without_functionalization(
        functional_traces):
    args = _mlp_args()
    _grads_match_eager(_mlp_step, args)
    assert functional_traces == []
    flat, spec = flatten((tuple(args), {}))
    c = pipeline.capture_and_analyze(_mlp_step, flat, spec)
    ops = [collections.Counter(str(n.target) for n in gm.graph.nodes)
           for gm in (pure.trace_joint(c.graph_fn, c.info, c.fakes, c.fake_mode, None),
                      joint.trace_joint(c.graph_fn, c.info, c.fakes, c.fake_mode, None))]
    assert ops[0] == ops[1]


def test_a_mutation_in_the_forward_is_functionalized(functional_traces):
    def step(x, w):
        h = x @ w
        h.relu_()
        return h.sum()
    args = _mlp_args()[:2]
    args[1] = args[1].detach().t().requires_grad_()
    flat, spec = flatten((tuple(args), {}))
    assert not pipeline.capture_and_analyze(step, flat, spec).pure
    _grads_match_eager(step, args)
    assert len(functional_traces) == 1


class _DoubleInPlace(torch.autograd.Function):
    """A forward without mutations whose backward mutates."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad.clone().mul_(2)


def test_a_mutation_in_the_backward_alone_falls_back_to_functionalization(functional_traces):
    def step(x):
        return _DoubleInPlace.apply(x.sin()).sum()
    x = torch.randn(5, requires_grad=True)
    flat, spec = flatten(((x,), {}))
    assert pipeline.capture_and_analyze(step, flat, spec).pure
    _grads_match_eager(step, [x])
    assert len(functional_traces) == 1


def test_reading_a_saved_value_traces_no_alias_without_the_callers_hooks():
    """Under saved-tensor hooks autograd detaches each saved value the backward reads, which
    Inductor's decompositions trace as an `alias` node (six here, and a dispatch each). The
    trace without functionalization sets hooks only to shadow the caller's, so that only the
    values saved as outputs (softmax's, and its view) get one, as in torch's own trace."""
    args = _mlp_args()
    flat, spec = flatten((tuple(args), {}))
    c = pipeline.capture_and_analyze(_mlp_step, flat, spec)
    detach_as_alias = torch._decomp.get_decompositions([torch.ops.aten.detach])

    def aliases():
        gm = pure.trace_joint(c.graph_fn, c.info, c.fakes, c.fake_mode, detach_as_alias)
        return sum(n.target is torch.ops.aten.alias.default for n in gm.graph.nodes)
    assert aliases() == 2
    with torch.autograd.graph.save_on_cpu():  # shadowed: every saved value is read through one
        assert aliases() == 6
    _grads_match_eager(_mlp_step, args)


@pytest.mark.parametrize("mutates_input", [False, True])  # the pure trace, the functionalized
def test_the_trace_runs_autograd_in_this_thread(mutates_input):
    """On a GPU, autograd runs a CUDA backward in its device thread, away from the trace's
    context variables and thread-local state (and slower, handed across threads): every
    trace runs the engine in the calling thread, as torch's AOTAutograd does. On this CPU the
    engine's flag is what a traced backward can see."""
    seen = []

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            seen.append(torch._C._is_multithreading_enabled())
            return grad * 2

    def fn(x, buffer):
        if mutates_input:
            buffer.add_(1)
        return Probe.apply(x).sin().sum()

    x, buffer = torch.randn(4, requires_grad=True), torch.zeros(4)
    aotgrad.compile(fn)(x, buffer).backward()
    assert seen and not any(seen), seen
    torch.testing.assert_close(x.grad, 2 * (2 * x.detach()).cos())
