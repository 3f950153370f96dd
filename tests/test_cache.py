"""The persistent compile cache (aotgrad/cache/): hits across processes with results identical
to a cold compile, a miss for every key component with its reason, corrupt entries,
untrusted directories, concurrent writers, eviction, and the compiles it refuses to cache.

Each test gets a cache directory of its own. Cross-process tests run real processes."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import aotgrad
from aotgrad import cache
from aotgrad.cache import codec, key as cache_key, store
from harness import requires_cuda
from torch.utils._python_dispatch import TorchDispatchMode

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    path = tmp_path / "cache"
    monkeypatch.setenv("AOTGRAD_CACHE", "1")
    monkeypatch.setenv("AOTGRAD_CACHE_DIR", str(path))
    monkeypatch.delenv("AOTGRAD_CACHE_SIZE_MB", raising=False)
    cache.reset_stats()
    return path


def last_event() -> tuple[str, str]:
    return cache.events()[-1]


# ---- in one process: hits, misses and their reasons -----------------------------------------

def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16),
                               torch.nn.ReLU(), torch.nn.Linear(16, 4))


def train_step(model, x, **options):
    """Outputs, gradients and buffers after one compiled step (fresh copy of `model`)."""
    compiled = aotgrad.compile(model, backend=options.pop("backend", "eager"), **options)
    out = compiled(x)
    out.sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    buffers = [b.clone() for b in model.buffers()]
    model.zero_grad()
    return out.detach(), grads, buffers


def test_second_compile_hits_and_matches_cold():
    x = torch.randn(5, 8)
    cold = train_step(mlp(), x)
    assert last_event()[0] == "miss"
    warm = train_step(mlp(), x)
    assert last_event()[0] == "hit"
    assert cache.stats()["hits"] == 1 and cache.stats()["misses"] == 1
    for a, b in zip(torch.utils._pytree.tree_leaves(cold), torch.utils._pytree.tree_leaves(warm)):
        assert torch.equal(a, b)


def _attention_block_output(x):
    """An attention's output laid out as its query ([b, t, h, d]), returned as a view."""
    q = x.transpose(1, 2)
    out = torch.nn.functional.scaled_dot_product_attention(q, q, q)
    return out.transpose(1, 2).view(2, 5, 8)


def test_an_attention_output_view_is_cached_without_a_warning(caplog):
    """Keying before the trace replayed the output's view chain on a contiguous stand-in for
    the attention's output, which `.view` after the transpose refuses: a 'could not key this
    compile' WARNING at every compile of such a block. Now a quiet reason, keyed after the
    trace (a hit the second time, as before)."""
    x = torch.randn(2, 5, 2, 4, requires_grad=True)
    with caplog.at_level("WARNING", logger="aotgrad"):
        outs = [aotgrad.compile(_attention_block_output, backend="eager")(x) for _ in range(2)]
    assert not [r for r in caplog.records if "could not" in r.getMessage()], caplog.text
    assert [e for e, _ in cache.events()] == ["miss", "hit"]
    assert "needs its base's layout" in cache.events()[0][1]
    assert outs[1]._base is not None and torch.equal(outs[0], outs[1])


def test_inference_graph_hits():
    x = torch.randn(5, 8)
    with torch.no_grad():
        cold = aotgrad.compile(mlp().eval(), backend="eager")(x)
        warm = aotgrad.compile(mlp().eval(), backend="eager")(x)
    assert [e for e, _ in cache.events()] == ["miss", "hit"]
    assert torch.equal(cold, warm)


def f(x, y):
    return (x.sin() * y).sum(-1)


def args(*shape, dtype=torch.float32, requires_grad=True, transpose=False):
    x = torch.randn(*shape, dtype=dtype)
    x = x.t().contiguous().t() if transpose else x
    return x.requires_grad_(requires_grad), torch.randn(*shape, dtype=dtype)


def compile_once(fn=f, inputs=None, **options):
    options.setdefault("backend", "eager")
    out = aotgrad.compile(fn, **options)(*(inputs or args(4, 6)))
    return out


MISSES = {  # variant -> (what the second compile changes, the reason's text)
    "memory_budget": (dict(memory_budget=0.6), "memory_budget 0.5 -> 0.6"),
    "stride": (dict(inputs=args(4, 6, transpose=True)), "input 0 float32[4, 6] stride (6, 1)"),
    "shape": (dict(inputs=args(4, 7)), "input 0 float32[4, 6]"),
    "dtype": (dict(inputs=args(4, 6, dtype=torch.float64)), "-> float64[4, 6]"),
    "requires_grad": (dict(inputs=(torch.randn(4, 6), torch.randn(4, 6).requires_grad_())),
                      "input 1 float32[4, 6] stride (6, 1) cpu -> float32[4, 6] stride (6, 1) "
                      "cpu requires_grad"),
    "program": (dict(fn=lambda x, y: (x.cos() * y).sum(-1)), "program sha256:"),
    "backend": (dict(backend=aotgrad.make_boxed_compiler(lambda gm, _: gm)), "backend "),
    "partitioner": (dict(memory_budget=None), "partitioner budget_partition -> "
                                              "min_cut_rematerialization_partition"),
}


@pytest.mark.parametrize("variant", sorted(MISSES))
def test_each_key_component_misses_with_its_reason(variant):
    compile_once(memory_budget=0.5)
    assert last_event()[0] == "miss"
    compile_once(memory_budget=0.5)
    assert last_event()[0] == "hit"
    change, reason = MISSES[variant]
    options = {"memory_budget": 0.5, **change}
    compile_once(**options)
    event, why = last_event()
    assert event == "miss" and reason in why, why


@pytest.mark.parametrize("component,patch", [
    ("torch", lambda mp: mp.setattr(torch, "__version__", "2.11.0")),
    ("torch", lambda mp: mp.setattr(torch.version, "git_version", "0123456789abcdef")),
    ("aotgrad", lambda mp: mp.setattr(cache_key, "aotgrad_version", lambda: "source sha256:x")),
    ("inductor config", None),
])
def test_versions_and_configuration_miss_with_their_reason(component, patch, monkeypatch):
    backend = "inductor" if component == "inductor config" else "eager"
    opts = dict(backend=backend)
    x = torch.randn(3)
    aotgrad.compile(torch.sin, **opts)(x)
    if patch is None:
        from torch._inductor import config
        monkeypatch.setattr(config, "max_autotune", not config.max_autotune)
    else:
        patch(monkeypatch)
    aotgrad.compile(torch.sin, **opts)(x)
    event, why = last_event()
    assert event == "miss" and why.startswith(component + " "), why
    if component == "inductor config":  # the option by name: its entry's code is not loaded
        assert f"max_autotune={not config.max_autotune!r}" not in why.split("->")[0]
        assert f"max_autotune={config.max_autotune!r}" in why.split("->")[1], why


def test_random_ops_hit_and_draw_as_cold():
    def drop(x):
        return torch.nn.functional.dropout(x, 0.5) * 2

    x = torch.randn(64, requires_grad=True)
    results = []
    for _ in range(2):
        torch.manual_seed(0)
        out = aotgrad.compile(drop, backend="eager")(x)
        (grad,) = torch.autograd.grad(out.sum(), x, create_graph=True)  # replays the draws
        results.append((out, grad))
    assert [e for e, _ in cache.events()] == ["miss", "hit"]
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


def test_bypasses_say_why():
    from torch.testing._internal.two_tensor import TwoTensor
    aotgrad.compile(torch.sin, backend="eager")(TwoTensor(torch.randn(4), torch.randn(4)))
    assert last_event()[0] == "bypass"
    assert last_event()[1].startswith("not cacheable: tensor subclass inputs or outputs; "
                                      "not keyed before the trace: it passes a TwoTensor")
    aotgrad.compile(f, backend="eager", dynamic=True)(*args(4, 6))
    assert last_event() == ("bypass", "not cacheable: symbolic shapes (dynamic=True)")
    custom = aotgrad.default_partition
    aotgrad.compile(f, backend="eager", partitioner=lambda *a, **k: custom(*a, **k))(*args(4, 6))
    event, why = last_event()
    assert event == "bypass" and "a custom partitioner" in why
    assert cache.stats()["bypasses"] == 3 and cache.stats()["stores"] == 0


def test_a_budget_partition_is_keyed_by_what_it_runs_with():
    """By its partial's arguments: attributes say nothing of what runs. A partitioner of
    the user's carrying a `memory_budget` attribute was keyed as the budget partitioner."""
    from aotgrad.cache.entry import partitioner_components
    from aotgrad.partition.budget import budget_partition
    changed = budget_partition(0.5)
    changed.memory_budget = 0.9  # runs with 0.5 still
    assert ("memory_budget", "0.5") in partitioner_components(changed)

    def mine(*args, **kwargs):
        return aotgrad.default_partition(*args, **kwargs)
    mine.memory_budget, mine.solver = 0.5, "auto"
    with pytest.raises(codec.Unencodable, match="a custom partitioner"):
        partitioner_components(mine)


def test_off_switch(monkeypatch):
    monkeypatch.setenv("AOTGRAD_CACHE", "0")
    compile_once()
    compile_once()
    assert cache.events() == [] and cache.stats()["stores"] == 0


def test_dynamo_and_compat_front_doors_hit():
    from aotgrad.compat import aot_function, nop
    x = torch.randn(4, 6, requires_grad=True)
    for _ in range(2):
        torch._dynamo.reset()
        torch.compile(f, backend=aotgrad.backend(backend="eager"))(x, x.detach()).sum().backward()
    assert [e for e, _ in cache.events()] == ["miss", "hit"]
    for _ in range(2):
        aot_function(f, fw_compiler=nop)(x, x.detach()).sum().backward()
    assert [e for e, _ in cache.events()][2:] == ["miss", "hit"]


def test_torch_compiles_inductor_settings_miss_with_their_reason_and_hit_alike():
    """A compile under other Inductor settings (torch.compile's options) never loads the
    entry of another's; under the same settings it hits."""
    x = torch.randn(4, 6, requires_grad=True)

    def step(options):
        torch._dynamo.reset()
        torch.compile(f, backend="aotgrad", options=options)(x, x.detach()).sum().backward()
    for options in (None, {"max_fusion_size": 7}, {"max_fusion_size": 9},
                    {"max_fusion_size": 7}, None):
        step(options)
    events = cache.events()
    assert [e for e, _ in events] == ["miss", "miss", "miss", "hit", "hit"], events
    assert "inductor settings" in events[2][1] and "9" in events[2][1], events[2][1]


def test_an_inductor_setting_that_is_code_is_not_cached():
    """A custom pass in torch.compile's options: its repr names an address, the same in
    another process for other code. Not stored: the compile bypasses with the reason."""
    def post_pass(graph):
        pass
    torch._dynamo.reset()
    x = torch.randn(4, 6, requires_grad=True)
    f_compiled = torch.compile(f, backend="aotgrad",
                               options={"post_grad_custom_post_pass": post_pass})
    f_compiled(x, x.detach()).sum().backward()
    event, why = last_event()
    assert event == "bypass" and "post_grad_custom_post_pass set to function" in why, why


def test_a_hits_graphs_carry_the_users_lines_as_a_cold_compiles_do():
    """A compiler reading `stack_trace` (Inductor's kernel comments, provenance) got none on
    a hit: the stored graphs kept no traces. Each is stored once per graph, shared by row."""
    seen = []

    def recording(gm, example_inputs):
        seen.append({n.name: n.meta.get("stack_trace") for n in gm.graph.nodes
                     if n.op == "call_function"})
        return gm
    x = torch.randn(4, 6, requires_grad=True)
    for _ in range(2):
        torch._dynamo.reset()
        torch.compile(f, backend=aotgrad.backend(backend=aotgrad.Backend(
            recording, recording, recording)))(x, x.detach()).sum().backward()
    assert [e for e, _ in cache.events()] == ["miss", "hit"]
    cold, warm = seen[:2], seen[2:]
    assert cold == warm and all(any(t for t in g.values()) for g in cold)


def test_warm_dynamo_compile_skips_analysis_and_trace(monkeypatch):
    from aotgrad.capture import analysis, pure
    calls = []
    for module in (analysis, pure):
        original = module.analyze
        monkeypatch.setattr(module, "analyze",
                            lambda *a, _f=original, **k: calls.append(1) or _f(*a, **k))
    x = torch.randn(4, 6, requires_grad=True)
    analyses = []
    for _ in range(2):
        torch._dynamo.reset()
        torch.compile(f, backend=aotgrad.backend(backend="eager"))(x, x.detach()).sum().backward()
        analyses.append(len(calls))
    assert [e for e, _ in cache.events()] == ["miss", "hit"]
    assert analyses[1] == analyses[0] > 0  # the cold compile's analysis only


# ---- the store: corruption, trust, eviction, clearing ---------------------------------------

def test_corrupt_entry_is_a_miss_with_a_warning(cache_dir):
    x = torch.randn(5, 8)
    cold = train_step(mlp(), x)
    entries = sorted((cache_dir / store.FORMAT).glob("*.json"))  # keyed by ops, by graph
    data = [entry.read_bytes() for entry in entries]
    for entry, whole in zip(entries, data):
        entry.write_bytes(whole[:len(whole) // 2])  # truncated
    with pytest.warns(UserWarning, match="corrupt .*sha256 does not match"):
        warm = train_step(mlp(), x)
    assert last_event()[0] == "miss" and cache.stats()["corrupt"] == len(entries) == 2
    assert all(torch.equal(a, b) for a, b in zip(cold[1], warm[1]))
    # the compile wrote the entries again, whole
    for entry, whole in zip(entries, data):
        entry.write_bytes(whole.replace(b'"op:aten::relu"', b'"op:aten::sigmoid"'))  # edited
    with pytest.warns(UserWarning, match="corrupt"):
        train_step(mlp(), x)


def test_an_unreadable_entry_is_a_miss_with_a_warning(cache_dir):
    x = torch.randn(5, 8)
    cold = train_step(mlp(), x)
    for entry in (cache_dir / store.FORMAT).glob("*.json"):
        entry.unlink()
        entry.mkdir()  # reading it raises IsADirectoryError, as a permission error would
    with pytest.warns(UserWarning, match="cannot be read"):
        warm = train_step(mlp(), x)
    assert last_event()[0] == "miss"
    assert all(torch.equal(a, b) for a, b in zip(cold[1], warm[1]))


def test_a_read_only_directory_still_hits_and_a_miss_compiles(cache_dir, monkeypatch):
    """A cache shipped read-only (an image, a shared mount): no file can be created there, a
    lock neither. Simulated, as chmod does not stop root."""
    x = torch.randn(5, 8)
    cold = train_step(mlp(), x)
    real_open = os.open

    def read_only(path, flags, *rest):
        if str(path).startswith(str(cache_dir)) and flags & os.O_CREAT:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *rest)

    monkeypatch.setattr(os, "open", read_only)
    warm = train_step(mlp(), x)
    assert last_event()[0] == "hit"
    assert all(torch.equal(a, b) for a, b in zip(cold[1], warm[1]))
    stores, inputs = cache.stats()["stores"], args(3, 2)  # a miss: compiled, not stored
    torch.testing.assert_close(compile_once(inputs=inputs), f(*inputs))
    assert last_event()[0] == "miss" and cache.stats()["stores"] == stores


def test_a_key_file_without_components_leaves_a_miss_explained(cache_dir):
    compile_once()
    for key_file in (cache_dir / store.FORMAT).glob("*.key"):
        key_file.write_bytes(store.seal({"not": "a key"}))  # sealed right, read wrong
    compile_once(inputs=args(4, 7))  # a miss, explained against the keys on disk
    assert last_event()[0] == "miss"


def test_group_or_world_writable_directory_is_not_read(cache_dir):
    compile_once()
    os.chmod(cache_dir, 0o777)
    with pytest.warns(UserWarning, match="writable by group or others.*not used"):
        compile_once()
    assert last_event() == ("bypass", "the cache directory is not trusted")
    assert cache.stats()["hits"] == 0


def test_directory_of_another_user_is_not_read(cache_dir, monkeypatch):
    compile_once()
    monkeypatch.setattr(os, "getuid", lambda: os.stat(cache_dir).st_uid + 1)
    with pytest.warns(UserWarning, match="owned by uid .*not used"):
        compile_once()
    assert last_event()[0] == "bypass" and cache.stats()["hits"] == 0


def test_least_recently_used_entries_are_evicted(cache_dir, monkeypatch):
    # Each program writes two entries: keyed by its ops, and by its joint graph.
    programs = [torch.sin, torch.cos, torch.tanh]
    x = torch.randn(3, requires_grad=True)
    aotgrad.compile(programs[0], backend="eager")(x)
    first = list((cache_dir / store.FORMAT).glob("*.json"))
    size = sum(p.stat().st_size for p in first)
    monkeypatch.setenv("AOTGRAD_CACHE_SIZE_MB", str(2.5 * size / (1 << 20)))
    aotgrad.compile(programs[1], backend="eager")(x)
    for path in first:  # sin's: least recently used
        os.utime(path, (0, 0))
    aotgrad.compile(programs[2], backend="eager")(x)  # over the limit: sin's go
    assert cache.stats()["evictions"] == len(first) == 2
    assert len(list((cache_dir / store.FORMAT).glob("*.json"))) == 4
    aotgrad.compile(programs[1], backend="eager")(x)
    assert last_event()[0] == "hit"
    aotgrad.compile(programs[0], backend="eager")(x)
    assert last_event()[0] == "miss"


def test_clear_and_stats(cache_dir):
    compile_once()
    compile_once()
    assert {k: cache.stats()[k] for k in ("hits", "misses", "stores")} == \
        {"hits": 1, "misses": 1, "stores": 2}  # keyed by its ops, and by its graph
    assert cache.clear() == 2
    compile_once()
    assert last_event()[0] == "miss" and last_event()[1].startswith("no entry in the cache yet")


CONSTANTS = [torch.tensor(3.5), torch.arange(5), torch.tensor([True, False]),
             torch.tensor([1.25, -2.0], dtype=torch.bfloat16), torch.tensor([1 + 2j]),
             torch.empty(0, 3), torch.randn(2, 3, dtype=torch.float64)]


def graph_with_constants(constants) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    root = torch.nn.Module()
    outs = []
    for i, c in enumerate(constants):
        setattr(root, f"_tensor_constant{i}", c)
        outs.append(graph.call_function(torch.ops.aten.lift_fresh_copy.default,
                                        (graph.get_attr(f"_tensor_constant{i}"),)))
    graph.output((x, *outs))
    return torch.fx.GraphModule(root, graph)


def test_tensor_constants_are_written_by_value():
    gm = graph_with_constants(CONSTANTS)
    rows = json.loads(json.dumps(codec.encode_graph(gm, lambda n: {})))
    back = codec.decode_graph(rows)
    assert back.code == gm.code  # Inductor's cache hashes the code: names kept
    for i, c in enumerate(CONSTANTS):
        got = getattr(back, f"_tensor_constant{i}")
        assert got.dtype == c.dtype and torch.equal(got, c)
    other = graph_with_constants([torch.tensor(3.25), *CONSTANTS[1:]])
    assert cache_key.program(other) != cache_key.program(gm)  # the value is in the key


@pytest.mark.parametrize("constant,reason", [
    (torch.zeros(codec.CONSTANT_BYTES // 4 + 1), "tensor constant"),
    (torch.zeros(4, 4).t(), "contiguous False"),
    (torch.nn.Parameter(torch.zeros(3)), "of type Parameter"),
    # Decoded, each would own its memory: an as_strided on it would read other values.
    (torch.arange(8.0)[2:5], "view of more memory"),
    (torch.arange(8.0)[:3], "view of more memory"),
    (torch.zeros(3, 1).as_strided((3, 1), (1, 7)), "view of more memory"),
])
def test_large_or_odd_constants_are_not_cached(constant, reason):
    with pytest.raises(codec.Unencodable, match=reason):
        codec.encode_graph(graph_with_constants([constant]), lambda n: {})


def test_a_closed_over_constant_is_cached_by_its_value():
    def scaled_by(value):
        c = torch.full((6,), value)
        return lambda x, y: (x.sin() * y * c).sum(-1)
    inputs = args(4, 6)
    for value, event in ((2.0, "miss"), (2.0, "hit"), (3.0, "miss")):
        fn = scaled_by(value)
        out = compile_once(fn, inputs)
        assert last_event()[0] == event, cache.events()
        torch.testing.assert_close(out, fn(*inputs))


def test_a_hit_reads_a_closed_over_tensor_where_it_lives():
    """The entry holds a closed-over tensor's value (its key), but a hit's graph must read
    the tensor itself, as eager and a cold compile do: it held the entry's copy, and an
    in-place change of the tensor after the compile was lost."""
    c = torch.full((6,), 2.0)

    def fn(x, y):
        return (x.sin() * y * c).sum(-1)
    inputs = args(4, 6)
    cold, warm = (aotgrad.compile(fn, backend="eager") for _ in range(2))
    for compiled in (cold, warm):
        compiled(*inputs)
    assert [e for e, _ in cache.events()] == ["miss", "hit"]
    with torch.no_grad():
        c.fill_(5.0)
    for compiled in (cold, warm):
        torch.testing.assert_close(compiled(*inputs), fn(*inputs))


def test_a_conjugate_input_is_keyed_by_its_bit_and_its_views_replay_from_a_hit():
    """The trace reads an input's conjugate bit (`.imag` through `_conj`): a plain input of
    the same geometry must miss, and a hit must rebuild the bit to replay the output view."""
    def parts(x):
        return x.imag, x.real * 2
    z = torch.randn(4, dtype=torch.complex64)
    for x, event in ((z.conj(), "miss"), (z.conj(), "hit"), (z, "miss")):
        out = compile_once(parts, (x,))
        assert last_event()[0] == event, cache.events()
        for a, b in zip(out, parts(x)):
            torch.testing.assert_close(a, b)
            assert (a.is_neg(), a._base is x) == (b.is_neg(), b._base is x)


def test_a_closed_over_view_of_more_memory_is_not_cached():
    """Its offset into a larger storage was lost in the entry: a warm process's as_strided
    read the view's own values, not the storage's (silently wrong before)."""
    big = torch.arange(8.0)
    view = big[2:5]

    def shifted(x):
        return x + view.as_strided((2,), (1,), 0)  # the storage's first two values: 0, 1
    for _ in range(2):  # cold, then what would be warm
        x = torch.zeros(2)
        assert torch.equal(aotgrad.compile(shifted, backend="eager")(x), shifted(x))
    assert last_event()[0] == "bypass" and "view of more memory" in last_event()[1]


def test_checksum_rejects_truncation_and_edits():
    sealed = store.seal({"a": [1, 2]})
    assert store.unseal(sealed) == {"a": [1, 2]}
    for bad in (sealed[:-1], sealed.replace(b"1", b"3"), b"", b"x" * 64):
        with pytest.raises(ValueError):
            store.unseal(bad)



def test_inductors_own_prims_decode_before_inductor_is_loaded():
    """A warm process reads an entry before any trace loaded Inductor's decompositions,
    which define its prims (dropout's seeds, max pooling's offsets): decoding loads them
    (on the GPU, ResNet-50's and GPT-2's entries were unusable without it)."""
    code = ("import sys, aotgrad; from aotgrad.cache import codec; "
            "assert 'torch._inductor.inductor_prims' not in sys.modules; "
            "print(codec.decode_target('op:prims::inductor_seeds.default'), "
            "codec.decode_target('op:prims::_low_memory_max_pool_with_offsets.default'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "prims.inductor_seeds.default" in done.stdout, done.stdout

# ---- across processes -------------------------------------------------------------------

SCRIPT = textwrap.dedent("""
    import copy, json, sys, time
    import torch, aotgrad
    from aotgrad import cache
    barrier = sys.argv[2] if len(sys.argv) > 2 else None
    torch.manual_seed(0)
    device = __import__("os").environ.get("STEP_DEVICE", "cpu")
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16),
                            torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(device)
    x = torch.randn(5, 8).to(device)
    eager = copy.deepcopy(m)
    eager_out = eager(x)
    eager_out.sum().backward()
    prepared = []  # Inductor hashing a graph for its FX graph cache key
    if sys.argv[1] == "inductor":
        from torch._inductor import codecache
        hash_graph = codecache.FxGraphCache.prepare_key
        codecache.FxGraphCache.prepare_key = staticmethod(
            lambda *a, **k: prepared.append(1) or hash_graph(*a, **k))
    while barrier and not __import__("os").path.exists(barrier):
        time.sleep(0.01)
    out = aotgrad.compile(m, backend=sys.argv[1])(x)
    out.sum().backward()
    from torch._dynamo.utils import counters
    print(json.dumps({"events": cache.events(), "stats": cache.stats(),
                      "inductor": dict(counters["inductor"]), "prepared": len(prepared),
                      "values": [t.tolist() for t in
                                 [out, *[p.grad for p in m.parameters()], *m.buffers()]],
                      "eager": [t.tolist() for t in [eager_out, *[p.grad for p in eager.parameters()],
                                                     *eager.buffers()]]}))
""")


def run_script(tmp_path: Path, backend: str, barrier: Path | None = None,
               start: bool = False, device: str = "cpu", **env_vars) -> subprocess.Popen | dict:
    script = tmp_path / "step.py"
    script.write_text(SCRIPT)
    # Inductor's own cache stays where it is: warm from an earlier run, it makes the cold
    # process fast too, and the warm one must still find its graphs there.
    env = {**os.environ, "PYTHONPATH": str(REPO), "STEP_DEVICE": device, **env_vars}
    cmd = [sys.executable, str(script), backend, *([str(barrier)] if barrier else [])]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    return proc if start else result_of(proc)


def inductor_cache_of_kernels(path: Path) -> dict[str, str]:
    """The environment of a process whose Inductor finds none of its graphs stored, with
    the compiled kernels of Inductor's own cache linked in: each graph's key is computed and
    missed as in an empty cache, and gcc builds no kernel it has built before (an empty
    cache cost the process ~20 s). Left out: Inductor's graph entries, torch's autograd
    cache's, and the temporary directories."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    path.mkdir()
    for sub in Path(cache_dir()).iterdir():
        if sub.is_dir() and sub.name not in ("fxgraph", "aotautograd") \
                and not sub.name.startswith("tmp"):
            (path / sub.name).symlink_to(sub)
    return {"TORCHINDUCTOR_CACHE_DIR": str(path)}


def result_of(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_hit_in_another_process_gives_identical_results(tmp_path):
    cold = run_script(tmp_path, "eager")
    warm = run_script(tmp_path, "eager")
    assert [e for e, _ in cold["events"]] == ["miss"]
    assert [e for e, _ in warm["events"]] == ["hit"], warm["events"]
    assert warm["values"] == cold["values"]  # outputs, gradients, running statistics


STALE_SCRIPT = textwrap.dedent("""
    import json, sys
    import torch, aotgrad
    from torch.utils._python_dispatch import TorchDispatchMode
    from aotgrad import cache
    from aotgrad.compat import aot_function, aot_module_simplified, nop
    cold = sys.argv[1] == "cold"

    class SinAsCos(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            func = torch.ops.aten.cos.default if func is torch.ops.aten.sin.default else func
            return func(*args, **(kwargs or {}))

    def f(t):
        return torch.sin(t) * 2

    def hooked():  # the warm process's graph module has a hook; the cold one's has none
        gm = torch.fx.symbolic_trace(lambda t: torch.sin(t) * 3)
        if not cold:
            gm.register_forward_pre_hook(lambda m, args: (args[0] * 10,))
        return gm
    x = torch.randn(5, generator=torch.Generator().manual_seed(0), requires_grad=True)
    calls = {"function": (lambda: aotgrad.compile(f, backend="eager"), f),
             # compiled where it is called (under the mode when cold), as Dynamo's backends
             "graph module": (lambda: aot_module_simplified(torch.fx.symbolic_trace(f), [x], nop),
                              f)}
    wrong = []
    for name, (compiled, eager) in calls.items():
        with (SinAsCos() if cold else torch.enable_grad()):
            got, want = compiled()(x), eager(x)
        if not torch.allclose(got, want):
            wrong.append(name)
    gm = hooked()
    if not torch.allclose(aot_function(gm, nop)(x), gm(x)):
        wrong.append("hooked graph module")
    c = torch.full((5,), 2.0)  # the entry holds its value; a hit must read it where it lives
    scaled = aotgrad.compile(lambda t: t.cos() * c, backend="eager")
    scaled(x)
    with torch.no_grad():
        c.fill_(5.0)
    if not torch.allclose(scaled(x), x.cos() * c):
        wrong.append("closed-over tensor changed after the compile")
    print(json.dumps({"wrong": wrong, "events": cache.events()}))
""")


def test_a_warm_process_without_the_cold_ones_mode_or_hook_computes_as_eager(tmp_path):
    """The cold process compiles under a dispatch mode that rewrites sin (and a graph
    module without a hook); the warm one without the mode (and with a hook): it was served
    the cold one's graphs, and returned cos and the unhooked result. And a hit's graph read
    a closed-over tensor's value from the entry, not the tensor changed since."""
    script = tmp_path / "stale.py"
    script.write_text(STALE_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    runs = [subprocess.run([sys.executable, str(script), phase], env=env, capture_output=True,
                           text=True, timeout=300) for phase in ("cold", "warm")]
    assert all(r.returncode == 0 for r in runs), runs[-1].stderr
    cold, warm = (json.loads(r.stdout.strip().splitlines()[-1]) for r in runs)
    assert cold["wrong"] == [] and warm["wrong"] == [], warm["events"]


def test_concurrent_writers_compile_once(tmp_path):
    barrier = tmp_path / "go"
    procs = [run_script(tmp_path, "eager", barrier, start=True) for _ in range(3)]
    barrier.touch()
    results = [result_of(p) for p in procs]
    # One compiles (its events: a miss), the others wait on the lock of the entry keyed by
    # its ops and read it (a hit before the trace: they do not trace it either).
    assert sorted(e for r in results for e, _ in r["events"]) == ["hit", "hit", "miss"]
    hits = [why for r in results for e, why in r["events"] if e == "hit"]
    assert all(why.startswith("before the trace") for why in hits), hits
    assert len(list((tmp_path / "cache" / store.FORMAT).glob("*.json"))) == 2
    assert all(r["values"] == results[0]["values"] for r in results)
    assert not list((tmp_path / "cache" / store.FORMAT).glob("*.lock"))


@requires_cuda
def test_inductor_hit_skips_codegen_in_another_process(tmp_path):
    """On a GPU Inductor keys a static input by its storage: the backward's saved parameter
    must carry the same mark whether its graph was traced or read from our cache. (On the
    CPU, the by-key test below asserts all of this and more.)"""
    cold = run_script(tmp_path, "inductor", device="cuda")
    warm = run_script(tmp_path, "inductor", device="cuda")
    assert [e for e, _ in warm["events"]] == ["hit"]
    # The forward and the backward: Inductor found both compiled in its own cache.
    assert warm["inductor"].get("fxgraph_cache_hit") == 2, warm["inductor"]
    assert "fxgraph_cache_miss" not in warm["inductor"], warm["inductor"]
    assert warm["values"] == cold["values"]


def test_warm_process_loads_inductor_graphs_by_key_without_hashing(tmp_path):
    """A hit hands Inductor the FX graph cache keys stored with the entry: Inductor does not
    hash the graphs again (`prepare_key`), and the results are the cold process's. (Inductor's
    own cache is the default one: whether warm from earlier runs or not, the cold process
    hashes each graph and stores its key, and the warm one loads by it.)"""
    cold = run_script(tmp_path, "inductor")
    warm = run_script(tmp_path, "inductor")
    assert "fxgraph_cache_miss" not in warm["inductor"], warm["inductor"]
    assert cold["stats"]["inductor_by_key"] == 0 and cold["prepared"] == 2
    assert [e for e, _ in warm["events"]] == ["hit"]
    assert warm["stats"]["inductor_by_key"] == 2, warm["stats"]  # the forward and the backward
    assert warm["prepared"] == 0
    assert warm["inductor"].get("fxgraph_cache_hit") == 2, warm["inductor"]
    assert warm["values"] == cold["values"]
    for got, want in zip(warm["values"], warm["eager"]):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want))


def test_stored_inductor_key_without_its_artifact_falls_back(tmp_path):
    """Inductor's cache emptied under ours (here: the warm process given one without its
    graphs, the cold one Inductor's default): the keys find nothing, each graph is traced to
    fake values and compiled again, and the step still matches eager."""
    cold = run_script(tmp_path, "inductor")
    warm = run_script(tmp_path, "inductor", **inductor_cache_of_kernels(tmp_path / "empty"))
    assert [e for e, _ in warm["events"]] == ["hit"]
    assert warm["stats"]["inductor_by_key"] == 0
    assert warm["stats"]["inductor_by_key_missing"] == 2, warm["stats"]
    # Each graph misses twice: by our stored key, then by the key Inductor computes again.
    assert warm["inductor"].get("fxgraph_cache_miss") == 4, warm["inductor"]
    assert warm["values"] == cold["values"]
    for got, want in zip(warm["values"], warm["eager"]):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want))


def test_a_sealed_but_malformed_inductor_key_record_is_dropped_when_read(cache_dir):
    """Loading by key reads a record's key and guards: a record without its guards (a
    file edited, or written by another tool, and sealed again) raised in the compile."""
    from aotgrad.cache import fxkeys
    path = store.Store(store.directory())
    good = {"key": "fabc", "guards": None, "context": {}}
    records = {"a": good, "b": {"key": "fdef"}, "c": {"key": "f", "guards": 3}, "d": "x"}
    store.write_atomic(path.path / f"g{fxkeys.SUFFIX}", store.seal(records))
    assert fxkeys.read(path, "g") == {"a": good}


def test_inductor_key_is_not_taken_in_another_context(monkeypatch):
    """The keys are stored by the context Inductor computed them in: another thread count
    (Inductor's CPU kernels specialize on it) is not that context."""
    from aotgrad.backends import fxcache
    from aotgrad.schema import GraphInfo
    def context(info, donated=None):
        return fxcache.digest(fxcache.context_state(info, donated))
    info = GraphInfo("forward", (0,), range(1), None)
    here = context(info)
    assert here == context(info)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1000)
    assert context(info) != here
    assert context(GraphInfo("backward", (0,), range(1), None), [0]) != here


@pytest.mark.parametrize("name", ["post_grad_custom_post_pass", "_pre_fusion_custom_pass",
                                  "_post_fusion_custom_pass"])
def test_a_context_with_a_custom_inductor_pass_is_never_entered_by_key(name):
    """Inductor's key holds a custom pass's uuid, ours cannot: its graphs compile as usual.
    The private fusion passes are not in Inductor's portable config either: a context
    holding one read as the same context whatever the pass did."""
    from torch._inductor import config
    from aotgrad.backends import fxcache
    from aotgrad.schema import GraphInfo

    class Pass:
        def __call__(self, *args):
            return None

        def uuid(self):
            return "p"
    info = GraphInfo("forward", (0,), range(1), None)
    assert fxcache.context_state(info, None) is not None
    with config.patch({name: Pass()}):
        assert fxcache.context_state(info, None) is None


def test_lock_of_a_dead_process_is_broken_a_live_one_times_out_and_ours_is_reentered(tmp_path):
    s = store.Store(tmp_path)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    (tmp_path / "k.lock").write_text(dead)  # its holder exited without removing it
    with s.lock("k", timeout=5) as waited:
        assert not waited and (tmp_path / "k.lock").read_text() == str(os.getpid())
        # A compile nested in the holder's own (this process) does not wait for itself.
        with s.lock("k", timeout=60) as waited_too:
            assert not waited_too and cache.stats()["lock_timeouts"] == 0
        assert (tmp_path / "k.lock").exists()  # the holder's lock stays
    assert not (tmp_path / "k.lock").exists()
    # Held by another live process: a compile waits, then goes on without it.
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "k.lock").write_text(str(live.pid))
        with s.lock("k", timeout=0.2) as waited:
            assert waited and cache.stats()["lock_timeouts"] == 1
        assert (tmp_path / "k.lock").read_text() == str(live.pid)  # the holder's lock stays
    finally:
        live.kill()


def test_a_lock_left_without_its_pid_is_broken_once_old(tmp_path):
    """Its holder died between making it and writing its pid: no pid says it is dead. Before,
    every compile of that entry waited for the whole timeout, forever."""
    s = store.Store(tmp_path)
    lock = tmp_path / "k.lock"
    lock.write_text("")
    with s.lock("k", timeout=0.2) as waited:  # new: its holder may be writing its pid
        assert waited and lock.read_text() == ""
    old = time.time() - store.LOCK_WRITE_GRACE - 1
    os.utime(lock, (old, old))
    with s.lock("k", timeout=5) as waited:
        assert not waited and lock.read_text() == str(os.getpid())
    assert not lock.exists() and cache.stats()["lock_timeouts"] == 1


def test_a_dead_lock_that_cannot_be_removed_is_passed_not_spun_on(tmp_path, monkeypatch):
    """A read-only cache (an image) holding a lock its dead holder left: it cannot be
    broken, and no one holds it. Before, the compile retried breaking it forever."""
    s = store.Store(tmp_path)
    lock = tmp_path / "k.lock"
    lock.write_text("")
    old = time.time() - store.LOCK_WRITE_GRACE - 1
    os.utime(lock, (old, old))
    real_unlink = Path.unlink

    def read_only(path, *args, **kwargs):
        if path == lock:
            raise PermissionError(13, "Permission denied", str(path))
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(Path, "unlink", read_only)
    started = time.monotonic()
    with s.lock("k", timeout=30) as waited:
        assert not waited and lock.read_text() == ""
    assert time.monotonic() - started < 5 and lock.exists()


# ---- compiled autograd's graphs -------------------------------------------------------------

def backward_grads(model, batch_sizes, compiled=True, hook=None):
    """Gradients after one backward per batch size (each in an enable() context of its own:
    the engine's cache is emptied, so each captures and specializes anew)."""
    from aotgrad import compiled_autograd
    out = []
    for n in batch_sizes:
        model.zero_grad(set_to_none=True)
        torch.manual_seed(n)
        x = torch.randn(n, 8)
        with compiled_autograd.enable("eager") if compiled else torch.enable_grad():
            model(x).sum().backward()
        out.append([p.grad.clone() for p in model.parameters()])
    return out


def plain_mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def test_compiled_autograd_graph_hits_and_matches_eager():
    import copy
    model = plain_mlp()
    expected = backward_grads(copy.deepcopy(model), [5, 5, 3], compiled=False)
    actual = backward_grads(model, [5, 5, 3])
    assert [e for e, _ in cache.events()] == ["miss", "hit", "miss"]
    # The third misses on its sizes, said against the nearest entry (the same program).
    reason = cache.events()[-1][1]
    assert "float32[5, 8]" in reason and "-> float32[3, 8]" in reason, reason
    for e, a in zip(expected, actual):
        for ge, ga in zip(e, a):
            torch.testing.assert_close(ga, ge, rtol=0, atol=0)


def test_compiled_autograd_hit_guards_exact_values():
    """A hit's variant is served only for the keyed values: other sizes in the same
    capture fail its guard and specialize again, matching eager ((4, 1) + (4,) broadcasts
    where (4, 4) + (4,) did not)."""
    from aotgrad import compiled_autograd
    p = torch.randn(4, requires_grad=True)

    def steps(shapes):
        grads = []
        for i, shape in enumerate(shapes):
            p.grad = None
            x = torch.randn(shape, generator=torch.Generator().manual_seed(i))
            x.requires_grad_()  # its gradient sums the broadcast dim of (4, 1)
            (x * 2 + p).pow(2).sum().backward()
            grads.append((x.grad, p.grad.clone()))
        return grads
    expected = steps([(4, 4), (4, 4), (4, 1)])
    with compiled_autograd.enable("eager"):
        steps([(4, 4)])  # stores the entry for (4, 4)
    with compiled_autograd.enable("eager") as stats:
        actual = steps([(4, 4), (4, 4), (4, 1)])
    assert [e for e, _ in cache.events()] == ["miss", "hit", "miss"]
    assert stats.captures == 1 and len(stats.guard_failures) == 1
    assert "].size() == (4, 4) failed" in stats.guard_failures[0]  # the fact that changed
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)


class Doubler(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


@pytest.mark.parametrize("what, reason", [
    ("hook", "a tensor hook"),
    ("function", "custom autograd.Function"),
    ("region", "aotgrad region's backward"),
])
def test_compiled_autograd_bypasses_what_a_key_cannot_see(what, reason):
    from aotgrad import compiled_autograd
    model = plain_mlp()
    x = torch.randn(5, 8)
    if what == "hook":
        model[0].weight.register_hook(lambda g: g * 3)
    forward = {"hook": model, "function": lambda v: Doubler.apply(model(v)),
               "region": aotgrad.compile(model, backend="eager")}[what]
    cache.reset_stats()
    with compiled_autograd.enable("eager"):
        forward(x).sum().backward()
    event, why = cache.events()[-1]
    assert event == "bypass" and reason in why, cache.events()
    kinds = [k["kind"] for k in store.Store(store.directory()).keys()]
    assert "compiled autograd" not in kinds  # (the region's own compile is cached)


def test_compiled_autograd_under_a_users_mode_is_not_cached():
    """Its trace runs the formulas' ops through the mode: a backward under one stored the
    rewritten graph, which the next backward without it was served."""
    from aotgrad import compiled_autograd

    def grad(mode):
        x = torch.randn(4, generator=torch.Generator().manual_seed(0), requires_grad=True)
        y = torch.cos(x).sum()  # its backward calls sin
        with compiled_autograd.enable("eager"), mode:
            y.backward()
        return x.grad
    grad(SinAsCos())
    assert cache.events()[-1] == ("bypass", "compiled autograd: not cacheable: SinAsCos "
                                  "around the backward")
    x = torch.randn(4, generator=torch.Generator().manual_seed(0), requires_grad=True)
    torch.testing.assert_close(grad(contextlib.nullcontext()), -torch.sin(x.detach()))


CA_SCRIPT = textwrap.dedent("""
    import json
    import torch, aotgrad
    from aotgrad import cache, compiled_autograd
    from aotgrad.autograd import specialize
    traces = []
    run = specialize.Specialization.run
    specialize.Specialization.run = lambda self, *a: traces.append(1) or run(self, *a)
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    with compiled_autograd.enable("eager"):
        m(torch.randn(5, 8)).sum().backward()
    print(json.dumps({"events": cache.events(), "traces": len(traces),
                      "grads": [p.grad.tolist() for p in m.parameters()]}))
""")


def test_compiled_autograd_hit_in_another_process_skips_the_trace(tmp_path):
    script = tmp_path / "ca.py"
    script.write_text(CA_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    runs = [subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                           text=True, timeout=300) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[-1].stderr
    cold, warm = (json.loads(r.stdout.strip().splitlines()[-1]) for r in runs)
    assert [e for e, _ in cold["events"]] == ["miss"] and cold["traces"] == 1
    assert [e for e, _ in warm["events"]] == ["hit"] and warm["traces"] == 0
    assert warm["grads"] == cold["grads"]


# ---- the first level: a GraphModule keyed before its analysis and trace ---------------------

DYNAMO_SCRIPT = textwrap.dedent("""
    import copy, json, sys
    import torch, aotgrad
    from aotgrad import cache
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16),
                                torch.nn.ReLU(), torch.nn.Linear(16, 4))

    def step(m, x, counter):
        counter.add_(1)  # an input mutation
        out = m(x) / torch.tensor(8.0).sqrt()  # a tensor constant in the graph, as HF models'
        return out, counter  # an output that is an input: an alias

    def run(m, fn):
        x, counter = torch.randn(5, 8), torch.zeros(3)
        out, alias = fn(m, x, counter)
        out.sum().backward()
        values = [out, counter, *[p.grad for p in m.parameters()], *m.buffers()]
        return [t.tolist() for t in values], alias is counter

    torch.manual_seed(1)
    eager = run(copy.deepcopy(model), step)
    torch.manual_seed(1)
    compiled = run(model, torch.compile(step, backend=aotgrad.backend(backend="eager")))
    print(json.dumps({"events": cache.events(), "eager": eager, "compiled": compiled}))
""")


def run_dynamo_script(tmp_path: Path) -> dict:
    script = tmp_path / "dynamo_step.py"
    script.write_text(DYNAMO_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    return result_of(proc)


def test_hit_before_the_trace_in_another_process_matches_cold_and_eager(tmp_path):
    cold = run_dynamo_script(tmp_path)
    warm = run_dynamo_script(tmp_path)
    assert [e for e, _ in cold["events"]] == ["miss"]
    assert [(e, w.split(":")[0]) for e, w in warm["events"]] == [("hit", "before the trace")]
    # outputs, the mutated input, gradients, running statistics; the alias is the input
    assert warm["compiled"] == cold["compiled"]
    values, aliased = warm["compiled"]
    assert aliased and warm["eager"][1]
    for got, want in zip(values, warm["eager"][0]):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want))


def dynamo_step(x, y, **options):
    torch._dynamo.reset()
    out = torch.compile(f, backend=aotgrad.backend(backend="eager", **options))(x, y)
    out.sum().backward()
    return out


PRE_MISSES = {  # variant -> (what the second compile changes, the reason's text)
    "memory_budget": (dict(memory_budget=0.6), "memory_budget 0.5 -> 0.6"),
    "stride": (dict(x=torch.randn(6, 4).t().requires_grad_()),
               "input 0 float32[4, 6] stride (6, 1) cpu requires_grad -> "
               "float32[4, 6] stride (1, 4) cpu requires_grad"),
    "requires_grad": (dict(y=torch.randn(4, 6).requires_grad_()),
                      "input 1 float32[4, 6] stride (6, 1) cpu -> "
                      "float32[4, 6] stride (6, 1) cpu requires_grad"),
}


@pytest.mark.parametrize("variant", sorted(PRE_MISSES))
def test_a_changed_input_or_option_misses_before_the_trace_with_its_reason(variant):
    x, y = torch.randn(4, 6, requires_grad=True), torch.randn(4, 6)
    dynamo_step(x, y, memory_budget=0.5)
    dynamo_step(x, y, memory_budget=0.5)
    assert last_event()[1].startswith("before the trace: ")
    change, reason = PRE_MISSES[variant]
    inputs = {"x": x, "y": y, **{k: v for k, v in change.items() if k in "xy"}}
    budget = change.get("memory_budget", 0.5)
    out = dynamo_step(inputs["x"], inputs["y"], memory_budget=budget)
    event, why = last_event()
    assert event == "miss" and f"before the trace: {reason}" in why, why
    torch.testing.assert_close(out, f(inputs["x"], inputs["y"]))


def attention(q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v)


@contextlib.contextmanager
def sdp_flag(read, write, value):
    saved = read()
    write(value)
    try:
        yield
    finally:
        write(saved)


_CUDA = torch.backends.cuda
FLAG_CHANGES = {  # whether bf16 attention upcasts (silently served stale before), ...
    "math_sdp_reduction": lambda: sdp_flag(_CUDA.fp16_bf16_reduction_math_sdp_allowed,
                                           _CUDA.allow_fp16_bf16_reduction_math_sdp, True),
    "cudnn_sdp": lambda: sdp_flag(_CUDA.cudnn_sdp_enabled, _CUDA.enable_cudnn_sdp, False),
    # the CPU LSTM's kernel; a context, as torch's test utilities forbid setting it plainly
    "mkldnn": lambda: torch.backends.mkldnn.flags(enabled=False),
}


@pytest.mark.parametrize("change", sorted(FLAG_CHANGES))
def test_a_flag_choosing_what_a_composite_op_traces_into_is_in_the_key(change):
    """Dynamo's graph calls attention (an LSTM, batch_norm), whose ATen ops these flags
    choose: a graph keyed before its trace must not be served across them."""
    q, k, v = (torch.randn(1, 2, 16, 64).bfloat16().requires_grad_() for _ in range(3))
    with sdp_flag(_CUDA.flash_sdp_enabled, _CUDA.enable_flash_sdp, False):  # math, op by op
        torch.compile(attention, backend=aotgrad.backend(backend="eager"))(q, k, v)
        with FLAG_CHANGES[change]():
            torch._dynamo.reset()
            out = torch.compile(attention, backend=aotgrad.backend(backend="eager"))(q, k, v)
            event, why = last_event()  # the trace runs (its graph may hit: one trace for both)
            assert "before the trace: global state" in why, why
            assert torch.equal(out, attention(q, k, v))


def test_corrupt_entry_before_the_trace_is_a_miss_with_a_warning(cache_dir):
    x, y = torch.randn(4, 6, requires_grad=True), torch.randn(4, 6)
    cold = dynamo_step(x, y)
    cold_grad, x.grad = x.grad.clone(), None
    entry = program_entry(cache_dir)
    data = entry.read_bytes()
    entry.write_bytes(data[:len(data) // 2])
    with pytest.warns(UserWarning, match="corrupt .*sha256 does not match"):
        warm = dynamo_step(x, y)
    event, why = last_event()
    assert event == "hit" and "before the trace" in why  # the second level's
    assert torch.equal(warm, cold) and torch.equal(x.grad, cold_grad)


def program_entry(cache_dir: Path) -> Path:
    """The entry keyed before the trace (its key file says kind 'program')."""
    for key_file in (cache_dir / store.FORMAT).glob("*.key"):
        if store.unseal(key_file.read_bytes())["components"]["kind"] == "program":
            return key_file.with_suffix(".json")
    raise AssertionError("no entry keyed before the trace")


VIEW_SCRIPT = textwrap.dedent("""
    import json, sys
    import torch, aotgrad
    from aotgrad import cache

    def intermediate(x, y):  # (a) views of an intermediate
        h = x * 2 + y
        return h.t(), h.view(-1)[2:], h.transpose(0, 1).select(0, 1), h.sum()

    def of_input(x, y):  # (b) views of inputs, one that requires grad and one that does not
        return (x.t(), x[1:, ::2], x.unsqueeze(0).expand(2, 4, 6), x.reshape(24),
                y.permute(1, 0), (x * 3).sum())

    def split(x, y):  # (c) several views of one base
        h = x + y
        a, b, c = h.split(2, dim=1)
        return a, b, c, h.unbind(0)[1], x.chunk(2)[1]

    def first_line(exc):
        return str(exc).splitlines()[0]

    def run(fn, compiled):
        torch.manual_seed(0)
        x, y = torch.randn(4, 6, requires_grad=True), torch.randn(4, 6)
        outs = list((torch.compile(fn, backend=aotgrad.backend(backend="eager"))
                     if compiled else fn)(x, y))
        bases = [o._base for o in outs]
        # a view's grad_fn is eager's; a plain output's is the compiled node
        facts = [[o._is_view(), o._is_view() and type(o.grad_fn).__name__, o.requires_grad,
                  ["x" if b is x else "y" if b is y else
                   next(j for j, c in enumerate(bases) if c is b) if b is not None else None
                   for b in [bases[i]]][0]] for i, o in enumerate(outs)]
        values = [o.tolist() for o in outs]
        inplace = []
        for o in outs:  # in place on each output, where eager allows it
            try:
                o.mul_(2)
                inplace.append(["ok", o._version, o._base._version if o._is_view() else None,
                                o._is_view() and type(o.grad_fn).__name__])
            except RuntimeError as exc:
                inplace.append(first_line(exc))
        try:
            sum(o.sum() for o in outs if o.requires_grad).backward()
            backward = "ok"
        except RuntimeError as exc:
            backward = first_line(exc)
        grad = x.grad.tolist() if x.grad is not None else None
        return {"values": values, "facts": facts, "inplace": inplace, "backward": backward,
                "after": [o.tolist() for o in outs], "x.grad": grad, "y": y.tolist()}

    results = {}
    for fn in (intermediate, of_input, split):
        torch._dynamo.reset()
        results[fn.__name__] = {"eager": run(fn, False), "compiled": run(fn, True)}
    print(json.dumps({"events": cache.events(), "results": results}))
""")


def test_view_outputs_hit_before_the_trace_in_another_process(tmp_path):
    script = tmp_path / "views.py"
    script.write_text(VIEW_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cold, warm = (result_of(subprocess.Popen([sys.executable, str(script)], env=env,
                                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                             text=True)) for _ in range(2))
    assert [e for e, _ in cold["events"]] == ["miss"] * 3, cold["events"]
    assert [(e, w.split(":")[0]) for e, w in warm["events"]] == [("hit", "before the trace")] * 3
    for name, runs in warm["results"].items():
        eager, compiled = runs["eager"], runs["compiled"]
        assert compiled == cold["results"][name]["compiled"], name
        # _is_view, grad_fn, requires_grad, _base; in place: error, versions, grad_fn after
        assert compiled["facts"] == eager["facts"], name
        assert compiled["inplace"] == eager["inplace"], name
        assert compiled["backward"] == eager["backward"], name
        assert (compiled["x.grad"] is None) == (eager["x.grad"] is None), name
        pairs = zip(compiled["values"] + compiled["after"] + [compiled["y"], compiled["x.grad"]],
                    eager["values"] + eager["after"] + [eager["y"], eager["x.grad"]])
        for got, want in pairs:
            if got is not None:  # x.grad of a failed backward
                torch.testing.assert_close(torch.tensor(got), torch.tensor(want))


def test_view_outputs_hit_before_the_trace_in_this_process():
    def views(x):  # view(dtype) has no view replay: the runtime uses as_strided, cold and warm
        return x.t(), x.view(torch.int32), x[:, 1:].unsqueeze(0), (x * 2).sum()

    x = torch.randn(4, 6, requires_grad=True)
    outs = []
    for _ in range(2):
        torch._dynamo.reset()
        outs.append(torch.compile(views, backend=aotgrad.backend(backend="eager"))(x))
    event, why = last_event()
    assert event == "hit" and why.startswith("before the trace: "), why
    for got, want in zip(outs[1], views(x)):
        assert torch.equal(got, want) and got._is_view() == want._is_view()
        assert (got._base is x) == (want._base is x)
    assert [type(o.grad_fn).__name__ for o in outs[1][:3]] == \
        [type(o.grad_fn).__name__ for o in outs[0][:3]]


def test_view_chain_holds_view_ops_only():
    """An entry names ops by name: one that is not an ATen view op is refused when encoding
    and when decoding; a replay the recorder cannot follow is Unencodable."""
    from aotgrad.cache import info as info_codec, views
    x = torch.randn(4, 6)
    chain = views.chain_of(lambda base: base[1:].t(), torch.empty(4, 6, device="meta"))
    assert [step.op for step in chain.steps] == [torch.ops.aten.slice.Tensor,
                                                 torch.ops.aten.t.default]
    decoded = info_codec.decode(json.loads(json.dumps(info_codec.encode(chain))))
    assert decoded == chain and torch.equal(decoded(x), x[1:].t())
    bad = json.loads(json.dumps(info_codec.encode(chain)).replace("aten::t", "aten::neg"))
    with pytest.raises(ValueError, match="not an ATen view op"):
        info_codec.decode(bad)
    with pytest.raises(codec.Unencodable, match="not an ATen view op"):
        views.chain_of(lambda base: base.neg(), torch.empty(3, device="meta"))
    with pytest.raises(codec.Unencodable, match="on another tensor"):
        views.chain_of(lambda base: torch.empty(3, device="meta").t(),
                       torch.empty(3, device="meta"))


def test_aot_function_of_a_graph_module_hits_before_the_trace():
    from aotgrad.compat import aot_function, nop
    gm = torch.fx.symbolic_trace(f)
    x = torch.randn(4, 6, requires_grad=True)
    results = []
    for _ in range(2):
        out = aot_function(gm, fw_compiler=nop)(x, x.detach())
        out.sum().backward()
        results.append((out.detach(), x.grad))
        x.grad = None
    assert [e for e, _ in cache.events()][-2:] == ["miss", "hit"]
    assert last_event()[1].startswith("before the trace: ")
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_a_graph_module_running_other_code_than_its_graph_is_not_served_its_graph():
    """aot_function(gm) calls gm, as eager: a hook of its own, or a graph edited without
    recompile() (the old code runs), is not what the graph says. Before, such a gm was run
    node by node and keyed by its graph: served the plain graph's entry."""
    from aotgrad.compat import aot_function, nop

    def traced():
        return torch.fx.symbolic_trace(lambda t: torch.sin(t) * 2)
    hooked = traced()
    hooked.register_forward_pre_hook(lambda m, args: (args[0] * 10,))
    edited = torch.fx.symbolic_trace(lambda t: torch.cos(t) * 2)
    for node in edited.graph.nodes:  # its graph now says sin, its code still runs cos
        node.target = torch.sin if node.target is torch.cos else node.target
    x = torch.randn(5, requires_grad=True)
    for gm in (traced(), hooked, edited):
        want = gm(x)
        (want_grad,) = torch.autograd.grad(want.sum(), x)
        got = aot_function(gm, fw_compiler=nop)(x)
        (got_grad,) = torch.autograd.grad(got.sum(), x)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(got_grad, want_grad)
    assert cache.stats()["hits"] == 0, cache.events()


class SinAsCos(TorchDispatchMode):
    """A mode that rewrites an op: a trace under it bakes the rewrite into the graph."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        func = torch.ops.aten.cos.default if func is torch.ops.aten.sin.default else func
        return func(*args, **(kwargs or {}))


def test_a_compile_under_a_users_mode_is_not_keyed_before_the_trace():
    """Neither the op log (which sees a dispatch mode's ops before it rewrites them) nor a
    graph's code says what a mode does: a compile under one was keyed as one without, and
    the next compile without it was served the rewritten graph. (aot_module_simplified
    compiles where it is called, as Dynamo's backends do: under the caller's modes.)"""
    from aotgrad.compat import aot_module_simplified, nop

    def compiled(x):
        gm = torch.fx.symbolic_trace(lambda t: torch.sin(t) * 2)
        return aot_module_simplified(gm, [x], fw_compiler=nop)
    x = torch.randn(5, requires_grad=True)
    with SinAsCos():
        compiled(x)
    assert "not keyed before the trace: SinAsCos around the compile" in last_event()[1]
    torch.testing.assert_close(compiled(x)(x), torch.sin(x) * 2)
    assert last_event()[0] == "miss", last_event()
    torch.testing.assert_close(compiled(x)(x), torch.sin(x) * 2)
    assert last_event()[0] == "hit" and last_event()[1].startswith("before the trace")


def test_a_call_under_a_users_mode_compiles_nothing():
    """The mode sees the original code's ops, as in eager (api._under_a_mode): no entry
    is compiled or looked up for it."""
    compiled = aotgrad.compile(lambda t: torch.sin(t) * 2, backend="eager")
    x = torch.randn(5, requires_grad=True)
    before = len(cache.events())
    with SinAsCos():
        torch.testing.assert_close(compiled(x), torch.cos(x) * 2)
    assert len(cache.events()) == before and not compiled.entries


def test_the_default_device_is_in_the_key_before_the_trace():
    from aotgrad.cache import program
    state = program.global_state()
    with torch.device("meta"):
        assert program.global_state() != state
    assert cache_key.user_modes() is None  # its mode is that state, not a user's mode


def test_graph_calling_a_user_function_is_keyed_after_the_trace_only():
    def helper(x):
        return x.cos()

    gm = torch.fx.GraphModule(torch.nn.Module(), torch.fx.Graph())
    x = gm.graph.placeholder("x")
    gm.graph.output(gm.graph.call_function(helper, (x,)))
    gm.recompile()
    from aotgrad.compat import aot_function, nop
    aot_function(gm, fw_compiler=nop)(torch.randn(3, requires_grad=True)).sum().backward()
    event, why = last_event()
    assert event == "miss" and "not keyed before the trace: a call of " in why
    assert "whose name does not determine its code" in why


def test_stored_graphs_keep_the_aten_op_inductor_names_kernels_after():
    """A hit whose Inductor artifact is gone (another Inductor cache directory, an evicted
    entry) compiles the stored graphs again: without each node's `original_aten`, its
    kernels were anonymous (`triton_per_fused_18` for `..._native_layer_norm_backward_14`)."""
    import json
    import torch.fx.traceback as fx_traceback
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from aotgrad.cache import entry
    from aotgrad.backends.compilers import INDUCTOR_DECOMPOSITIONS
    with fx_traceback.preserve_node_meta():
        gm = make_fx(lambda x: torch.nn.functional.gelu(x).sum(),
                     decomposition_table=dict(INDUCTOR_DECOMPOSITIONS))(torch.randn(3))
    ops = lambda g: [(n.target.name(), n.meta["original_aten"].name())
                     for n in g.graph.nodes if n.op == "call_function"]
    assert ("aten::mul.Tensor", "aten::gelu") in ops(gm)
    decoded = entry.decode(json.loads(json.dumps(entry.encode(gm))), FakeTensorMode())
    assert ops(decoded) == ops(gm)


def test_a_float_dynamo_made_dynamic_is_not_served_from_the_cache():
    """After a float changes, Dynamo passes it as a 0-d tensor the graph reads with .item().
    A float the graph returns (`s * 2`) cannot become tensor ops: torch's pass specializes it
    (a constant in the graph, a guard in Dynamo's ShapeEnv). A hit skipped both: every later
    value got the first one's result (3.0 for s=2.5, where eager returns 5.0)."""
    def f(x, s):
        return x * s, s * 2
    for _ in range(2):  # the second round finds the first round's entries
        torch._dynamo.reset()
        compiled = torch.compile(f, backend=aotgrad.backend(backend="eager"))
        for s in (0.5, 1.5, 2.5):
            x = torch.randn(3, requires_grad=True)
            out, doubled = compiled(x, s)
            torch.testing.assert_close(out, x * s)
            assert doubled == s * 2


def test_a_miss_is_explained_against_its_own_program_first():
    """The nearest entry: same kind and program before any number of shared components
    (an entry of another program may share more of them)."""
    mine = {"kind": "graph", "program": "p1", "inputs": "f32[3]", "a": "1", "b": "1"}
    other_program = {"kind": "graph", "program": "p2", "inputs": "f32[3]", "a": "1", "b": "1"}
    own_program = {"kind": "graph", "program": "p1", "inputs": "f32[5]", "a": "2", "b": "2"}
    other_kind = {"kind": "autograd", "program": "p1", "inputs": "f32[3]", "a": "1", "b": "1"}
    assert cache_key.nearest(mine, [other_kind, other_program, own_program]) is own_program
    assert cache_key.nearest(mine, [other_kind, other_program]) is other_program
    assert cache_key.nearest(mine, [other_kind]) is other_kind
    assert cache_key.explain_miss(mine, [other_kind]) == "no entry of this kind yet"
    assert "inputs f32[5] -> f32[3]" in cache_key.explain_miss(mine, [other_program,
                                                                      own_program])
