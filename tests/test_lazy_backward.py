"""The backward compiler runs at the first backward (`compile_backward="lazy"`, the default,
as in torch's AOTAutograd), or with the forward (`"ahead"`). Compared with torch's
`aot_function` where it has an equivalent, and with eager for the gradients."""

import pathlib
import threading
import time

import pytest
import torch
from functorch.compile import aot_function as torch_aot_function

import aotgrad
from aotgrad import compat
from aotgrad.runtime.call import CompiledOnFirstCall


class Counting:
    """A boxed compiler that counts its calls and records what it saw while compiling."""

    def __init__(self, delay: float = 0.0):
        self.calls = 0
        self.seen = []
        self.delay = delay  # widens the window in which two threads may race

    def __call__(self, gm, example_inputs):
        self.calls += 1
        self.seen.append({"grad": torch.is_grad_enabled(),
                          "autocast": torch.is_autocast_enabled("cpu"),
                          "thread": threading.get_ident(),
                          "context": compat.get_aot_compilation_context()})
        time.sleep(self.delay)
        return compat.make_boxed_func(gm)


def sin_sum(x):
    return (x.sin() * 2).sum()


def bw_compiles_per_step(aot_function) -> list[int]:
    """Backward compiles after: a forward, a no_grad forward, its backward, a second step."""
    bw = Counting()
    f = aot_function(sin_sum, compat.nop, bw)
    x = torch.randn(4, requires_grad=True)
    counts = []
    out = f(x)
    counts.append(bw.calls)
    with torch.no_grad():
        f(x)
    counts.append(bw.calls)
    out.backward()
    counts.append(bw.calls)
    f(x).backward()
    counts.append(bw.calls)
    return counts


def test_bw_compiler_runs_at_the_first_backward_as_in_torch():
    ours = bw_compiles_per_step(compat.aot_function)
    assert ours == bw_compiles_per_step(torch_aot_function)
    assert ours == [0, 0, 1, 1]


def test_a_forward_only_module_never_compiles_a_backward():
    bw = Counting()
    net = torch.nn.Linear(4, 4)
    compiled = compat.aot_module(net, compat.nop, bw)
    for _ in range(3):
        out = compiled(torch.randn(2, 4))
    assert out.requires_grad and bw.calls == 0
    assert "compile_backward" not in compiled.artifacts[0].timings
    assert "compile_forward" in compiled.artifacts[0].timings


def test_ahead_compiles_the_backward_at_the_first_call():
    bw = Counting()
    f = compat.aot_function(sin_sum, compat.nop, bw, compile_backward="ahead")
    x = torch.randn(4, requires_grad=True)
    out = f(x)
    assert bw.calls == 1
    assert "compile_backward" in f.artifacts[0].timings
    out.backward()
    f(x).backward()
    assert bw.calls == 1
    torch.testing.assert_close(x.grad, 2 * (2 * x.cos()))


def test_timings_gain_the_backward_stage_at_the_first_backward():
    f = aotgrad.compile(sin_sum, backend="eager")
    x = torch.randn(4, requires_grad=True)
    out = f(x)
    timings = f.artifacts[0].timings
    assert "compile_forward" in timings and "compile_backward" not in timings
    out.backward()
    assert timings["compile_backward"] > 0
    assert list(timings)[-2:] == ["compile_forward", "compile_backward"]
    assert "compile_backward" in f.artifacts[0].summary()


def test_the_backward_compiler_sees_grad_and_autocast_off_and_the_forwards_compile():
    bw, fw = Counting(), Counting()
    f = compat.aot_function(lambda x, w: (x @ w).relu().sum(), fw, bw)
    x, w = torch.randn(4, 4), torch.randn(4, 4, requires_grad=True)
    out, eager_out = f(x, w), (x @ w).relu().sum()
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the backward's ops, not its compile
        out.backward()
        expected = torch.autograd.grad(eager_out, w)[0]  # eager's backward ops autocast
    assert bw.calls == 1
    assert bw.seen[0]["grad"] is False and bw.seen[0]["autocast"] is False
    forward_context, backward_context = fw.seen[0]["context"], bw.seen[0]["context"]
    (fw_name,), (bw_name,) = forward_context[0], backward_context[0]  # "<compile id>_<role>"
    assert bw_name == fw_name.replace("_forward", "_backward")  # of the forward's compile
    torch.testing.assert_close(w.grad, expected)


def test_two_threads_calling_backward_at_once_compile_it_once():
    bw = Counting(delay=0.2)
    f = compat.aot_function(sin_sum, compat.nop, bw)
    xs = [torch.randn(4, requires_grad=True) for _ in range(4)]
    outs = [f(x) for x in xs]
    start = threading.Barrier(len(outs))
    errors = []

    def backward(out):
        try:
            start.wait()
            out.backward()
        except Exception as e:  # surfaced below: a thread's exception is otherwise lost
            errors.append(e)
    threads = [threading.Thread(target=backward, args=(out,)) for out in outs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and bw.calls == 1
    for x in xs:
        torch.testing.assert_close(x.grad, 2 * x.cos())


def test_a_failing_backward_compiler_fails_the_backward_and_is_tried_again():
    attempts = []

    def bw_compiler(gm, example_inputs):
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("backward compiler failed")
        return compat.make_boxed_func(gm)
    f = compat.aot_function(sin_sum, compat.nop, bw_compiler)
    x = torch.randn(4, requires_grad=True)
    out = f(x)  # the forward does not need it
    with pytest.raises(RuntimeError, match="backward compiler failed"):
        out.backward(retain_graph=True)
    out.backward()
    torch.testing.assert_close(x.grad, 2 * x.cos())
    assert len(attempts) == 2


def test_dynamic_shapes_compile_the_backward_ahead():
    """Its compiler may add to the shape guard, which the first call's entry already uses
    (torch's AOTAutograd compiles ahead too when the backward takes sizes)."""
    bw = Counting()
    f = compat.aot_function(lambda x: (x * x.shape[0]).sin().sum(), compat.nop, bw,
                            dynamic=True)
    f(torch.randn(4, requires_grad=True))
    assert bw.calls == 1


def test_an_unknown_option_is_refused():
    with pytest.raises(ValueError, match="aotgrad: compile_backward='never'"):
        aotgrad.compile(sin_sum, compile_backward="never")


def exp_of_product(x, w):
    return (x @ w).exp().sum() * 3  # Inductor writes into exp's donated buffer


def test_a_retained_first_backward_then_a_plain_one_match_eager():
    """The first backward keeps its saved values (it compiles the variant that writes into
    none); the second may have them."""
    x, w = torch.randn(8, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)
    out = aotgrad.compile(exp_of_product, backend="eager")(x, w)
    out.backward(retain_graph=True)
    first = w.grad.clone()
    out.backward()
    expected = torch.autograd.grad(exp_of_product(x, w), w)[0]
    torch.testing.assert_close(first, expected)
    torch.testing.assert_close(w.grad, 2 * expected)


def exp_and_sin(x):
    return x.exp(), x.sin()  # two nodes in eager, one compiled


@pytest.mark.xfail(strict=True, raises=RuntimeError, reason="the compiled outputs share one "
                   "autograd node, whose first backward frees what both read "
                   "(docs/unsupported.md; torch's AOTAutograd raises the same)")
def test_two_outputs_each_differentiated_by_its_own_backward_as_in_eager():
    x = torch.randn(4, requires_grad=True)
    a, b = aotgrad.compile(exp_and_sin, backend="eager")(x)
    a.sum().backward()
    b.sum().backward()  # eager: the sine's node is untouched by the first backward
    torch.testing.assert_close(x.grad, x.exp() + x.cos())


def test_a_double_backward_first_then_a_plain_one_match_eager():
    x = torch.randn(4, requires_grad=True)
    f = aotgrad.compile(sin_sum, backend="eager")
    (g,) = torch.autograd.grad(f(x), x, create_graph=True)
    (gg,) = torch.autograd.grad(g.sum(), x)
    torch.testing.assert_close(gg, -2 * x.sin())
    f(x).backward()
    torch.testing.assert_close(x.grad, 2 * x.cos())


def test_dynamo_compiles_the_backward_at_the_first_backward():
    torch._dynamo.reset()
    bw = Counting()
    backend = aotgrad.backend(backend=aotgrad.Backend(compat.nop, bw, compat.nop))
    f = torch.compile(sin_sum, backend=backend)
    x = torch.randn(4, requires_grad=True)
    out = f(x)
    assert bw.calls == 0
    out.backward()
    assert bw.calls == 1
    torch.testing.assert_close(x.grad, 2 * x.cos())


@pytest.mark.parametrize("door", ["compile", "dynamo"])
def test_inductor_compiles_a_backward_in_autograds_engine_thread(door):
    """The backward is compiled inside autograd's engine, under autocast (the forward ran
    under it), after the forward's compile context is gone: Inductor still compiles it, for
    the donations and strides the forward chose, and the gradients are eager's."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 8))
    compiled = aotgrad.compile(net) if door == "compile" else torch.compile(net, backend="aotgrad")
    x = torch.randn(4, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = compiled(x)
        out.float().square().sum().backward()
    got = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        net(x).float().square().sum().backward()
    for g, p in zip(got, net.parameters()):
        torch.testing.assert_close(g, p.grad, atol=2e-2, rtol=2e-2)
    if door == "compile":
        assert "compile_backward" in compiled.artifacts[0].timings


def test_once_compiled_a_backward_is_called_without_the_lazy_wrapper():
    f = aotgrad.compile(exp_of_product, backend="eager")
    x, w = torch.randn(8, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)
    out = f(x, w)
    (call,) = f.entries.values()
    assert isinstance(call.backward, CompiledOnFirstCall)
    assert isinstance(call.backward_keeping_saved, CompiledOnFirstCall)
    out.backward(retain_graph=True)  # compiles only the variant that keeps saved values
    assert isinstance(call.backward, CompiledOnFirstCall)
    assert not isinstance(call.backward_keeping_saved, CompiledOnFirstCall)
    out.backward()
    assert not isinstance(call.backward, CompiledOnFirstCall)



def _whole_step(backend, create_graph: bool):
    """A training step compiled whole, `.backward()` inside it: the graphs Dynamo hands
    `backend` over two steps, and the parameters after them (eager's where `backend` is
    None)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    seen = []

    def counting(gm, example_inputs):
        seen.append(gm)
        return backend(gm, example_inputs)

    def step(x):
        loss = model(x).pow(2).sum()
        if create_graph:
            (grad,) = torch.autograd.grad(loss, model[0].weight, create_graph=True)
            loss = loss + grad.pow(2).sum()
        loss.backward()

    compiled = step if backend is None else torch.compile(step, backend=counting)
    for _ in range(2):
        compiled(torch.randn(3, 4))
    return seen, [p.detach().clone() for p in model.parameters()]


def _traced_from_aotgrad(gm: torch.fx.GraphModule) -> bool:
    package = str(pathlib.Path(aotgrad.__file__).parent)
    return any(package in trace or "<aotgrad" in trace for trace in
               (n.meta.get("stack_trace") or "" for n in gm.graph.nodes))


@pytest.mark.parametrize("create_graph", [False, True], ids=["plain", "create_graph"])
def test_a_backward_run_inside_a_compiled_step_is_not_traced_by_dynamo(create_graph):
    """The engine ran aotgrad's backward under Dynamo's frame hook, which traced it (and
    the lazy backward's compile under it) as user code: more graphs for the backend to
    compile, Inductor compiling the backward graph twice."""
    graphs, params = _whole_step(aotgrad.backend(backend="eager"), create_graph)
    assert not [gm for gm in graphs if _traced_from_aotgrad(gm)]
    torch.testing.assert_close(params, _whole_step(None, create_graph)[1])
    if not create_graph:  # torch's AOTAutograd refuses a double backward
        torch_graphs, _ = _whole_step(torch._dynamo.lookup_backend("aot_eager"), create_graph)
        assert len(graphs) == len(torch_graphs)
