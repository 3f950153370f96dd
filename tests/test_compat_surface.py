"""aotgrad.compat against torch's functorch.compile: every public name, every keyword, the
refusals torch makes, and the export conventions tools rely on."""

import contextlib
import inspect
import re

import functorch.compile as torch_compile
import pytest
import torch
import torch._functorch.aot_autograd as torch_aot
import torch._functorch.config as torch_config

from aotgrad import compat

EXPORT_NAMES = ["aot_export_module", "aot_export_joint_simple",
                "aot_export_joint_with_descriptors", "aot_compile_joint_with_descriptors"]
PUBLIC = sorted({n for n in dir(torch_compile) if not n.startswith("_")} | set(EXPORT_NAMES))


def _torch_public(name):
    return getattr(torch_compile, name, None) or getattr(torch_aot, name)


def _comparable(default) -> bool:
    return default is None or isinstance(default, (bool, int, float, str))


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_name_resolves(name):
    assert hasattr(compat, name), name


@pytest.mark.parametrize("name", [n for n in PUBLIC if callable(_torch_public(n))
                                  and inspect.isfunction(inspect.unwrap(_torch_public(n)))])
def test_signature_accepts_every_keyword_torch_does(name):
    """A keyword the installed torch adds fails here, not in a user's call."""
    theirs = inspect.signature(_torch_public(name)).parameters
    ours = inspect.signature(getattr(compat, name)).parameters
    for pname, p in theirs.items():
        assert pname in ours, f"{name} lacks {pname}"
        assert ours[pname].kind == p.kind, f"{name}.{pname}: {ours[pname].kind} != {p.kind}"
        if _comparable(p.default) and p.default is not inspect.Parameter.empty:
            assert ours[pname].default == p.default, f"{name}.{pname}"
    extra = [q for n, q in ours.items() if n not in theirs]
    assert all(q.default is not inspect.Parameter.empty or q.kind in (q.VAR_POSITIONAL,
               q.VAR_KEYWORD) for q in extra), f"{name}: required parameters torch lacks"
    assert not any(q.kind is q.VAR_KEYWORD for q in ours.values()) or any(
        q.kind is q.VAR_KEYWORD for q in theirs.values()), f"{name} swallows keywords"


def test_unknown_name_is_an_attribute_error():
    assert not hasattr(compat, "no_such_thing")
    with pytest.raises(AttributeError):
        compat.no_such_thing


def test_default_decompositions_match_torchs():
    assert set(compat.default_decompositions) == set(torch_compile.default_decompositions)


def test_aot_module_simplified_refuses_unknown_keywords():
    with pytest.raises(TypeError):
        compat.aot_module_simplified(torch.nn.Linear(2, 2), [torch.randn(1, 2)], compat.nop,
                                     no_such_keyword=1)


# ---- config ---------------------------------------------------------------------------------

def test_config_has_torchs_flags_with_torchs_defaults():
    for name, value in torch_config.get_config_copy().items():
        if name in torch_config._config and not name.startswith("_"):
            assert getattr(compat.config, name) == torch_config._config[name].default, name


def test_config_saves_restores_and_prints_as_torchs_config_module_does():
    """Code that snapshots torch's config (get_config_copy, save_config, load_config,
    get_hash, codegen_config) runs on compat's too."""
    for method in ("get_config_copy", "save_config", "load_config", "get_hash", "codegen_config",
                   "to_dict", "shallow_copy_dict"):
        assert callable(getattr(torch_config, method)) and callable(getattr(compat.config, method))
    saved, copy, digest = (compat.config.save_config(), compat.config.get_config_copy(),
                           compat.config.get_hash())
    with compat.config.patch(activation_memory_budget=0.5):
        assert compat.config.get_hash() != digest
        assert compat.config.codegen_config() == \
            "aotgrad.compat.config.activation_memory_budget = 0.5"
        compat.config.load_config(saved)
        assert compat.config.activation_memory_budget == copy["activation_memory_budget"]
        compat.config.load_config({"activation_memory_budget": 0.25})
        assert compat.config.activation_memory_budget == 0.25
    assert compat.config.get_config_copy() == copy and compat.config.get_hash() == digest
    with pytest.raises(NotImplementedError, match="config.cse=False"):
        compat.config.load_config({"cse": False})


def test_config_refuses_values_it_would_ignore():
    with pytest.raises(NotImplementedError, match="aotgrad: config.cse=False"):
        compat.config.cse = False
    with pytest.raises(AttributeError):
        compat.config.no_such_flag = 1
    compat.config.cse = True  # the default is always accepted


def test_config_memory_budget_takes_effect():
    x = torch.randn(64, 64, requires_grad=True)

    def f(x):
        return (x.sin().cos().exp() @ x).sin().sum()

    saved = {}
    for budget in (1.0, 0.0):
        def bw(gm, _):
            saved[budget] = len(gm.graph.find_nodes(op="placeholder"))
            return gm
        with compat.config.patch(activation_memory_budget=budget):
            g = compat.aot_function(f, compat.nop, bw,
                                    partition_fn=compat.min_cut_rematerialization_partition)
        out = g(x)
        out.backward()  # the backward compiles at the first backward, as torch's does
        torch.testing.assert_close(out, f(x))
    assert compat.config.activation_memory_budget == 1.0  # the patch is undone
    assert saved[0.0] <= saved[1.0]



def test_config_memory_budget_reaches_a_partial_of_the_min_cut_partitioner():
    """A backend passing `partial(min_cut_rematerialization_partition, compiler=...)`, as
    torch's Inductor does, got the plain min-cut: the budget was ignored, silently."""
    import functools
    from aotgrad.partition.budget import budget_of
    partial = functools.partial(compat.min_cut_rematerialization_partition, compiler="inductor")
    with compat.config.patch(activation_memory_budget=0.5):
        assert budget_of(compat.config.partitioner(partial)) == (0.5, "auto")
        assert budget_of(compat.config.partitioner(compat.default_partition)) is None
    assert compat.config.partitioner(partial) is partial

# ---- compilers and tools --------------------------------------------------------------------

def _check_training(compile_fn):
    def f(x, w):
        return (x @ w).relu().sum(dim=1) * 2
    x, w = torch.randn(4, 3), torch.randn(3, 5, requires_grad=True)
    w2 = w.detach().clone().requires_grad_()
    out = compile_fn(f)(x, w)
    out.sum().backward()
    f(x, w2).sum().backward()
    torch.testing.assert_close(out, f(x, w2))
    torch.testing.assert_close(w.grad, w2.grad)


def test_print_compile_prints_each_graph(capsys):
    _check_training(lambda f: compat.aot_function(f, compat.print_compile))
    printed = capsys.readouterr().out
    assert printed.count("def forward") == 2


@pytest.mark.parametrize("tool", ["ts_compile", "nnc_jit", "memory_efficient_fusion"])
def test_torchscript_compilers_match_eager(tool):
    if tool == "ts_compile":
        _check_training(lambda f: compat.aot_function(f, compat.ts_compile))
    else:
        _check_training(getattr(compat, tool))



@pytest.mark.parametrize("tool", ["ts_compile", "memory_efficient_fusion"])
def test_torchscript_compilers_script_inference_graphs(tool):
    """The inference graph reached compilers as a lazy GraphModule (torch hands a plain
    one), which torch.jit.script refuses: ts_compile failed under no_grad and in eval."""
    mod = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)).eval()
    x = torch.randn(2, 3)
    if tool == "ts_compile":
        compiled = compat.aot_module(mod, compat.ts_compile)
    else:
        compiled = compat.memory_efficient_fusion(mod)
    with torch.no_grad():
        out = compiled(x)
    assert not out.requires_grad
    torch.testing.assert_close(out, mod(x))


def test_memory_efficient_fusion_compiles_modules():
    mod = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.GELU())
    x = torch.randn(2, 3)
    compiled = compat.memory_efficient_fusion(mod, fw_compiler=compat.nop)
    torch.testing.assert_close(compiled(x), mod(x))


def test_debug_compile_saves_a_runnable_graph(capsys):
    _check_training(lambda f: compat.aot_function(f, compat.debug_compile))
    assert "minifier(" in capsys.readouterr().out


def test_draw_graph_writes_or_names_what_is_missing(tmp_path):
    gm = torch.fx.symbolic_trace(lambda x: x.sin())
    try:
        import pydot  # noqa: F401
    except ImportError:
        with pytest.raises(RuntimeError, match="aotgrad: draw_graph needs the pydot"):
            compat.draw_graph(gm, str(tmp_path / "g.dot"))
        return
    compat.draw_graph(gm, str(tmp_path / "g.dot"))
    assert (tmp_path / "g.dot").exists()


def _graph_names(api) -> list[tuple[str, tuple]]:
    seen = []

    def compiler(gm, _):
        seen.append((api.get_graph_being_compiled(), api.get_aot_compilation_context()))
        return api.make_boxed_func(gm.forward)
    f = api.aot_function(lambda x: x.cos(), compiler, inference_compiler=compiler)
    f(torch.randn(2, requires_grad=True)).sum().backward()
    with torch.no_grad():
        api.aot_function(lambda x: x.sin(), compiler, inference_compiler=compiler)(torch.randn(2))
    return seen


def _name_parts(name: str, context: tuple) -> tuple:
    """`model__<compile id>_<graph>_<graphs compiled before>`, and the context it is made of."""
    match = re.fullmatch(r"model__(\d+)_(\w+)_(\d+)", name)
    assert match, name
    graphs, model, nth = context
    assert graphs == [f"{match[1]}_{match[2]}"] and model == "model" and nth == int(match[3])
    return int(match[1]), match[2], int(match[3])


@pytest.mark.parametrize("api", [torch_compile, compat], ids=["functorch", "compat"])
def test_graph_being_compiled_is_named_as_torch_names_it(api):
    """Tools name files after it (Inductor's debug folders, the partitioner's plots): compat
    gave `<lambda>__forward_1` and the same number to every graph of a compile."""
    (fw_id, fw, fw_n), (bw_id, bw, bw_n), (inf_id, inf, inf_n) = (
        _name_parts(*seen) for seen in _graph_names(api))
    assert (fw, bw, inf) == ("forward", "backward", "inference")
    assert fw_id == bw_id < inf_id and fw_n < bw_n < inf_n


def test_pythonkey_decompose_and_minifier_are_torchs_tools():
    assert compat.pythonkey_decompose is torch_compile.pythonkey_decompose
    gm = torch.fx.symbolic_trace(lambda x: (x.sin() + 1).cos())
    def has_sin(g, inps):
        return any(n.target == "sin" for n in g.graph.nodes)
    small, _ = compat.minifier(gm, [torch.randn(3)], has_sin)
    assert has_sin(small, None) and len(small.graph.nodes) < len(gm.graph.nodes)


# ---- keywords -------------------------------------------------------------------------------

def test_aot_function_takes_torchs_new_keywords():
    _check_training(lambda f: compat.aot_function(f, compat.nop, enable_log=False,
                                                  disable_functionalization=True))


def test_aot_module_simplified_runs_pre_grad_passes():
    gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(3, 3)))
    seen = []

    def pass_(mod, args):
        seen.append(len(args))
        return mod
    x = torch.randn(2, 3)
    fwd = compat.aot_module_simplified(gm, [x], compat.nop, pre_grad_passes=pass_,
                                       compile_region_name="r", ignore_shape_env=True,
                                       compiler_config_extra=None,
                                       disable_functionalization=False)
    assert seen == [1]
    torch.testing.assert_close(fwd(x), gm(x))


# ---- export ---------------------------------------------------------------------------------

class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(3, 3)
        self.register_buffer("b", torch.zeros(3))

    def forward(self, x):
        self.b.add_(1)
        y = self.l(x)
        return (y.sum(), y.detach() * 2)


@pytest.mark.parametrize("trace_joint", [False, True])
def test_export_names_inputs_as_torch(trace_joint):
    kw = {"trace_joint": trace_joint, "output_loss_index": 0 if trace_joint else None}
    ours, sig = compat.aot_export_module(_Net(), (torch.randn(2, 3),), **kw)
    theirs, tsig = torch_aot.aot_export_module(_Net(), (torch.randn(2, 3),), **kw)
    names = [n.name for n in ours.graph.find_nodes(op="placeholder")]
    assert names == [n.name for n in theirs.graph.find_nodes(op="placeholder")]
    assert sig.inputs_to_parameters == tsig.inputs_to_parameters
    assert sig.inputs_to_buffers == tsig.inputs_to_buffers
    assert sig.user_inputs == tsig.user_inputs
    assert sig.in_spec == tsig.in_spec


class _Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(3, 3)

    def forward(self, x):
        return (self.l(x),)


def test_export_pre_dispatch_keeps_torch_level_ops():
    mod = _Linear()
    ours, _ = compat.aot_export_module(mod, (torch.randn(2, 3),), trace_joint=False,
                                       pre_dispatch=True)
    theirs, _ = torch_aot.aot_export_module(mod, (torch.randn(2, 3),), trace_joint=False,
                                            pre_dispatch=True)
    targets = {n.target for n in ours.graph.nodes if n.op == "call_function"}
    assert torch.ops.aten.linear.default in targets
    assert targets == {n.target for n in theirs.graph.nodes if n.op == "call_function"}
    with pytest.raises(RuntimeError, match="pre_dispatch is not supported"):
        compat.aot_export_module(mod, (torch.randn(2, 3),), trace_joint=True,
                                 output_loss_index=0, pre_dispatch=True)


def test_export_kwargs_and_dynamic_shapes():
    class K(torch.nn.Module):
        def forward(self, x, *, y):
            return (x * y,)
    x, y = torch.randn(2), torch.randn(2)
    gm, sig = compat.aot_export_module(K(), (x,), trace_joint=False, kwargs={"y": y})
    _, tsig = torch_aot.aot_export_module(K(), (x,), trace_joint=False, kwargs={"y": y})
    assert sig.user_inputs == tsig.user_inputs and sig.in_spec == tsig.in_spec
    torch.testing.assert_close(gm(x, y)[0], x * y)
    gm, _ = compat.aot_export_module(K(), (torch.randn(4),), trace_joint=False,
                                     kwargs={"y": torch.randn(4)}, dynamic_shapes=True)
    val = gm.graph.find_nodes(op="placeholder")[0].meta["val"]
    assert isinstance(val.shape[0], torch.SymInt)


# ---- refusals torch makes -------------------------------------------------------------------

def _refusals():
    net = (_Net(), (torch.randn(2, 3),))

    class TwoGrads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l = torch.nn.Linear(3, 3)

        def forward(self, x):
            y = self.l(x)
            return (y.sum(), y)

    class Dict(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l = torch.nn.Linear(3, 3)

        def forward(self, d):
            return (self.l(d["x"]).sum(),)
    return {
        "two_grad_outputs": lambda api: api.aot_export_module(
            TwoGrads(), (torch.randn(2, 3),), trace_joint=True, output_loss_index=0),
        "pytree_joint_inputs": lambda api: api.aot_export_module(
            Dict(), ({"x": torch.randn(2, 3)},), trace_joint=True, output_loss_index=0),
        "simple_pytree_inputs": lambda api: api.aot_export_joint_simple(
            lambda d: (d["a"].sin(),), ({"a": torch.randn(2)},), trace_joint=False),
        "simple_pytree_outputs": lambda api: api.aot_export_joint_simple(
            lambda x: ({"a": x.sin()},), (torch.randn(2),), trace_joint=False),
        "functionalized_rng": lambda api: _with_rng(api, lambda: api.aot_export_module(
            *net, trace_joint=False)),
    }


def _with_rng(api, export):
    config = compat.config if api is compat else torch_config
    with config.patch(functionalize_rng_ops=True):
        return export()


@pytest.mark.parametrize("case", sorted(_refusals()))
def test_export_refuses_what_torch_refuses(case):
    for api in (torch_aot, compat):
        with pytest.raises(RuntimeError):
            _refusals()[case](api)


def test_fake_module_state_is_refused_as_torch_refuses():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        lin = torch.nn.Linear(3, 3)
    with pytest.raises(AssertionError, match="Unexpected fake param weight"):
        torch_aot.aot_module(lin, compat.nop)
    with pytest.raises(AssertionError, match="Unexpected fake param weight"):
        compat.aot_module(lin, compat.nop)


def test_fake_tensor_closed_over_by_simplified_graph_is_refused():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        fake = torch.randn(3)

    class Closes(torch.nn.Module):
        def forward(self, x):
            return (x + fake,)
    gm = torch.fx.symbolic_trace(Closes())
    with pytest.raises(AssertionError, match="Unexpected fake buffer"):
        compat.aot_module_simplified(gm, [torch.randn(3)], compat.nop)


def test_outputs_grad_fn_is_named_as_torchs():
    x = torch.randn(3, requires_grad=True)
    ours = compat.aot_function(lambda x: x.sin() * 2, compat.nop)(x)
    theirs = torch_aot.aot_function(lambda x: x.sin() * 2, torch_compile.nop)(x)
    assert ours.grad_fn.name() == theirs.grad_fn.name() == "CompiledFunctionBackward"


# ---- joint export with descriptors ----------------------------------------------------------

class _Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(3, 3)
        self.register_buffer("b", torch.zeros(3))

    def forward(self, x, *, scale):
        self.b.add_(1)
        return self.l(x).relu() * scale + self.b, x.sin()


def _descs(api, mod, x, scale):
    with contextlib.ExitStack() as stack:
        jd = api.aot_export_joint_with_descriptors(stack, mod, (x,), {"scale": scale})
        gm = jd.graph_module
        inputs = [n.meta["desc"] for n in gm.graph.find_nodes(op="placeholder")
                  if not isinstance(n.meta["desc"].expr(), str)
                  or "args[1]" not in n.meta["desc"].expr()]  # torch lifts the float too
        outputs = gm.graph.output_node().meta["desc"]
        return jd, [d.expr() for d in inputs], [d and d.expr() for d in outputs]


def test_joint_descriptors_match_torchs():
    x = torch.randn(2, 3, requires_grad=True)
    jd, ins, outs = _descs(compat, _Scaled(), x, 2.0)
    _, tins, touts = _descs(torch_aot, _Scaled(), x, 2.0)
    assert ins == tins
    assert [o for o in outs if o] == [o for o in touts if o]
    assert (jd.params_spec, jd.buffers_spec) == (["l.weight", "l.bias"], ["b"])


def test_joint_compiles_to_a_callable_that_matches_eager():
    torch.manual_seed(0)
    mod, ref = _Scaled(), _Scaled()
    ref.load_state_dict(mod.state_dict())
    x = torch.randn(2, 3, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    with contextlib.ExitStack() as stack:
        jd = compat.aot_export_joint_with_descriptors(stack, mod, (x,), {"scale": 2.0})
        f = compat.aot_compile_joint_with_descriptors(jd)
    out = f(*mod.parameters(), *mod.buffers(), x, scale=2.0)
    expected = ref(x2, scale=2.0)
    (out[0].sum() + out[1].sum()).backward()
    (expected[0].sum() + expected[1].sum()).backward()
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(x.grad, x2.grad)
    torch.testing.assert_close(mod.l.weight.grad, ref.l.weight.grad)
    torch.testing.assert_close(mod.b, ref.b)


@pytest.mark.xfail(raises=NotImplementedError, strict=True,
                   reason="aotgrad compiles the joint as exported; a replaced joint graph "
                          "(torch allows it) is refused")
def test_joint_graph_replaced_after_export_compiles():
    x = torch.randn(2, 3, requires_grad=True)
    mod = _Scaled()
    with contextlib.ExitStack() as stack:
        jd = compat.aot_export_joint_with_descriptors(stack, mod, (x,), {"scale": 2.0})
        jd.graph_module = torch.fx.GraphModule(jd.graph_module, jd.graph_module.graph)
        compat.aot_compile_joint_with_descriptors(jd)


class _ListInput(torch.nn.Module):
    def forward(self, xs, y):
        return (xs[0] * y + xs[1],)


@pytest.mark.parametrize("api", [torch_compile, compat], ids=["functorch", "compat"])
def test_simplified_compiles_a_graph_flattened_by_dynamo(api):
    """A backend written for torch compiles a graph with nested inputs through Dynamo's
    `flatten_graph_inputs`, which hands aot_module_simplified a GmWrapper and calls the
    result with one list: compat's took the list as the only input and raised InputsChanged."""
    from torch._dynamo.utils import flatten_graph_inputs
    gm = torch.fx.symbolic_trace(_ListInput())
    xs, y = [torch.randn(3, requires_grad=True), torch.randn(3)], torch.randn(3)
    compiled = flatten_graph_inputs(
        gm, [xs, y], lambda mod, flat: api.aot_module_simplified(mod, flat, api.nop))
    out = compiled([xs[0], xs[1]], y)
    out[0].sum().backward()
    torch.testing.assert_close(out[0], xs[0] * y + xs[1])
    torch.testing.assert_close(xs[0].grad, y)


@pytest.mark.parametrize("api", [torch_compile, compat], ids=["functorch", "compat"])
def test_simplified_forward_has_torchs_attributes(api):
    """Code written for torch reads `forward.serialize` (None: nothing to serialize)."""
    gm = torch.fx.symbolic_trace(_Linear())
    x = torch.randn(2, 3)
    forward = api.aot_module_simplified(gm, [x], api.nop)
    assert forward.serialize is None
    assert dict(forward.named_parameters()) == dict(gm.named_parameters())
    torch.testing.assert_close(forward(x)[0], gm(x)[0])


@pytest.mark.parametrize("api", [torch_compile, compat], ids=["functorch", "compat"])
def test_a_partition_fn_sees_the_joint_named_as_torch_names_it(api):
    """torch's min-cut names its debug dumps after the graph being compiled; inside a
    partition_fn compat named none (`model___0`, context `[]`)."""
    seen = []

    def partition(joint, joint_inputs, *, num_fwd_outputs, **kwargs):
        seen.append((api.get_aot_graph_name(), api.get_aot_compilation_context()))
        return api.default_partition(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs)
    x = torch.randn(3, requires_grad=True)
    api.aot_function(lambda x: x.sin(), api.nop, partition_fn=partition)(x).sum().backward()
    (name, context), = seen
    compile_id, role, nth = _name_parts(name, context)
    assert role == "joint"
    torch.testing.assert_close(x.grad, x.cos())
