"""The surface a user meets: the log, `explain`'s report, argument errors, import cost."""

import importlib.metadata
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import aotgrad
from aotgrad import compat
from aotgrad.log import configure_from_env, logger

ROOT = Path(__file__).resolve().parents[1]
STAGES = ["capture", "analysis", "trace", "passes", "partition", "compile_forward",
          "compile_backward"]


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


# ---- logging --------------------------------------------------------------------------------

def _stage_records(caplog):
    return [r for r in caplog.records if r.name.startswith("aotgrad") and r.levelno == logging.INFO]


def test_one_info_line_per_stage_with_time_and_sizes(caplog):
    caplog.set_level(logging.INFO, logger="aotgrad")
    model = aotgrad.compile(mlp(), backend="eager")
    model(torch.randn(4, 8)).sum().backward()
    lines = [r.getMessage() for r in _stage_records(caplog)]
    assert [line.split(": ")[1].split(" ")[0] for line in lines] == STAGES
    assert all(line.startswith("Sequential.forward: ") and " ms" in line for line in lines)
    assert "joint graph ops" in lines[2] and "saved" in lines[4] and "forward ops" in lines[4]
    timings = model.artifacts[0].timings
    assert list(timings) == STAGES  # the log tells what Artifact.timings holds


def test_inference_compile_logs_its_stages(caplog):
    caplog.set_level(logging.INFO, logger="aotgrad")
    with torch.no_grad():
        aotgrad.compile(lambda x: x.sin() * 2, backend="eager")(torch.randn(3))
    stages = [r.getMessage().split(": ")[1].split(" ")[0] for r in _stage_records(caplog)]
    assert stages == ["capture", "analysis", "trace", "passes", "compile_forward"]
    assert "inference graph ops 2" in _stage_records(caplog)[3].getMessage()


def test_debug_shows_the_partition_and_the_budget_solver(caplog):
    caplog.set_level(logging.DEBUG, logger="aotgrad")
    model = aotgrad.compile(mlp(), backend="eager", memory_budget=0.5)
    model(torch.randn(4, 8)).sum().backward()
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert any(m.startswith("saved for backward: ") for m in debug)
    assert any(m.startswith("memory budget 0.5: peak") for m in debug)
    info = [r.getMessage() for r in _stage_records(caplog)]
    assert any(m.startswith("memory budget: computing the memory/compute curve") for m in info)


def test_nothing_is_logged_at_the_default_level(caplog):
    caplog.set_level(logging.WARNING)
    aotgrad.compile(lambda x: x.cos(), backend="eager")(torch.randn(3, requires_grad=True))
    assert not [r for r in caplog.records if r.name.startswith("aotgrad")]


@pytest.mark.parametrize("value, level", [("info", logging.INFO), ("DEBUG", logging.DEBUG),
                                          ("1", logging.INFO)])
def test_environment_switch_sets_the_level(value, level):
    before = logger.level
    handler = configure_from_env(value)
    try:
        assert handler in logger.handlers and logger.level == level
    finally:
        logger.removeHandler(handler)
        logger.setLevel(before)


def test_environment_switch_off_or_bad():
    assert configure_from_env("") is None and configure_from_env("off") is None
    with pytest.warns(UserWarning, match="aotgrad: AOTGRAD_LOG='loud' is not a logging level"):
        assert configure_from_env("loud") is None


def test_environment_switch_prints_stages_on_stderr():
    code = ("import torch, aotgrad; "
            "aotgrad.compile(lambda x: x.sin(), backend='eager')(torch.randn(2))")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AOTGRAD_LOG": "info"}
    err = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True).stderr
    assert "[aotgrad.pipeline INFO] <lambda>: capture" in err
    assert "[aotgrad.pipeline INFO] <lambda>: compile_forward" in err


# ---- explain ------------------------------------------------------------------------------

def test_explain_prints_nothing(capsys):
    report = aotgrad.explain(mlp(), torch.randn(4, 8))
    assert capsys.readouterr().out == ""
    print(report)
    assert capsys.readouterr().out.strip() == str(report).strip()
    report.show()
    assert capsys.readouterr().out.strip() == str(report).strip()


def test_graph_code_only_when_asked(capsys):
    report = aotgrad.explain(mlp(), torch.randn(4, 8))
    assert "def forward" not in str(report)
    report.show(graphs=True)
    shown = capsys.readouterr().out
    assert report.forward_code in shown and report.backward_code in shown


def test_curve_is_computed_on_demand(monkeypatch):
    calls = []
    real = aotgrad.explain.__globals__["plan_curve"]
    monkeypatch.setitem(aotgrad.explain.__globals__, "plan_curve",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    report = aotgrad.explain(mlp(), torch.randn(4, 8))
    assert calls == [] and "memory/compute curve" not in str(report)
    assert report.curve is report.curve and calls == [1]  # computed once, then kept
    assert "memory/compute curve" in str(report)


def test_budget_curve_is_computed_once(monkeypatch):
    """The compile computed the curve to choose the budget's plan: explain reuses it."""
    import aotgrad.partition.budget as budget
    calls = []
    real = budget.plan_curve
    monkeypatch.setattr(budget, "plan_curve", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setitem(aotgrad.explain.__globals__, "plan_curve", budget.plan_curve)
    report = aotgrad.explain(mlp(), torch.randn(4, 8), memory_budget=0.5)
    assert report.chosen in report.curve.plans and "memory/compute curve" in str(report)
    assert calls == [1]


def test_saved_values_carry_the_users_names():
    report = aotgrad.explain(mlp(), torch.randn(4, 8))
    names = {s.name for s in report.saved}
    assert "2.weight" in names and not any(n.startswith("primals") for n in names)
    assert all(s.graph_name in report.forward_code for s in report.saved)
    assert "2.weight" in str(report)


def test_function_arguments_are_named_by_the_signature():
    def f(x, params):
        return (x @ params["w"]).tanh().sum()
    w = torch.randn(4, 4, requires_grad=True)
    compiled = aotgrad.compile(f, backend="eager")
    compiled(torch.randn(2, 4, requires_grad=True), {"w": w}).backward()
    names = {s.name for s in compiled.artifacts[0].saved}
    assert {"x", "params['w']"} <= names


def test_dynamo_graphs_name_saved_values_as_the_user_does():
    from aotgrad.dynamo import make_backend
    artifacts, backend = [], make_backend(backend="eager")

    def recording(gm, example_inputs):
        run = backend(gm, example_inputs)
        artifacts.append(run.artifact)
        return run

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)

        def forward(self, x):
            return self.fc2(self.fc1(x).tanh())

    torch.compile(Net(), backend=recording)(torch.randn(3, 4)).sum().backward()
    names = {s.name for s in artifacts[0].saved}
    assert {"x", "fc2.weight"} <= names and not any(n.startswith("primals") for n in names)


def test_demo_summary_names_parameters():
    from aotgrad.demo import TinyLM
    model = aotgrad.compile(TinyLM(layers=1, width=32), backend="eager")
    tokens = torch.randint(0, 256, (2, 8))
    model(tokens, tokens).backward()
    summary = model.artifacts[0].summary()
    assert "blocks.0.qkv.weight" in summary and "primals_" not in summary


# ---- arguments checked where they are given -------------------------------------------------

BAD_ARGUMENTS = [
    (lambda: aotgrad.compile(42), TypeError,
     "aotgrad: compile: the first argument must be a function or an nn.Module, got int 42"),
    (lambda: aotgrad.compile(torch.sin, memory_budget="half"), TypeError,
     "aotgrad: compile: memory_budget must be a number in [0, 1] or None, got str 'half'"),
    (lambda: aotgrad.compile(torch.sin, memory_budget=1.5), ValueError,
     "aotgrad: compile: memory_budget must be in [0, 1]"),
    (lambda: aotgrad.compile(torch.sin, backend="tvm"), ValueError,
     "aotgrad: unknown backend 'tvm'"),
    (lambda: aotgrad.compile(torch.sin, partitioner="min_cut"), TypeError,
     "aotgrad: compile: partitioner must be a callable or None, got str 'min_cut'"),
    (lambda: aotgrad.compile(torch.sin, decompositions=[torch.ops.aten.gelu]), TypeError,
     "aotgrad: compile: decompositions must be a dict"),
    (lambda: aotgrad.compile(torch.sin, dynamic="auto"), TypeError,
     "aotgrad: compile: dynamic must be True or False, got str 'auto'"),
    (lambda: aotgrad.compile(torch.sin, max_entries=0), ValueError,
     "aotgrad: compile: max_entries must be an int >= 1, got int 0"),
    (lambda: aotgrad.compile(torch.sin, compile_backward="never"), ValueError,
     "aotgrad: compile_backward='never'"),
    (lambda: aotgrad.backend(memory_budget="half"), TypeError,
     "aotgrad: backend: memory_budget must be a number in [0, 1] or None"),
    (lambda: aotgrad.backend(dynamic=True), TypeError,
     "aotgrad: backend() takes no option dynamic"),
    (lambda: aotgrad.explain(torch.sin, torch.randn(2), curve="yes"), TypeError,
     "aotgrad: explain: curve must be True or False"),
    (lambda: aotgrad.explain(torch.sin, torch.randn(2), memory_budget="half"), TypeError,
     "aotgrad: compile: memory_budget must be a number"),
    (lambda: compat.aot_function(torch.sin, None), TypeError,
     "aotgrad: aot_function: fw_compiler must be a callable, got NoneType None"),
    (lambda: compat.aot_function(torch.sin, compat.nop, bw_compiler="nop"), TypeError,
     "aotgrad: aot_function: bw_compiler must be a callable or None"),
    (lambda: compat.aot_function(torch.sin, compat.nop, partition_fn=None), TypeError,
     "aotgrad: aot_function: partition_fn must be a callable"),
    (lambda: compat.aot_function(torch.sin, compat.nop, num_params_buffers=-1), ValueError,
     "aotgrad: aot_function: num_params_buffers must be an int >= 0"),
    (lambda: compat.aot_function(3, compat.nop), TypeError,
     "aotgrad: aot_function: fn must be a callable, got int 3"),
    (lambda: compat.aot_module(torch.sin, compat.nop), TypeError,
     "aotgrad: aot_module: mod must be an nn.Module"),
    (lambda: compat.aot_module(nn.Linear(2, 2), None), TypeError,
     "aotgrad: aot_module: fw_compiler must be a callable"),
    (lambda: compat.aot_module_simplified(nn.Linear(2, 2), [torch.randn(2)], None),
     TypeError, "aotgrad: aot_module_simplified: fw_compiler must be a callable"),
    (lambda: compat.aot_export_module(lambda x: x, [torch.randn(2)], trace_joint=False),
     TypeError, "aotgrad: aot_export_module: mod must be an nn.Module"),
    (lambda: compat.aot_export_joint_simple(torch.sin, [torch.randn(2)], trace_joint=False,
                                            decompositions=[1]),
     TypeError, "aotgrad: aot_export_joint_simple: decompositions must be a dict"),
]


@pytest.mark.parametrize("make, error, message", BAD_ARGUMENTS,
                         ids=[m.split(":")[1].strip() + "-" + str(i)
                              for i, (_, _, m) in enumerate(BAD_ARGUMENTS)])
def test_bad_argument_fails_where_it_is_given(make, error, message):
    with pytest.raises(error) as info:
        make()
    assert str(info.value).startswith(message)


def test_good_arguments_still_pass():
    aotgrad.compile(torch.sin, memory_budget=0, max_entries=1, dynamic=False)
    aotgrad.compile(nn.Linear(2, 2), backend="eager", decompositions={})
    compat.aot_function(torch.sin, compat.nop, num_params_buffers=0)
    aotgrad.backend(backend="eager", memory_budget=0.5)


# ---- what `import aotgrad` loads ------------------------------------------------------------

def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "; import sys; print(*sys.modules)"],
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                         text=True, check=True).stdout
    return set(out.split())


HEAVY = ("torch._inductor", "scipy", "sympy", "torch._dynamo")


@pytest.mark.parametrize("code", ["import aotgrad", "import aotgrad.compat",
                                  "import torch, aotgrad; aotgrad.compile(torch.nn.Linear(2, 2))"])
def test_import_loads_neither_inductor_nor_scipy(code):
    loaded = _modules_after(code)
    assert "aotgrad" in loaded
    heavy = sorted(m for m in loaded if m.split(".")[0] == "scipy"
                   or any(m == h or m.startswith(h + ".") for h in HEAVY))
    assert heavy == []


def test_eager_compile_loads_no_inductor_compiler_and_dynamo_registry_gets_aotgrad():
    """An eager-backend compile and backward import neither Inductor's compiler and lowerings
    nor SciPy (torch's FakeTensorMode imports Dynamo, and with it Inductor's config: not
    aotgrad's doing). Dynamo's registry, imported after aotgrad, has `backend="aotgrad"`
    registered without the entry point's help."""
    code = ("import sys, torch, aotgrad; f = aotgrad.compile(lambda x: x.sin(), backend='eager'); "
            "f(torch.randn(2, requires_grad=True)).sum().backward(); "
            "print(*[m for m in sys.modules if m.startswith('scipy') or m in "
            "('torch._inductor.lowering', 'torch._inductor.compile_fx', "
            "'torch._inductor.decomposition')]); "
            "from torch._dynamo.backends.registry import _COMPILER_FNS; "
            "print('registered' if 'aotgrad' in _COMPILER_FNS else 'missing')")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[:2] == ["", "registered"]


def test_torch_compile_with_the_aotgrad_backend_name_through_the_entry_point():
    """Without `import aotgrad`: Dynamo loads the installed entry point, whose import
    registered the name already, and Dynamo's own registration then failed ('duplicate
    name: aotgrad')."""
    if not any(e.name == "aotgrad" for e in importlib.metadata.entry_points(
            group="torch_dynamo_backends")):
        pytest.skip("aotgrad is not installed: no entry point")
    out = subprocess.run(
        [sys.executable, "-c", "import torch; x = torch.randn(3); "
         "f = torch.compile(lambda x: x.cos() * 2, backend='aotgrad'); "
         "assert torch.allclose(f(x), x.cos() * 2); import aotgrad; "
         "assert aotgrad.__file__.startswith(%r); print('OK')" % str(ROOT)],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
    assert out.stdout.strip() == "OK", out.stderr[-2000:]


def test_torch_compile_with_the_aotgrad_backend_name():
    out = subprocess.run(
        [sys.executable, "-c", "import torch, aotgrad; "
         "f = torch.compile(lambda x: x.cos() * 2, backend='aotgrad'); "
         "x = torch.randn(3); assert torch.allclose(f(x), x.cos() * 2); print('OK')"],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "OK"


@pytest.mark.parametrize("backend", ["name", "object"])
def test_parameters_swap_after_a_torch_compile_with_aotgrads_backend(backend):
    """Dynamo drops its weak references to the traced tensors after a compile by a backend
    it knows by name; `aotgrad.backend(...)`'s was unknown, so they stayed and
    `torch.utils.swap_tensors` refused the parameters: `model.to(torch.float64)` under
    `set_swap_module_params_on_conversion(True)` raised where eager's module converts."""
    import copy
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    model = copy.deepcopy(eager)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aotgrad" if backend == "name" else
                             aotgrad.backend(backend="eager"))
    x = torch.randn(5, 3)
    compiled(x).sum().backward()
    eager(x).sum().backward()
    swapping = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        for m in (eager, model):
            m.to(torch.float64)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swapping)
    torch.testing.assert_close(compiled(x.double()), eager(x.double()))
    torch.testing.assert_close(dict(model.named_buffers()), dict(eager.named_buffers()))
