"""The cache's key for plain functions taken after the analysis (capture/oplog.py): the ops the
analysis ran. A hit skips the trace; anything outside the log that could change the backward
(Python code in it, saved-tensor hooks, constants) refuses the log, and the compile is keyed
after the trace as before. Each refusal is tested with a twin function whose ops are the same
but whose gradient differs: were it keyed by its ops, it would be served the twin's graphs.

In one process (each compile reads the entries the earlier ones wrote), then across two."""

from __future__ import annotations

import cProfile
import subprocess
import sys

import torch

import aotgrad
from aotgrad import cache
from test_cache import REPO, cache_dir, result_of  # noqa: F401 (cache_dir: autouse fixture)


def run(fn, *inputs, backend="eager"):
    """Outputs and input gradients of one compiled call, with this compile's cache event."""
    inputs = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    out = aotgrad.compile(fn, backend=backend)(*inputs)
    out.sum().backward()
    return [out.detach(), *(t.grad for t in inputs if t.requires_grad)], cache.events()[-1]


def eager(fn, *inputs):
    inputs = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    out = fn(*inputs)
    out.sum().backward()
    return [out.detach(), *(t.grad for t in inputs if t.requires_grad)]


def assert_same(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def x():
    torch.manual_seed(0)
    return torch.randn(4, 5, requires_grad=True)


def plain(t):
    return t.sin() * 2


def test_a_plain_function_hits_before_the_trace():
    cold, event = run(plain, x())
    assert event[0] == "miss"
    warm, event = run(plain, x())
    assert event[0] == "hit" and event[1].startswith("before the trace: ops sha256:"), event
    assert_same(warm, cold)
    assert_same(warm, eager(plain, x()))


def test_a_module_hits_before_the_trace_and_updates_its_buffers():
    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.BatchNorm1d(3))
    got = []
    for _ in range(2):
        m = make()
        out = aotgrad.compile(m, backend="eager")(x())
        out.sum().backward()
        got.append([out.detach(), m[0].weight.grad, m[1].running_mean])
    assert cache.events()[-1][1].startswith("before the trace: ops"), cache.events()
    m = make()
    out = m(x())
    out.sum().backward()
    assert_same(got[1], [out.detach(), m[0].weight.grad, m[1].running_mean])
    assert_same(got[0], got[1])


def twins(first, second, refusal: str):
    """`second` runs the same ops as `first`, with another gradient: compiled after it, it
    must not be served its graphs; both equal eager; `second`'s log is refused, saying why."""
    for fn in (first, second):
        got, event = run(fn, x())
        assert_same(got, eager(fn, x()))
    assert event[0] in ("miss", "bypass"), event  # bypass: not cached after the trace either
    assert refusal in event[1], event


def test_a_scalar_is_part_of_the_key():
    run(lambda t: t.sin() * 3, x())
    got, event = run(plain, x())  # sin, then times 2
    assert event[0] == "miss" and "program ops sha256:" in event[1], event
    assert_same(got, eager(plain, x()))


def test_grad_mode_inside_the_function_is_part_of_the_key():
    def partly_no_grad(t):
        with torch.no_grad():
            s = t.sin()
        return s * t

    def all_grad(t):
        return t.sin() * t
    for fn in (all_grad, partly_no_grad):
        got, event = run(fn, x())
        assert event[0] == "miss", event
        assert_same(got, eager(fn, x()))


class Doubled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t):
        return t.clone()

    @staticmethod
    def backward(ctx, g):
        return g * 2


class Passed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t):
        return t.clone()

    @staticmethod
    def backward(ctx, g):
        return g


def test_a_custom_function_refuses_the_log():
    twins(lambda t: Passed.apply(t).sin(), lambda t: Doubled.apply(t).sin(),
          "custom autograd.Function")


def test_a_tensor_hook_refuses_the_log():
    def hooked(t):
        s = t.sin()
        s.register_hook(lambda g: g * 2)
        return s.cos()
    twins(lambda t: t.sin().cos(), hooked, "register_hook")


def test_a_hook_on_an_autograd_node_refuses_the_log():
    def hooked(t):
        s = t.sin()
        s.grad_fn.register_prehook(lambda grads: (grads[0] * 2,))
        return s.cos()
    twins(lambda t: t.sin().cos(), hooked, "reads a grad_fn")


def test_saved_tensor_hooks_inside_refuse_the_log():
    def hooked(t):
        with torch.autograd.graph.saved_tensors_hooks(lambda v: v * 2, lambda v: v):
            return t.sin() * t
    twins(lambda t: t.sin() * t, hooked, "saved-tensor hooks")


def test_a_module_backward_hook_refuses_the_log():
    lin = torch.nn.Linear(5, 5)
    hooked = torch.nn.Linear(5, 5)
    hooked.load_state_dict(lin.state_dict())
    hooked.register_full_backward_hook(lambda m, gi, go: (gi[0] * 2,))
    twins(lin, hooked, "Python code")


def test_a_closed_over_constant_refuses_the_log():
    ones, twos = torch.ones(5), torch.full((5,), 2.0)
    twins(lambda t: t * ones, lambda t: t * twos, "constant")


def test_a_running_profiler_does_not_change_the_key():
    run(plain, x())
    with cProfile.Profile():
        got, event = run(plain, x())
    assert event[0] == "hit" and event[1].startswith("before the trace: ops"), event
    assert_same(got, eager(plain, x()))


SCRIPT = """
import json, torch, aotgrad
from aotgrad import cache
torch.manual_seed(0)
lm = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Dropout(0.0), torch.nn.GELU(),
                         torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
x = torch.randn(3, 6)
model = aotgrad.compile(lm, backend="inductor")
out = model(x)
out.sum().backward()
print(json.dumps({"events": cache.events(), "stages": sorted(model.artifacts[0].timings),
                  "values": [t.tolist() for t in (out, *(p.grad for p in lm.parameters()))]}))
"""


def test_across_processes_the_warm_one_skips_the_trace(tmp_path):
    script = tmp_path / "step.py"
    script.write_text(SCRIPT)
    results = []
    for _ in range(2):
        proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True,
                                env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
        results.append(result_of(proc))
    cold, warm = results
    assert [e for e, _ in warm["events"]] == ["hit"], warm["events"]
    assert warm["events"][0][1].startswith("before the trace: ops"), warm["events"]
    assert "trace" in cold["stages"] and "trace" not in warm["stages"], warm["stages"]
    assert warm["values"] == cold["values"]


def test_a_compiled_function_called_inside_is_the_outer_logs_own_code():
    # Inside one of aotgrad's traces a compiled callable runs its original code (api.py): its
    # ops are the outer log's, as the plain function's that computes the same.
    inner = aotgrad.compile(lambda t: t.sin() * 2, backend="eager")
    outer = lambda t: inner(t).cos()  # noqa: E731
    run(lambda t: (t.sin() * 2).cos(), x())
    got, event = run(outer, x())
    assert event[0] == "hit" and "before the trace" in event[1], event
    assert_same(got, eager(outer, x()))


def test_a_returned_constant_refuses_the_log():
    ones, twos = torch.ones(5), torch.full((5,), 2.0)
    for const in (ones, twos):
        fn = lambda t: (t.sin(), const)  # noqa: E731
        outs = aotgrad.compile(fn, backend="eager")(x())
        assert torch.equal(outs[1], const)
    assert "returns a tensor that is neither" in cache.events()[-1][1], cache.events()[-1]


def test_train_and_eval_modes_are_other_keys():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(5, 5), torch.nn.BatchNorm1d(5), torch.nn.Dropout(0.0))
    want, got = [], []
    for mode in ("train", "eval", "train"):
        getattr(m, mode)()
        ref = __import__("copy").deepcopy(m)
        t = x()
        out = aotgrad.compile(m, backend="eager")(t)
        got.append((out.detach(), cache.events()[-1][0]))
        want.append(ref(t.detach().clone()).detach())
    assert [e for _, e in got] == ["miss", "miss", "hit"], got
    for (out, _), ref in zip(got, want):
        torch.testing.assert_close(out, ref)


def test_the_entry_keyed_by_ops_names_the_graphs_entry_and_survives_its_eviction(cache_dir):
    """The graphs are stored once, in the entry keyed after the trace; the entry keyed by ops
    holds the analysis and names it. That entry gone, the next compile misses with the
    reason, compiles, and stores both again."""
    import json
    from aotgrad.cache import store
    cold, _ = run(plain, x())
    entries = {p.stem: json.loads(p.read_bytes().partition(b"\n")[2])
               for p in (cache_dir / store.FORMAT).glob("*.json")}
    (by_ops, first), = [(k, e) for k, e in entries.items() if "graphs_in" in e]
    assert "graphs" not in first and "graphs" in entries[first["graphs_in"]]
    # Eviction takes the least recently used first: the entry named is the more recent.
    mtime = {k: (cache_dir / store.FORMAT / f"{k}.json").stat().st_mtime_ns for k in entries}
    assert mtime[first["graphs_in"]] >= mtime[by_ops]
    (cache_dir / store.FORMAT / f"{first['graphs_in']}.json").unlink()
    again, event = run(plain, x())
    assert event[0] == "miss" and "the entry holding its graphs is gone" in event[1], event
    assert_same(again, cold)
    assert (cache_dir / store.FORMAT / f"{first['graphs_in']}.json").exists()
    warm, event = run(plain, x())
    assert event[0] == "hit" and event[1].startswith("before the trace"), event
    assert_same(warm, cold)


def test_a_probe_asked_first_in_a_process_is_not_in_the_log():
    # The tracer's generator probe (mends.generators_traceable) traces an op; asked first
    # inside the analysis, its op refused the log of every process's first compile.
    from aotgrad.semantics import mends
    mends.generators_traceable.cache_clear()
    run(plain, x())
    mends.generators_traceable.cache_clear()
    _, event = run(plain, x())
    assert event[0] == "hit" and event[1].startswith("before the trace: ops"), event


SETTINGS_SCRIPT = '''
import enum, json, sys, torch, aotgrad
from aotgrad import cache
A = sys.argv[1] == "A"


class Mode(enum.Enum):
    X = 1
    Y = 2


class Block(torch.nn.Module):
    def __init__(self, scale, flag, name, mode):
        super().__init__()
        self.fc = torch.nn.Linear(6, 6)
        self.scale, self.flag, self.name, self.mode = scale, flag, name, mode

    def forward(self, x):
        y = self.fc(x) * self.scale
        y = y.relu() if self.flag else y
        y = y.tanh() if self.name == "tanh" else y
        return y + 1 if self.mode is Mode.Y else y


G = 1.0 if A else 3.0


def reads_global(x):
    return x.sin() * G


def closure(c):
    return lambda x: x.cos() * c


def with_default(x, a=2.0 if A else 7.0):
    return x * a


def from_source(text, globals_):
    exec(compile(text, "generated.py", "exec"), globals_)
    return globals_["f"]


def dropout(x):
    return torch.nn.functional.dropout(x, 0.5) * 3


cases = {  # name: (fn, must the warm process miss?)
    "float attribute": (Block(0.5 if A else 0.25, True, "a", Mode.X), True),
    "bool attribute": (Block(1.0, A, "a", Mode.X), True),
    "str attribute": (Block(1.0, True, "a" if A else "tanh", Mode.X), True),
    "enum attribute": (Block(1.0, True, "a", Mode.X if A else Mode.Y), True),
    "global": (reads_global, True),
    "closure": (closure(2.0 if A else 5.0), True),
    "default argument": (with_default, True),
    "edited source": (from_source(f"def f(x):\\n    return x.sin() * {2 if A else 3}\\n", {}),
                      True),
    "same source, other globals": (from_source("def f(x):\\n    return x * K\\n",
                                               {"K": 2.0 if A else 9.0}), True),
    "dropout, another seed": (dropout, False),
    "autocast": (Block(1.0, True, "b", Mode.X), True),  # on in the warm process only
}


def step(fn, seed):
    torch.manual_seed(0)
    x = torch.randn(4, 6, requires_grad=True)
    torch.manual_seed(seed)
    out = fn(x)
    params = list(fn.parameters()) if isinstance(fn, torch.nn.Module) else []
    grads = torch.autograd.grad(out.float().sum(), [x, *params])
    return [out, *grads]


report = {}
for name, (fn, must_miss) in cases.items():
    torch.manual_seed(1)
    if isinstance(fn, torch.nn.Module):
        fn.fc.reset_parameters()
    on = name == "autocast" and not A
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=on):
        got = step(aotgrad.compile(fn, backend="eager"), 1 if A else 2)
        want = step(fn, 1 if A else 2)
    same = all(g.dtype == w.dtype and torch.equal(g, w) for g, w in zip(got, want))
    report[name] = [same, cache.events()[-1][0], must_miss]
print(json.dumps(report))
'''


def test_a_warm_process_under_other_settings_misses_or_computes_as_eager(tmp_path):
    """The cold process compiles each case under one setting (an attribute, a global, a
    closure, a default argument, the source, autocast, the seed), the warm one under
    another: each must miss where its program differs, and match eager either way."""
    script = tmp_path / "settings.py"
    script.write_text(SETTINGS_SCRIPT)
    env = {**__import__("os").environ, "PYTHONPATH": str(REPO)}
    cold, warm = [result_of(subprocess.Popen(
        [sys.executable, str(script), phase], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env)) for phase in ("A", "B")]
    assert all(same for same, _, _ in cold.values()), cold
    assert all(same for same, _, _ in warm.values()), warm
    assert {name: event for name, (_, event, must_miss) in warm.items() if must_miss} == {
        name: "miss" for name, (_, _, must_miss) in warm.items() if must_miss}, warm
    assert warm["dropout, another seed"][1] == "hit", warm
