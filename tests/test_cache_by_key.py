"""Adversarial tests of the cache's by-key load (cache/fxkeys.py, backends/fxcache.py): a warm
process loads each graph's Inductor code by the FX graph cache key stored beside our entry,
filed under a context digest. Where a wrong compiled graph could plausibly be served (the same
graph in another context: static inputs, role, donations, global settings), a warm process
must give eager's results, and load by key exactly the graphs whose context it recorded.

Each scenario runs a cold phase, then a warm process from a copy of its cache directory,
with Inductor's default one (warm from earlier runs: fast). The cold phases share one
process (`colds`), each in a directory of its own."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from aotgrad.backends import fxcache
from aotgrad.cache import store
from test_cache import REPO, inductor_cache_of_kernels, result_of
from test_cache import cache_dir  # noqa: F401 (an autouse fixture)

SCRIPT = textwrap.dedent("""
    import copy, json, logging, os, sys
    import torch, aotgrad
    from aotgrad import cache
    from torch._dynamo.utils import counters
    logged = []
    class Keep(logging.Handler):
        def emit(self, record):
            logged.append(record.getMessage())
    logging.getLogger("aotgrad.cache").addHandler(Keep())
    logging.getLogger("aotgrad.cache").setLevel(logging.INFO)
    names, phase = sys.argv[1].split(","), sys.argv[2]
    inductor = dict(backend="inductor")

    def mlp():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16),
                                   torch.nn.ReLU(), torch.nn.Linear(16, 4))

    def state(m):
        return [*(p.grad for p in m.parameters()), *m.buffers()]

    def step(m, x, **backward):
        out = m(x)
        out.sum().backward(**backward)
        return [out]

    def static():
        # The same graph (linear, relu) with the parameters static (a module) or not (a
        # function of plain arguments): the cold process compiles the module only; the
        # warm one the function first, whose cold compile must not load the module's code.
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(6, 3), torch.nn.ReLU())
        x = torch.randn(4, 6)
        eager = copy.deepcopy(m)
        want = step(eager, x) + state(eager)
        got = []
        if phase == "warm":
            def fn(w, b, x):
                return torch.nn.functional.linear(x, w, b).relu()
            w, b = (p.detach().clone().requires_grad_() for p in m.parameters())
            out = aotgrad.compile(fn, **inductor)(w, b, x)
            out.sum().backward()
            got += [out, w.grad, b.grad]
            want += [want[0], *state(eager)[:2]]
        return step(aotgrad.compile(m, **inductor), x) + state(m) + got, want

    def retain():
        # Cold: one backward (the donating one). Warm: retain_graph=True first, which runs
        # the backward compiled without donations, then a second backward.
        m, x = mlp(), torch.randn(5, 8)
        eager, compiled = copy.deepcopy(m), aotgrad.compile(m, **inductor)
        if phase == "cold":
            return step(compiled, x) + state(m), step(eager, x) + state(eager)
        outs = []
        for model in (compiled, eager):
            out = model(x)
            out.sum().backward(retain_graph=True)
            out.sum().backward()
            outs.append(out)
        return [outs[0]] + state(m), [outs[1]] + state(eager)

    def grad_mode():
        # A forward that saves nothing: its training forward and inference graphs are the
        # same graph in another role. Cold: training only; warm: inference first.
        x = torch.randn(4, 6, requires_grad=True)
        fn = lambda t: t * 2 + 1
        compiled = aotgrad.compile(fn, **inductor)
        got, want = [], []
        if phase == "warm":
            with torch.no_grad():
                got.append(compiled(x))
                want.append(fn(x))
        out = compiled(x)
        (grad,) = torch.autograd.grad(out.sum() * 3, x)
        return got + [out, grad], want + [fn(x), torch.full_like(x, 6.)]

    def bn_grad_mode():
        # BatchNorm in train mode under no_grad (an inference graph that updates running
        # statistics), then a training step, both in the warm process.
        m, x = mlp(), torch.randn(5, 8)
        eager, compiled = copy.deepcopy(m), aotgrad.compile(m, **inductor)
        with torch.no_grad():
            got, want = [compiled(x)], [eager(x)]
        return got + step(compiled, 2 * x) + state(m), want + step(eager, 2 * x) + state(eager)

    def channels_last():
        # ConvNeXt-like blocks: Inductor's forward saves a layer norm's statistics in a
        # layout of its own (H and W swapped), which the backward is compiled for; its ops
        # were traced from the layout as traced, and a `view` among them needs that one.
        F = torch.nn.functional
        class Norm2d(torch.nn.LayerNorm):
            def forward(self, x):
                x = F.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight,
                                 self.bias, self.eps)
                return x.permute(0, 3, 1, 2)
        class Block(torch.nn.Module):
            def __init__(self, c):
                super().__init__()
                self.dw = torch.nn.Conv2d(c, c, 7, padding=3, groups=c)
                self.norm, self.fc = torch.nn.LayerNorm(c), torch.nn.Linear(c, c)
                self.gamma = torch.nn.Parameter(torch.full((c,), 0.1))
            def forward(self, x):
                y = self.fc(self.norm(self.dw(x).permute(0, 2, 3, 1))).permute(0, 3, 1, 2)
                return y.mul(self.gamma.reshape(1, -1, 1, 1)) + x
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 4, 4), Norm2d(16), Block(16),
                                Norm2d(16), torch.nn.Conv2d(16, 16, 2, 2), Block(16))
        x = torch.randn(2, 3, 56, 56).to(memory_format=torch.channels_last)
        return m.to(memory_format=torch.channels_last), x

    def settings():
        # Warm process under other global settings, set before anything compiles.
        if phase == "warm":
            torch.set_float32_matmul_precision("high")
            torch.use_deterministic_algorithms(True)
        m, x = mlp(), torch.randn(5, 8)
        eager = copy.deepcopy(m)
        return step(aotgrad.compile(m, **inductor), x) + state(m), step(eager, x) + state(eager)

    def layouts():
        # The warm process in another context (its Inductor keys not entered), bf16 autocast.
        torch.set_num_threads(1 if phase == "warm" else 2)
        m, x = channels_last()
        eager = copy.deepcopy(m)
        with torch.autocast("cpu", torch.bfloat16):
            got, want = step(aotgrad.compile(m, **inductor), x), step(eager, x)
        return [t.float() for t in got + state(m)], [t.float() for t in want + state(eager)]

    def dynamic():
        # Symbolic shapes, then a call at a new size.
        m = mlp()
        eager, compiled = copy.deepcopy(m), aotgrad.compile(m, dynamic=True, **inductor)
        got, want = [], []
        for n in (5, 7):
            x = torch.randn(n, 8)
            got += step(compiled, x)
            want += step(eager, x)
        return got + state(m), want + state(eager)

    def two_steps():
        # BatchNorm in train mode: running statistics after two steps (and an optimizer
        # step between them, so the second step's parameters differ).
        m, x = mlp(), torch.randn(5, 8)
        eager, compiled = copy.deepcopy(m), aotgrad.compile(m, **inductor)
        got, want = [], []
        for model, into in ((m, got), (eager, want)):
            run = compiled if model is m else eager
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for i in range(2):
                opt.zero_grad()
                into += step(run, x * (i + 1))
                opt.step()
            into += [*model.parameters(), *model.buffers()]
        return got, want

    def mutation():
        # An input mutated in place, an output that is a view of an input, a gradient.
        def fn(x, buf):
            buf.mul_(2).add_(x.detach())
            return x.sin() * buf, x.t()
        x = torch.randn(3, 4, requires_grad=True)
        bufs = [torch.ones(3, 4), torch.ones(3, 4)]
        got, want = [], []
        for run, buf, into in ((aotgrad.compile(fn, **inductor), bufs[0], got),
                               (fn, bufs[1], want)):
            out, view = run(x, buf)
            (grad,) = torch.autograd.grad(out.sum(), x)
            assert view._base is x
            into += [out, view, buf, grad]
        return got, want

    def outcome(name):
        cache.reset_stats()
        counters.clear()
        logged.clear()
        torch._dynamo.reset()
        threads = torch.get_num_threads()
        got, want = globals()[name]()
        torch.set_num_threads(threads)
        return {"events": cache.events(), "stats": cache.stats(), "log": logged[:],
                "inductor": {k: v for k, v in counters["inductor"].items() if "fxgraph" in k},
                "got": [t.tolist() for t in got], "want": [t.tolist() for t in want]}

    results = {}
    for name in names:
        if len(sys.argv) > 3:  # several scenarios' cold phases: a cache directory each
            os.environ["AOTGRAD_CACHE_DIR"] = os.path.join(sys.argv[3], name)
        results[name] = outcome(name)
    print(json.dumps(results))
""")


def run(tmp_path: Path, scenario: str, phase: str, **env: str) -> dict:
    return run_all(tmp_path, [scenario], phase, **env)[scenario]


def run_all(tmp_path: Path, scenarios: list[str], phase: str, caches: Path | None = None,
            **env: str) -> dict:
    """Each scenario's results from one process; with `caches`, each scenario compiles into
    a cache directory of its own there, else into the test's."""
    script = tmp_path / "scenario.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO), **env}
    proc = subprocess.Popen([sys.executable, str(script), ",".join(scenarios), phase,
                             *([str(caches)] if caches else [])], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return result_of(proc)


COLD = ["static", "retain", "grad_mode", "bn_grad_mode", "settings", "layouts", "dynamic",
        "two_steps", "mutation"]


@pytest.fixture(scope="module")
def colds(tmp_path_factory) -> tuple[Path, dict]:
    """Every scenario's cold phase in one process (each starts with Dynamo reset, in a cache
    directory of its own, and is asserted cold): an interpreter of its own cost each ~8 s.
    What a test checks is its warm process, which starts from a copy of the directory."""
    root = tmp_path_factory.mktemp("colds")  # (made before the tests' own fixtures)
    return root / "caches", run_all(root, COLD, "cold", root / "caches", AOTGRAD_CACHE="1")


@pytest.fixture
def after_cold(tmp_path, colds, cache_dir):
    """scenario -> (its cold results, its warm process's), each checked against eager;
    the warm process's cache is a copy of the cold phase's."""
    caches, results = colds

    def warm(scenario: str, **tolerance) -> tuple[dict, dict]:
        if (caches / scenario).exists():  # (a scenario may store nothing: symbolic shapes)
            shutil.copytree(caches / scenario, cache_dir, dirs_exist_ok=True)
        cold, warm = results[scenario], run(tmp_path, scenario, "warm")
        assert "hit" not in [e for e, _ in cold["events"]], cold["events"]  # cold indeed
        for result in cold, warm:
            assert len(result["got"]) == len(result["want"])
            for got, want in zip(result["got"], result["want"]):
                torch.testing.assert_close(torch.tensor(got), torch.tensor(want), **tolerance)
        return cold, warm
    return warm


def by_key(result: dict) -> int:
    return result["stats"].get("inductor_by_key", 0)


def test_static_inputs_of_the_same_graph_are_another_context(after_cold):
    _, warm = after_cold("static")
    # The module hits although the function's Inductor compile came first (it sets some
    # options to their default values: that once made the module's key another).
    assert [e for e, _ in warm["events"]] == ["miss", "hit"], warm["events"]
    # The module's forward and backward, and the function's backward (no static inputs
    # in either: the same context); never the function's forward.
    assert by_key(warm) == 3, warm["stats"]


def test_inductor_option_set_to_its_default_is_the_same_key_component():
    from torch._inductor import config
    from aotgrad.cache.key import _inductor_config
    before = _inductor_config()
    with config.patch(comprehensive_padding=config.comprehensive_padding,
                      max_autotune=config.max_autotune):
        assert _inductor_config() == before
    flipped = not config.max_autotune
    with config.patch(max_autotune=flipped):
        assert f"max_autotune={flipped!r}" in _inductor_config()


def test_retain_graph_backward_after_a_hit_is_not_the_donating_one(after_cold, tmp_path):
    _, warm = after_cold("retain")
    assert [e for e, _ in warm["events"]] == ["hit"]
    # The forward and the donating backward; the keeping one was never compiled cold.
    assert by_key(warm) == 2, warm["stats"]
    # Once the warm process compiled the keeping backward, its key is recorded too.
    again = run(tmp_path, "retain", "warm")
    assert by_key(again) == 3, again["stats"]
    for got, want in zip(again["got"], again["want"]):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want))


def test_inference_after_training_in_a_warm_process(after_cold):
    _, warm = after_cold("grad_mode")
    assert [e for e, _ in warm["events"]] == ["miss", "hit"], warm["events"]
    assert by_key(warm) == 2, warm["stats"]  # training forward and backward, not inference


def test_batch_norm_under_no_grad_then_training_in_a_warm_process(after_cold):
    _, warm = after_cold("bn_grad_mode")
    assert [e for e, _ in warm["events"]] == ["hit", "hit"], warm["events"]
    assert by_key(warm) == 3, warm["stats"]  # inference, forward, backward


def test_changed_matmul_precision_and_determinism_do_not_load_by_key(after_cold):
    _, warm = after_cold("settings")
    # Inductor's key holds both settings: code keyed under the old ones is not served.
    assert by_key(warm) == 0, warm["stats"]


def test_a_saved_layout_the_forward_chose_is_traced_from_as_traced_in_another_context(
        after_cold):
    """A hit whose Inductor keys are not entered computes its graphs' fake values again. A
    saved value the compiled forward lays out its own way (a ConvNeXt block's layer-norm
    statistics, H and W swapped) reaches the backward restrided; its ops must be computed
    from the value as traced: from the new strides, a `view` of the trace failed (session
    36: ConvNeXt-T on the GPU; `Cannot view a tensor with shape [2, 14, 14, 16]`)."""
    # bf16 autocast: eager's and Inductor's roundings differ; a bias's sum of 392 bf16
    # terms by 7%
    cold, warm = after_cold("layouts", rtol=0.1, atol=0.5)
    assert [e for e, _ in warm["events"]] == ["hit"], warm["events"]
    assert by_key(warm) == 0, warm["stats"]
    for got, cold_got in zip(warm["got"], cold["got"]):  # one thread, not two: sums reorder
        torch.testing.assert_close(torch.tensor(got), torch.tensor(cold_got), rtol=0.02,
                                   atol=0.05)


def test_dynamic_shapes_cold_then_warm_at_a_new_size(after_cold):
    _, warm = after_cold("dynamic")
    assert by_key(warm) == 0, warm["stats"]  # symbolic graphs are not stored


def test_running_statistics_after_two_warm_steps_equal_eager(after_cold):
    _, warm = after_cold("two_steps")
    assert [e for e, _ in warm["events"]] == ["hit"], warm["events"]
    assert by_key(warm) == 2, warm["stats"]


def test_input_mutation_and_view_output_in_a_warm_process(after_cold):
    _, warm = after_cold("mutation")
    assert [e for e, _ in warm["events"]] == ["hit"], warm["events"]
    assert by_key(warm) == 2, warm["stats"]


def test_a_key_stored_in_another_context_is_explained_and_inductor_still_finds_it(
        tmp_path, cache_dir):
    # Inductor hashes the GraphModule with its `meta`: the cache slot aotgrad kept there, with
    # the keys stored in other contexts, made Inductor's own key another (a GPU warm process
    # compiled its forward again). Inductor's graph cache is this test's own: a key computed
    # with the slot in it cannot have been stored by an earlier run.
    inductor = inductor_cache_of_kernels(tmp_path / "inductor")
    run(tmp_path, "two_steps", "cold", **inductor)
    moved = 0
    for path in cache_dir.rglob("*.fxkey"):  # every key now says: stored with 99 threads
        records = store.unseal(path.read_bytes())
        elsewhere = {}
        for record in records.values():
            context = {**record["context"], "threads": "[99, null, null]"}
            elsewhere[fxcache.digest(context)] = {**record, "context": context}
        path.write_bytes(store.seal(elsewhere))
        moved += 1
    assert moved == 2
    warm = run(tmp_path, "two_steps", "warm", **inductor)
    assert by_key(warm) == 0, warm["stats"]
    assert warm["inductor"] == {"fxgraph_cache_hit": 2}, warm["inductor"]
    said = [line for line in warm["log"] if "not entered" in line]
    assert len(said) == 2 and all("threads: [99, null, null] -> [" in s for s in said), said
    for got, want in zip(warm["got"], warm["want"]):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want))


def test_the_context_read_before_a_process_compiles_anything_is_the_one_read_after():
    """A warm process hit before the trace reads its first graph's context before Inductor
    has imported its lazily loaded modules (its comms config); the cold process read it after
    its trace had. The forward then missed its stored key (on the GPU)."""
    script = textwrap.dedent("""
        import torch, aotgrad
        from aotgrad.backends import fxcache
        from aotgrad.schema import GraphInfo
        info = GraphInfo("forward", (0,), range(1), None)
        before = fxcache.context_state(info, None)
        f = torch.compile(lambda x: (x.sin() @ x.T).relu().sum(), backend="aotgrad")
        f(torch.randn(8, 8, requires_grad=True)).backward()
        after = fxcache.context_state(info, None)
        print(sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k)))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(REPO),
                                            "AOTGRAD_CACHE": "0"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_a_key_stored_under_our_defaults_does_not_serve_a_users_choice_against_them(
        monkeypatch):
    """The context a stored Inductor key is filed under is read under aotgrad's own Inductor
    defaults, as the compile runs: a key compiled with pointwise combos (a CUDA graph's
    default) must not load where the user turned them off, `combo_kernels=False` though that
    equals torch's default (session 37: the GPU's `aotgrad_no_combo` rows loaded the combo
    code by key from a merged cache). CPU graphs get the CUDA policy here."""
    import torch._inductor.compile_fx as compile_fx
    from torch._inductor import config as inductor_config
    from aotgrad import cache
    from aotgrad.backends import inductor_defaults
    from test_backends import _fake_cuda_input
    policy, inner, seen = inductor_defaults.for_graph, compile_fx.compile_fx_inner, []
    monkeypatch.setattr(inductor_defaults, "for_graph",
                        lambda config, role, inputs: policy(config, role, [_fake_cuda_input()]))

    def spy(gm, example_inputs, **kwargs):
        seen.append(inductor_config.combo_kernels)
        return inner(gm, example_inputs, **kwargs)
    monkeypatch.setattr(compile_fx, "compile_fx_inner", spy)
    x = torch.randn(4, 8, requires_grad=True)
    runs = []
    for options in (None, {"combo_kernels": False}, None):
        cache.reset_stats()
        seen.clear()
        f = torch.compile(lambda t: (t.cos() * t).sum(), backend="aotgrad", options=options)
        x.grad = None
        f(x).backward()
        torch._dynamo.reset()
        torch.testing.assert_close(x.grad, x.detach().cos() - x.detach() * x.detach().sin())
        runs.append(([e for e, _ in cache.events()], by_key({"stats": cache.stats()}), seen[:]))
    assert runs == [(["miss"], 0, [True, False]),  # the forward with combos, keys stored
                    (["miss"], 1, [False]),  # the user's options: another entry, the
                    # forward compiled again; the backward, combo-less under both, loads
                    (["hit"], 2, [])], runs        # our defaults again: both keys load
