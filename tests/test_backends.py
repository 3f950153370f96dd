"""Backends: the eager backend's generated code, boxing, and Inductor on one graph."""

import copy
import math
import os
import warnings
import weakref

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import aotgrad
from aotgrad.backends.compilers import make_boxed_compiler, make_boxed_func
from aotgrad.backends.codegen import python_function
from aotgrad.schema import GRAPH_INFO
from aotgrad.semantics import mends
from harness import requires_cuda


def traced(fn, *args):
    gm = make_fx(fn)(*args)
    gm.graph._codegen = torch.fx.graph.CodeGen()
    gm.recompile()
    return gm


def constants_and_kwargs(x, y):
    z = torch.cat([x, y * math.inf], dim=0).clamp(max=1e30)
    w = z.to(dtype=torch.float64) + torch.tensor([1.5, 2.5, 3.5, 4.5], dtype=torch.float64)
    return [w.sum(dim=0, keepdim=True), torch.full_like(x, float("nan")), z.max(0)]


def test_generated_code_computes_what_the_graph_computes():
    args = (torch.randn(2), torch.randn(2))
    gm = traced(constants_and_kwargs, *args)
    expected = gm(*args)
    got = python_function(gm)(list(args))
    for e, g in zip(torch.utils._pytree.tree_leaves(expected), torch.utils._pytree.tree_leaves(got)):
        torch.testing.assert_close(e, g, equal_nan=True)


def test_generated_code_is_boxed_and_frees_its_inputs():
    gm = traced(lambda x: (x * 2).sin(), torch.randn(3))
    run = python_function(gm)
    args = [torch.randn(3)]
    run(args)
    assert run._boxed_call and args == []
    assert "del" in run.source  # values are dropped after their last use


def test_boxing_helpers():
    boxed = make_boxed_func(lambda a, b: a + b)
    assert boxed._boxed_call and boxed([1, 2]) == 3
    compiler = make_boxed_compiler(lambda gm, inputs: gm.forward)
    gm = traced(lambda x: x + 1, torch.zeros(1))
    assert compiler(gm, [torch.zeros(1)])([torch.zeros(1)])[0].item() == 1


def test_inductor_backend_matches_eager_on_a_training_step():
    w = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(4, 8)
    f = aotgrad.compile(lambda x, w: torch.nn.functional.gelu(x @ w).sum(), backend="inductor")
    f(x, w).backward()
    got, w.grad = w.grad, None
    torch.nn.functional.gelu(x @ w).sum().backward()
    torch.testing.assert_close(got, w.grad)


@pytest.mark.parametrize("door", ["compile", "dynamo"])
def test_inductor_backward_takes_batched_gradients(door):
    # is_grads_batched vmaps the backward: its gradients have no memory Inductor's kernels
    # could read ("Cannot access data pointer of Tensor that doesn't have storage").
    def fn(x, w):
        return (x * w).sin(), x.cos().sum()
    x, w = torch.randn(4, 3, requires_grad=True), torch.randn(3, requires_grad=True)
    compiled = (aotgrad.compile(fn, backend="inductor") if door == "compile"
                else torch.compile(fn, backend="aotgrad"))
    grads = torch.randn(5, 4, 3), torch.randn(5)
    got = torch.autograd.grad(compiled(x, w), (x, w), grads, is_grads_batched=True)
    torch.testing.assert_close(got, torch.autograd.grad(fn(x, w), (x, w), grads,
                                                        is_grads_batched=True))
    compiled(x, w)[1].backward()  # unbatched: Inductor's kernels
    torch.testing.assert_close(x.grad, -x.sin())


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_constants_returned_beside_tensors_as_eager(backend):
    """A float, a string, a dtype or a slice among the outputs: Inductor's lowering
    asserted on them (the graph returns constants, functorch's convention), and the
    partitioner hashed the graph's outputs (a slice is unhashable before Python 3.12)."""
    def f(x):
        return x * 2, 0.5, "s", torch.float16, slice(1, 2), Ellipsis
    compiled = aotgrad.compile(f, backend=backend)
    x = torch.randn(3, requires_grad=True)
    out = compiled(x)
    assert out[1:] == f(x)[1:]
    out[0].sum().backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 2.0))


def test_a_boxed_backward_can_free_each_saved_value_early():
    """Nothing but the argument list may hold the saved values: a boxed backward clears it
    to free each one after its last use (peak memory depends on it)."""
    from aotgrad import compat
    alive = []

    def bw_compiler(gm, example_inputs):
        def boxed(args):
            saved = [weakref.ref(a) for a in args[:-1]]  # the last: the loss's gradient
            out = gm(*args)
            args.clear()
            alive.extend(ref() for ref in saved if ref() is not None)
            return out
        boxed._boxed_call = True
        return boxed

    def fn(x, w1, w2):
        return ((x @ w1).relu() @ w2).sum()

    args = [torch.randn(4, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True),
            torch.randn(8, 2, requires_grad=True)]
    compat.aot_function(fn, fw_compiler=compat.nop, bw_compiler=bw_compiler)(*args).backward()
    assert alive, "the backward saw no saved value"
    assert all(any(t is a for a in args) for t in alive), "an activation outlived the clear"


def test_an_output_inductors_rewrites_make_a_view_of_an_input_is_still_its_own_tensor():
    """Inductor's joint-graph passes simplify `zeros(4) + y[:4]` to `y[:4]`: the output must
    not become a view of the input (writing to it would change the caller's tensor)."""
    compiled = aotgrad.compile(lambda y: torch.zeros(4) + y[:4], backend="inductor")
    for requires_grad in (False, True):
        y = torch.randn(6, requires_grad=requires_grad)
        out = compiled(y)
        assert out.data_ptr() != y.data_ptr() and out._base is None
        before = y.detach().clone()
        out.detach().add_(1)
        assert torch.equal(y.detach(), before)


def test_dynamo_parameters_and_buffers_reach_the_compiler_as_static_inputs():
    """Dynamo interleaves parameters and buffers with the other inputs; every one of them is
    static for the compiler (Inductor then skips its per-call alignment checks on them)."""
    from torch import nn
    from aotgrad.schema import GRAPH_INFO
    from aotgrad.dynamo import make_backend
    seen = []

    def recording(gm, example_inputs):
        info = gm.meta[GRAPH_INFO]
        if info.role == "forward":
            image = [i for i, v in enumerate(example_inputs) if tuple(v.shape) == (2, 3, 8, 8)]
            seen.append((info.static_inputs, len(example_inputs), image))
        return gm

    torch._dynamo.reset()
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 3),
                          nn.BatchNorm2d(2))
    torch.compile(model, backend=make_backend(backend=recording))(
        torch.randn(2, 3, 8, 8)).sum().backward()
    (static, count, image), = seen
    assert set(static) == set(range(count)) - set(image) and len(image) == 1


def test_the_backward_takes_the_values_its_forward_computes_as_static_inputs():
    """As torch's compile marks them: Inductor skips its per-call alignment check of the
    saved values the forward computes and of saved parameters; not of the call's own input
    saved as it is (`x`, which may come misaligned)."""
    from aotgrad.schema import GRAPH_INFO
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh())
    compiled = aotgrad.compile(model, backend="eager")
    compiled(torch.randn(2, 4, requires_grad=True)).sum().backward()
    backward = compiled.artifacts[0].backward_graph
    names = [n.name for n in backward.graph.find_nodes(op="placeholder")]
    static = [names[i] for i in backward.meta[GRAPH_INFO].static_inputs]
    assert names == ["primals_1", "primals_3", "tanh", "tangents_1"]  # weight, x, tanh(...)
    assert static == ["primals_1", "tanh"]


def test_a_saved_view_of_the_calls_own_input_stays_checked():
    """A view of the call's input sits at the input's offset plus the traced one, which the
    trace cannot know: Inductor keeps checking its alignment. A view of a parameter (static)
    or of a computed value does not move."""
    import operator
    from torch import fx
    from aotgrad.pipeline import _static_saved_values
    from aotgrad.schema import GRAPH_INFO, GraphInfo, Partition
    g = fx.Graph()
    x, w = g.placeholder("x"), g.placeholder("w")
    x1 = g.call_function(torch.ops.aten.slice.Tensor, (x, 0, 1))
    w1 = g.call_function(torch.ops.aten.slice.Tensor, (w, 0, 1))
    m = g.call_function(torch.ops.aten.mul.Tensor, (x1, w1))
    mt = g.call_function(torch.ops.aten.t.default, (m,))
    x2 = g.call_function(operator.getitem, (g.call_function(torch.ops.aten.unbind.int, (x,)), 1))
    g.output((m, x1, w1, mt, x, x2))  # no fake values: as a graph aotgrad's cache loads
    fw = fx.GraphModule({}, g)
    fw.meta[GRAPH_INFO] = GraphInfo("forward", (1,), range(1))  # w is a parameter
    assert _static_saved_values(Partition(fw, fw, 1), fw, None) == (1, 2)  # w1, mt


def test_inductor_compiles_outside_the_calls_autocast():
    """The graph holds autocast's casts; Inductor retraces its attention-with-dropout pattern,
    and under the caller's autocast that retrace would cast against the graph's dtypes."""
    def attend(q, k, v, w):
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                             dropout_p=0.1)
        return a.transpose(1, 2).flatten(2) @ w
    q, k, v = (torch.randn(2, 4, 16, 8, requires_grad=True) for _ in range(3))
    w = torch.randn(32, 8, requires_grad=True)
    compiled = aotgrad.compile(attend)
    # A cached artifact compiled right would hide the fault.
    with torch._inductor.config.patch(fx_graph_cache=False), \
            torch.autocast("cpu", dtype=torch.bfloat16):
        out, expected = compiled(q, k, v, w), attend(q, k, v, w)
    assert (out.dtype, out.shape) == (expected.dtype, expected.shape)
    out.float().sum().backward()
    assert all(t.grad is not None and t.grad.dtype == t.dtype for t in (q, k, v, w))


def _bmm_as_mm(gm):
    """A graph pass that traces its replacement, as Inductor's pattern replacements do (its
    `bmm_to_mm`, on a GPU only, rewrote Llama's rotary matmul)."""
    from torch._inductor.pattern_matcher import (Arg, CallFunction, PatternMatcherPass,
                                                 register_graph_pattern)
    patterns = PatternMatcherPass()

    @register_graph_pattern(CallFunction(torch.ops.aten.bmm.default, Arg(), Arg()),
                            pass_dict=patterns)
    def replace(match, a, b):
        match.replace_by_example(
            lambda a, b: torch.mm(a.squeeze(0), b.squeeze(0)).unsqueeze(0), [a, b])
    patterns.apply(gm.graph)
    gm.recompile()
    return gm


def test_graph_passes_run_outside_the_calls_autocast():
    """A float32 region inside an autocast one (Llama's rotary embedding): the traced graph
    holds its casts, and a backend pass that retraces a replacement under the call's autocast
    cast the region's matmul to bfloat16 again, while the values after it kept their float32
    metadata (on the GPU, Inductor then read a bfloat16 buffer as float32: wrong gradients
    and a CUDA fault)."""
    from aotgrad.schema import Backend

    def rotary(x, inv_freq, positions):
        with torch.autocast("cpu", enabled=False):
            freqs = torch.bmm(inv_freq[None, :, None], positions[None, None, :].float())
            cos = freqs.transpose(1, 2).cos()
        return (x @ x.T).float().sum() + (x * cos[0]).sum()

    x = torch.randn(512, 16, requires_grad=True)
    inv_freq, positions = 1.0 / (10000 ** (torch.arange(16) / 16)), torch.arange(512)
    eager = make_boxed_compiler(lambda gm, _: gm)
    compiled = aotgrad.compile(rotary, backend=Backend(eager, eager, eager,
                                                       graph_passes=_bmm_as_mm))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, expected = compiled(x, inv_freq, positions), rotary(x, inv_freq, positions)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(torch.autograd.grad(out, x), torch.autograd.grad(expected, x))


def test_a_pass_that_retypes_a_nodes_inputs_is_refused_by_name():
    """The guard behind the test above: whatever the cause, a pass that hands a node inputs of
    another dtype and leaves the node's metadata as it was is refused, not compiled."""
    import pytest
    from aotgrad.schema import Backend

    def cast_cos_input(gm):
        cos = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.cos.default)
        with gm.graph.inserting_before(cos):
            cast = gm.graph.call_function(torch.ops.prims.convert_element_type.default,
                                          (cos.args[0], torch.bfloat16))
        cast.meta["val"] = cos.args[0].meta["val"].to(torch.bfloat16)
        cos.replace_input_with(cos.args[0], cast)
        gm.recompile()
        return gm

    eager = make_boxed_compiler(lambda gm, _: gm)
    compiled = aotgrad.compile(lambda x: x.cos() * 2, backend=Backend(
        eager, eager, eager, graph_passes=cast_cos_input))
    with pytest.raises(RuntimeError, match=r"aotgrad: the backend's graph passes changed what "
                                           r"`cos` .* torch.float32 .* torch.bfloat16"):
        compiled(torch.randn(4, requires_grad=True))


def test_a_backends_warm_up_runs_as_each_compile_starts_before_its_compilers():
    """Inductor's kernel-compile workers take seconds to start: the pipeline starts them
    (`Backend.warm_up`) before the trace, so that they are ready by the first kernel."""
    from aotgrad.schema import Backend
    events = []

    def compiler(gm, example_inputs):
        events.append(gm.meta[GRAPH_INFO].role)
        return gm

    backend = Backend(compiler, compiler, compiler, warm_up=lambda inputs: events.append("warm up"))
    compiled = aotgrad.compile(lambda x: x.sin().sum(), backend=backend)
    x = torch.randn(3, requires_grad=True)
    compiled(x).backward()
    assert events == ["warm up", "forward", "backward"]
    torch.testing.assert_close(x.grad, x.detach().cos())
    compiled(torch.randn(5, requires_grad=True))  # a new size compiles again: warmed again
    assert events[3:] == ["warm up", "forward"]


WARM_POOL_SCRIPT = """
import torch, aotgrad
from torch._inductor.async_compile import AsyncCompile
from aotgrad.backends import compilers
from aotgrad.schema import Backend
pools = []
def inductor(gm, example_inputs):  # Inductor itself, noting whether its pool was started
    pools.append(AsyncCompile.process_pool.cache_info().currsize)
    return compilers.inductor_compiler(gm, example_inputs)
backend = Backend(inductor, inductor, inductor, compilers.INDUCTOR_DECOMPOSITIONS,
                  compilers.inductor_graph_passes, compilers.warm_inductor_workers)
x = torch.randn(64, 64, device="cuda", requires_grad=True)
torch.compile(lambda x: x.sin().exp().sum(), backend=aotgrad.backend(backend=backend))(x).backward()
torch.testing.assert_close(x.grad, (x.sin().exp() * x.cos()).detach())
print("pools", pools)
"""


@requires_cuda
def test_inductors_compile_workers_are_started_before_the_first_graph_compiles():
    """In a fresh process (the pool lives as long as the process): torch's `inductor` backend
    starts it when Dynamo hands it a graph; aotgrad's Inductor backend as well (issue 20)."""
    import subprocess
    import sys
    env = {**os.environ, "AOTGRAD_CACHE": "0", "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1",
           "TORCHINDUCTOR_COMPILE_THREADS": "2"}
    done = subprocess.run([sys.executable, "-c", WARM_POOL_SCRIPT], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "pools [1, 1]" in done.stdout


ISA_PROBE_SCRIPT = """
import threading, torch, aotgrad
from torch._inductor import cpu_vec_isa
probed_in = []
probe = cpu_vec_isa.VecISA.check_build
def noting(self, code):
    probed_in.append(threading.current_thread().name)
    return probe(self, code)
cpu_vec_isa.VecISA.check_build = noting
x = torch.randn(8, 8, requires_grad=True)
aotgrad.compile(lambda x: x.sin().exp().sum(), backend="inductor")(x).backward()
torch.testing.assert_close(x.grad, (x.sin().exp() * x.cos()).detach())
print("probed in", sorted(set(probed_in)), cpu_vec_isa.valid_vec_isa_list.cache_info().misses)
"""


def test_the_cpu_isa_is_probed_once_beside_the_compile():
    """Inductor's CPU ISA probe (child processes, ~1 s) runs in a thread started with the
    compile, once: Inductor then reads its cached answer (a warm cache's first step on a
    2-core CPU: ~2.5 -> ~2.0 s, bench/cache.py)."""
    import subprocess
    import sys
    env = {**os.environ, "AOTGRAD_CACHE": "0", "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}
    done = subprocess.run([sys.executable, "-c", ISA_PROBE_SCRIPT], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "probed in ['aotgrad-cpu-isa-probe'] 1" in done.stdout, done.stdout


def test_inductor_compiles_a_copy_and_the_graphs_stay_as_partitioned():
    """Inductor's passes rewrite the graph they compile in place. aotgrad hands them a copy:
    the artifact shows the backward as partitioned, and that graph is the one a tracer
    inlines (compiled autograd), with no second copy made for it on every compile."""
    from torch._inductor import config as inductor_config
    from aotgrad.demo import TinyLM
    torch.manual_seed(0)
    lm = TinyLM(layers=1)
    eager = copy.deepcopy(lm)
    tokens = torch.randint(0, 256, (2, 16))
    batch = (tokens, torch.roll(tokens, -1, dims=1))
    compiled = aotgrad.compile(lm, backend="inductor")
    # Its passes run (no FX graph cache hit); its C++ kernels may come from the code cache.
    with inductor_config.patch(fx_graph_cache=False):
        loss = compiled(*batch)
        backward_graph = compiled.artifacts[0].backward_graph
        before = str(backward_graph.graph)
        loss.backward()  # the backward compiles now
    assert str(backward_graph.graph) == before
    eager(*batch).backward()
    for p, q in zip(lm.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("users_cap", [None, 200], ids=["default", "users_own"])
def test_a_backwards_kernels_are_capped_in_the_buffers_they_fuse(monkeypatch, users_cap):
    """A backward's recomputed chain (a residual stream) fused whole into one kernel spills
    registers (bench/results/h200-2026-11-29-session18): Inductor's cap on a kernel's
    buffers is set for backwards alone, and a cap the user set stands."""
    import torch._inductor.compile_fx as compile_fx
    from torch._inductor import config as inductor_config
    from aotgrad.backends.inductor_defaults import BACKWARD_KERNEL_BUFFERS
    seen, inner = {}, compile_fx.compile_fx_inner

    def spy(gm, example_inputs, **kwargs):
        role = "backward" if kwargs.get("is_backward") else "forward"
        seen[role] = inductor_config.max_fusion_unique_io_buffers
        return inner(gm, example_inputs, **kwargs)
    monkeypatch.setattr(compile_fx, "compile_fx_inner", spy)
    monkeypatch.setattr(inductor_config, "max_fusion_unique_io_buffers", users_cap)
    x = torch.randn(4, 8, requires_grad=True)
    with inductor_config.patch(fx_graph_cache=False):
        aotgrad.compile(lambda t: (t.sin() * t).sum(), backend="inductor")(x).backward()
    torch.testing.assert_close(x.grad, x.detach().sin() + x.detach() * x.detach().cos())
    assert seen == {"forward": users_cap, "backward": users_cap or BACKWARD_KERNEL_BUFFERS}


def _fake_cuda_input():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode(allow_non_fake_inputs=True):
        return torch.empty(4, device="cuda")


def test_a_cuda_graph_gets_pointwise_combo_kernels_unless_the_user_chose():
    """aotgrad's Inductor defaults (backends/inductor_defaults.py): a CUDA forward graph's
    pointwise kernels are launched as combos (session 39: step 0.897x of Inductor's, against
    0.939x without); a CPU graph gets none; a choice of the user's stands, even one equal to
    torch's default (`options={"combo_kernels": False}`)."""
    from torch._inductor import config
    from aotgrad.backends.inductor_defaults import POINTWISE_COMBOS, USER_SETTINGS, for_graph
    cuda, cpu = [_fake_cuda_input()], [torch.ones(4)]
    assert for_graph(config, "forward", cuda) == POINTWISE_COMBOS
    assert for_graph(config, "inference", cpu) == {}
    assert "combo_kernels" not in for_graph(config, "backward", cpu)
    with config.patch(combo_kernels=True):  # full combos, the user's: left as they are
        assert for_graph(config, "forward", cuda) == {}
    chosen = USER_SETTINGS.set(frozenset({"combo_kernels"}))
    try:
        assert for_graph(config, "forward", cuda) == {}
    finally:
        USER_SETTINGS.reset(chosen)
    assert for_graph(config, "forward", cuda) == POINTWISE_COMBOS


def test_combo_kernels_go_to_the_roles_their_table_names(monkeypatch):
    """COMBO_ROLES: the forward's and inference graphs by default, the backward's settings
    leaving combos as torch has them; the bench's `aotgrad_combo_all` adds the backward."""
    from torch._inductor import config
    from aotgrad.backends import inductor_defaults
    cuda = [_fake_cuda_input()]
    assert inductor_defaults.for_graph(config, "backward", cuda) == {
        "max_fusion_unique_io_buffers": inductor_defaults.BACKWARD_KERNEL_BUFFERS}
    for role in ("forward", "inference"):
        assert inductor_defaults.for_graph(config, role, cuda) == (
            inductor_defaults.POINTWISE_COMBOS)
    monkeypatch.setattr(inductor_defaults, "COMBO_ROLES",
                        frozenset({"forward", "backward", "inference"}))
    assert inductor_defaults.for_graph(config, "backward", cuda) == {
        **inductor_defaults.POINTWISE_COMBOS,
        "max_fusion_unique_io_buffers": inductor_defaults.BACKWARD_KERNEL_BUFFERS}


def test_the_users_options_are_known_as_theirs_inside_each_compile(monkeypatch):
    """How the defaults know a choice: torch.compile's options are marked as the user's
    around each graph's compile, the lazy backward's included; without options, nothing."""
    import torch._inductor.compile_fx as compile_fx
    from torch._inductor import config as inductor_config
    from aotgrad.backends.inductor_defaults import USER_SETTINGS
    seen, inner = [], compile_fx.compile_fx_inner

    def spy(gm, example_inputs, **kwargs):
        seen.append((USER_SETTINGS.get(), inductor_config.combo_kernels))
        return inner(gm, example_inputs, **kwargs)
    monkeypatch.setattr(compile_fx, "compile_fx_inner", spy)
    x = torch.randn(4, 8, requires_grad=True)
    with inductor_config.patch(fx_graph_cache=False):
        for options in ({"combo_kernels": False}, None):
            f = torch.compile(lambda t: (t.cos() * t).sum(), backend="aotgrad", options=options)
            f(x).backward()
            torch._dynamo.reset()
    chosen = frozenset({"combo_kernels"})
    assert seen == [(chosen, False), (chosen, False), (frozenset(), False), (frozenset(), False)]
    torch.testing.assert_close(x.grad, 2 * (x.detach().cos() - x.detach() * x.detach().sin()))


@requires_cuda
def test_pointwise_combo_kernels_on_cuda_match_eager(monkeypatch):
    """On a GPU the combos are on in the forward's compile, not the backward's (COMBO_ROLES),
    and the step computes what eager does."""
    import torch._inductor.compile_fx as compile_fx
    from torch._inductor import config as inductor_config
    seen, inner = [], compile_fx.compile_fx_inner

    def spy(gm, example_inputs, **kwargs):
        seen.append((inductor_config.combo_kernels, inductor_config.combo_kernels_pointwise_only))
        return inner(gm, example_inputs, **kwargs)
    monkeypatch.setattr(compile_fx, "compile_fx_inner", spy)

    def f(a, b):  # two independent pointwise chains: a combo's case
        return (a.sin() * 2).sum() + (b.exp() + 1).mean()
    a, b = (torch.randn(256, 64, device="cuda", requires_grad=True) for _ in range(2))
    ea, eb = (t.detach().clone().requires_grad_() for t in (a, b))
    with inductor_config.patch(fx_graph_cache=False):
        aotgrad.compile(f, backend="inductor")(a, b).backward()
    f(ea, eb).backward()
    assert seen[0] == (True, True) and [combos for combos, _ in seen] == [True, False]
    torch.testing.assert_close((a.grad, b.grad), (ea.grad, eb.grad))


SETTINGS_DOORS = {  # torch.compile's mode and options, on each door that takes them
    "torch.compile": lambda f, mode, options: torch.compile(f, backend="aotgrad", mode=mode,
                                                            options=options),
    "aotgrad.compile": lambda f, mode, options: aotgrad.compile(f, mode=mode, options=options),
    "aotgrad.backend": lambda f, mode, options: torch.compile(
        f, backend=aotgrad.backend(mode=mode, options=options)),
}


@pytest.mark.parametrize("door", list(SETTINGS_DOORS))
@pytest.mark.parametrize("mode, options, wanted", [
    ("max-autotune-no-cudagraphs", None,
     {"max_autotune": True, "coordinate_descent_tuning": True}),
    (None, {"max_fusion_size": 7}, {"max_fusion_size": 7}),
], ids=["mode", "options"])
def test_torch_compiles_mode_and_options_reach_inductor_at_each_compile(monkeypatch, mode,
                                                                        options, wanted, door):
    """As with backend="inductor": the forward's compile and the backward's, which comes
    later (at the first backward), both run under the settings; values stay eager's."""
    import torch._inductor.compile_fx as compile_fx
    import torch._inductor.fx_passes.joint_graph as joint_graph
    from torch._inductor import config as inductor_config
    seen, inner, passes = {}, compile_fx.compile_fx_inner, joint_graph.joint_graph_passes

    def spy(gm, example_inputs, **kwargs):
        role = "backward" if kwargs.get("is_backward") else "forward"
        seen[role] = {k: getattr(inductor_config, k) for k in wanted}
        return inner(gm, example_inputs, **kwargs)

    def spy_passes(gm, **kwargs):  # the joint graph's rewrites, before the partition
        seen["passes"] = {k: getattr(inductor_config, k) for k in wanted}
        return passes(gm, **kwargs)
    monkeypatch.setattr(compile_fx, "compile_fx_inner", spy)
    monkeypatch.setattr(joint_graph, "joint_graph_passes", spy_passes)
    torch._dynamo.reset()
    f = SETTINGS_DOORS[door](lambda t: (t.sin() * t).exp(), mode, options)
    x = torch.randn(4, 8, requires_grad=True)
    with inductor_config.patch(fx_graph_cache=False):
        out = f(x)
        assert seen == {"passes": wanted, "forward": wanted}
        out.sum().backward()
    assert seen == {"passes": wanted, "forward": wanted, "backward": wanted}
    t = x.detach().requires_grad_()
    (t.sin() * t).exp().sum().backward()
    torch.testing.assert_close(out, (t.sin() * t).exp())
    torch.testing.assert_close(x.grad, t.grad)
    assert not any(getattr(inductor_config, k) == v for k, v in wanted.items())  # put back


def test_torch_compiles_settings_win_over_the_backends_own(monkeypatch):
    """`aotgrad.backend(options=...)` sets the defaults of its graphs; torch.compile's
    `options` for one model change the settings it names, and only those."""
    import torch._inductor.compile_fx as compile_fx
    from torch._inductor import config as inductor_config
    seen, inner = [], compile_fx.compile_fx_inner

    def spy(gm, example_inputs, **kwargs):
        seen.append((inductor_config.max_fusion_size, inductor_config.epilogue_fusion))
        return inner(gm, example_inputs, **kwargs)
    monkeypatch.setattr(compile_fx, "compile_fx_inner", spy)
    torch._dynamo.reset()
    chosen = aotgrad.backend(options={"max_fusion_size": 7, "epilogue_fusion": False})
    f = torch.compile(lambda t: t.sin() * 2, backend=chosen, options={"max_fusion_size": 9})
    with inductor_config.patch(fx_graph_cache=False), torch.no_grad():
        f(torch.randn(4))
    assert seen == [(9, False)]


@pytest.mark.parametrize("kwargs, error, match", [
    ({"options": "cpp_wrapper"}, TypeError, "compile: options must be a dict of Inductor"),
    ({"mode": 1}, TypeError, "compile: mode must be a torch.compile mode"),
    ({"mode": "fastest"}, ValueError, "mode='fastest'.*max-autotune"),
    ({"options": {"max_autotuning": True}}, ValueError, "'max_autotuning', which is not an"),
    ({"backend": "eager", "mode": "max-autotune"}, ValueError, "does not compile with Induc"),
    ({"options": {"freezing": True}}, ValueError, "'freezing' acts before the graph compile"),
])
def test_aotgrad_compile_refuses_settings_it_cannot_apply_when_called(kwargs, error, match):
    with pytest.raises(error, match=f"aotgrad: .*{match}"):
        aotgrad.compile(lambda t: t.sin(), **kwargs)
    with pytest.raises(error, match=f"aotgrad: .*{match.replace('compile:', 'backend:')}"):
        aotgrad.backend(**kwargs)


def test_inductor_settings_enter_aotgrads_cache_key():
    """A compile under other Inductor settings never loads another's entry: the settings
    are part of the key, and the default key is as it was."""
    from aotgrad.cache.key import backend_components
    def options(**settings):
        return aotgrad.api.checked_options("compile", backend="inductor", partitioner=None,
                                           memory_budget=None, decompositions=None, **settings)
    default = dict(backend_components(options().backend))
    tuned = dict(backend_components(options(options={"max_fusion_size": 7}).backend))
    assert "inductor settings" not in default
    assert tuned["inductor settings"] == "(('max_fusion_size', 7),)"


@pytest.mark.xfail(not mends.generators_traceable(), raises=NotImplementedError, strict=True,
                   reason="torch 2.11's tracer cannot hold a torch.Generator: refused by name")
@pytest.mark.parametrize("grad", [True, False], ids=["training", "inference"])
def test_inductor_draws_from_the_users_generator_on_every_compile(tmp_path, monkeypatch, grad):
    """Inductor's FX graph cache stored the graph's generator pickled: the second compile
    of the same graph (a hit) drew from a copy, other numbers than eager, and left the
    user's generator as it was."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # Inductor's cache: on

    def f(x, g):
        return x * torch.rand(x.shape, generator=g)

    x = torch.ones(4, requires_grad=grad)
    g = torch.Generator().manual_seed(3)
    expected = [f(x, g), f(x, g)], g.get_state()
    for _ in range(2):  # the second compile's graph is the first's
        g = torch.Generator().manual_seed(3)
        compiled = aotgrad.compile(f, backend="inductor")
        torch.testing.assert_close(([compiled(x, g), compiled(x, g)], g.get_state()), expected)


def test_a_generator_the_tracer_cannot_hold_is_refused_by_name(monkeypatch):
    """torch 2.11's tracer raised its own 'argument of type: Generator' from deep inside the
    trace; where the installed torch cannot hold one, the op drawing from it is named."""
    monkeypatch.setattr(mends, "generators_traceable", lambda: False)
    compiled = aotgrad.compile(lambda x, g: x * torch.rand(x.shape, generator=g))
    with pytest.raises(NotImplementedError, match=r"aotgrad: rand\(generator=...\) draws from "
                                                  r"a torch.Generator"):
        compiled(torch.ones(4), torch.Generator())


def test_the_default_generator_by_name_draws_where_the_tracer_cannot_hold_one(monkeypatch):
    """Passing `torch.default_generator` means no generator at all: torch 2.11 refused it
    (GPU machine, session 23) where dropping the argument draws the same numbers."""
    monkeypatch.setattr(mends, "generators_traceable", lambda: False)
    f = lambda x: x * torch.rand(x.shape, generator=torch.default_generator)  # noqa: E731
    compiled = aotgrad.compile(f, backend="eager")
    torch.manual_seed(0)
    want = f(torch.ones(4)), torch.rand(2)
    torch.manual_seed(0)
    torch.testing.assert_close((compiled(torch.ones(4)), torch.rand(2)), want)


def _negative() -> torch.Tensor:
    return torch._neg_view(torch.randn(4))


def _imag_of_conjugate() -> torch.Tensor:  # negative, and strided
    return torch.randn(4, dtype=torch.complex64).conj().imag


@pytest.mark.parametrize("fn, make", [
    (lambda x: (x * 2, x[1:]), _negative),  # read, and returned as a view
    (lambda x: x.add_(1), _negative),  # written in place
    (lambda x: x.exp(), _imag_of_conjugate),
], ids=["read", "written", "imag_of_conjugate"])
def test_inductor_reads_a_negative_input_by_its_values(fn, make):
    # Was: Inductor's code read a negative input's memory as its values: every result
    # negated, silently (torch.compile's own Inductor does so too).
    from harness import Case, check_case
    check_case(Case("negative_input", lambda: ((make(),), {}), fn=fn),
               lambda f: aotgrad.compile(f, backend="inductor"))


def test_inductor_backward_reads_a_negative_gradient_by_its_values():
    # Was: `y.backward(torch._neg_view(g))` handed the negative gradient to Inductor's
    # backward as it was (a contiguous one is passed unchanged): the gradient came out negated.
    x = torch.randn(4, requires_grad=True)
    g = torch._neg_view(torch.randn(4))
    aotgrad.compile(lambda t: t.sin() * 2, backend="inductor")(x).backward(g)
    compiled, x.grad = x.grad, None
    (x.sin() * 2).backward(g)
    torch.testing.assert_close(compiled, x.grad)


def test_inductor_reads_a_negative_constant_by_its_values_and_still_the_callers_tensor():
    # Was: a closed-over negative tensor reached Inductor's code as the graph's attribute,
    # its memory read as its values: results negated, silently.
    k = torch._neg_view(torch.arange(1.0, 5.0))
    f = lambda x: (x * k, k * 2)  # noqa: E731 - read twice: one attribute, two reads
    compiled = aotgrad.compile(f, backend="inductor")
    x = torch.randn(4)
    for _ in range(2):
        for got, want in zip(compiled(x), f(x)):
            torch.testing.assert_close(got, want)
        k.add_(1)  # the graph holds the caller's tensor, as eager reads it


def _output_and_its_detach(x, w):
    h = x * w
    return h, h.detach()


def _detach_then_output(x, w):
    h = x * w
    return h.detach(), h


@pytest.mark.parametrize("order", ["output_first", "detach_first"])
@pytest.mark.parametrize("door", ["compile", "dynamo"])
def test_an_output_and_its_detach_inductor_returns_as_one_tensor_keep_eagers_gradient(
        door, order):
    """Inductor drops `detach` as a no-op and returns one tensor for both outputs; marking it
    non-differentiable took the gradient off the output that has one, silently (in either
    order: a review mend that looked only at later outputs lost it with the detach first)."""
    torch._dynamo.reset()
    f = _output_and_its_detach if order == "output_first" else _detach_then_output
    fn = (aotgrad.compile(f, backend="inductor") if door == "compile"
          else torch.compile(f, backend=aotgrad.backend()))
    x, w = torch.randn(4, 6), torch.randn(4, 6, requires_grad=True)
    h, detached = fn(x, w) if order == "output_first" else fn(x, w)[::-1]
    assert h is not detached and h.grad_fn is not None and detached.grad_fn is None
    assert detached.data_ptr() == h.data_ptr() and detached._base is None
    h.sum().backward()
    torch.testing.assert_close(w.grad, x)


@pytest.mark.parametrize("door", ["compile", "dynamo"])
@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "input_without_grad"])
def test_an_output_and_its_detach_inductor_returns_as_one_tensor_are_two_tensors(door, grad):
    """Without a gradient to mark, the caller got the one tensor twice: `requires_grad_()`
    on the detached output turned the other into a leaf that requires grad too."""
    torch._dynamo.reset()
    fn = (aotgrad.compile(_output_and_its_detach, backend="inductor") if door == "compile"
          else torch.compile(_output_and_its_detach, backend=aotgrad.backend()))
    with torch.set_grad_enabled(grad):
        h, detached = fn(torch.randn(4, 6), torch.randn(4, 6))
    assert h is not detached and detached.data_ptr() == h.data_ptr()
    detached.requires_grad_()
    assert not h.requires_grad


def _channels_last(requires_grad: bool) -> torch.Tensor:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, 4).to(memory_format=torch.channels_last)
    return x.requires_grad_(requires_grad)


def _repeated_cat(x):
    return torch.cat([x, x], 1)


def _repeated_cat_and_a_strided_view(x):
    y = torch.cat([x, x], 1)
    return y, y.as_strided((4,), (1,), 0)  # reads y's memory in eager's (channels-last) order


def _repeated_stack_flattened(x):
    return torch.stack([x, x], 1).permute(0, 3, 4, 1, 2).reshape(-1)  # a view in eager


def _compiled(fn, door):
    torch._dynamo.reset()
    return (aotgrad.compile(fn, backend="inductor") if door == "compile"
            else torch.compile(fn, backend=aotgrad.backend()))


@pytest.mark.parametrize("fn", [_repeated_cat, _repeated_cat_and_a_strided_view,
                                _repeated_stack_flattened])
@pytest.mark.parametrize("door", ["compile", "dynamo"])
@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "requires_grad"])
def test_a_decomposition_keeps_eagers_layout(fn, door, grad):
    """Inductor decomposes `cat` of one tensor repeated into expand/flatten/clone, contiguous:
    the output lost eager's channels-last strides; a view eager makes of it by `as_strided`
    read other elements (values and x.grad silently wrong); and a reshape that is a view in
    eager was a copy in the trace (an AttributeError, or 'view size is not compatible')."""
    expected = fn(_channels_last(grad))
    x = _channels_last(grad)
    got = _compiled(fn, door)(x)
    for e, g in zip(_leaves(expected), _leaves(got)):
        assert (g.stride(), g.storage_offset(), g._is_view()) == \
            (e.stride(), e.storage_offset(), e._is_view())
        assert torch.equal(g, e)
    if grad:
        x_e = _channels_last(True)
        _weighted_sum(fn(x_e)).backward()
        _weighted_sum(got).backward()
        assert torch.equal(x.grad, x_e.grad)


def _conv_two_ways(x, w):
    y = torch.nn.functional.conv2d(x, w, padding=1)
    return y.relu(), y.sigmoid()


# The gradient a caller's backward may hand a channels-last output.
INCOMING_GRADS = {
    "channels_last": lambda shape: torch.randn(shape).to(memory_format=torch.channels_last),
    "contiguous": lambda shape: torch.randn(shape),
    "expanded": lambda shape: torch.ones(()).expand(shape),  # the grad of a .sum()
    "transposed": lambda shape: torch.randn(shape[::-1]).permute(3, 2, 1, 0),
    "unused": lambda shape: None,  # the loss leaves the output out: zeros
}


@pytest.mark.parametrize("incoming", list(INCOMING_GRADS))
@pytest.mark.parametrize("door", ["compile", "dynamo"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=requires_cuda)])
def test_a_channels_last_outputs_gradient_may_come_in_any_layout(device, door, incoming):
    """The backward graph takes a channels-last output's gradient channels-last, as torch's
    does (a convolution's backward then reads no transposed copy): one in another layout,
    or none, is made channels-last before Inductor's graph, which checks its inputs'
    strides."""
    w = torch.randn(5, 3, 3, 3, device=device)
    x_e, x = (_channels_last(True).detach().to(device).requires_grad_() for _ in range(2))
    expected, got = _conv_two_ways(x_e, w), _compiled(_conv_two_ways, door)(x, w)
    assert [g.stride() for g in got] == [e.stride() for e in expected]
    grad = INCOMING_GRADS[incoming](expected[0].shape)
    grad = grad if grad is None else grad.to(device)
    for relu, sigmoid in (expected, got):
        if grad is None:
            relu.backward(torch.ones_like(relu))
        else:
            torch.autograd.backward([relu, sigmoid], [grad, grad])
    torch.testing.assert_close(x.grad, x_e.grad)
    assert x.grad.stride() == x_e.grad.stride()


def _leaves(outputs) -> list:
    return torch.utils._pytree.tree_leaves(outputs)


def _weighted_sum(outputs) -> torch.Tensor:
    return sum(o.sum() * k for k, o in enumerate(_leaves(outputs), 1))


def _transposed() -> torch.Tensor:
    return torch.randn(6, 5).t()


def _permuted() -> torch.Tensor:
    return torch.randn(5, 5, 5).permute(0, 2, 1)


@pytest.mark.xfail(strict=True, reason="torch's meta kernels of channel_shuffle and "
                   "max_unpool2d keep no channels-last layout, and those of log_sigmoid_forward "
                   "and native_batch_norm keep the input's transposed layout, where eager's CPU "
                   "kernels do the opposite: every trace (aotgrad's and torch's) takes the meta "
                   "kernel's strides, so the compiled output has them")
@pytest.mark.parametrize("fn, make", [
    (lambda x: torch.nn.functional.channel_shuffle(torch.cat([x, x[:, :1]], 1), 2),
     lambda: _channels_last(False)),
    (lambda x: torch.nn.functional.max_unpool2d(*torch.nn.functional.max_pool2d(
        x, 2, return_indices=True), 2), lambda: _channels_last(False)),
    (torch.nn.functional.logsigmoid, _transposed),
    (lambda x: torch.nn.functional.batch_norm(x, None, None, training=True), _permuted),
], ids=["channel_shuffle", "max_unpool2d", "logsigmoid", "batch_norm"])
def test_an_op_whose_meta_strides_differ_from_eagers_cpu_kernel(fn, make):
    torch.manual_seed(0)
    x = make()
    expected = fn(x)
    got = aotgrad.compile(fn, backend="inductor")(x)
    torch.testing.assert_close(got, expected)
    assert got.stride() == expected.stride()


@pytest.mark.parametrize("door", ["compile", "dynamo"])
def test_a_decomposition_keeps_eagers_layout_at_symbolic_sizes(door):
    """The same with dynamic shapes: one graph serves both sizes, channels-last at each (the
    meta kernel's symbolic strides are read outside the trace: arithmetic on them inside
    failed as 'not tracked with proxy', and Dynamo's graph fell back to static shapes)."""
    torch._dynamo.reset()
    fn = _repeated_cat_and_a_strided_view
    compiled = (aotgrad.compile(fn, backend="inductor", dynamic=True) if door == "compile"
                else torch.compile(fn, backend=aotgrad.backend(), dynamic=True))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        for shape in [(2, 3, 4, 4), (3, 3, 5, 5)]:
            x = torch.randn(*shape).to(memory_format=torch.channels_last)
            (y, v), (ey, ev) = compiled(x), fn(x)
            assert y.stride() == ey.stride() and torch.equal(v, ev)
    if door == "compile":
        assert len(compiled.artifacts) == 1
