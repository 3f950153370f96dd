"""A training run's lifecycle with a compiled model, against eager: what users do to the model
between steps (prune it, copy it, save it, change its dtype...) and what they read of it after."""

import copy

import pytest
import torch
from torch.nn.utils import prune

import aotgrad

HOOKED_WEIGHTS = {
    "prune": lambda m: prune.l1_unstructured(m, "weight", 0.5),
    "weight_norm": lambda m: torch.nn.utils.weight_norm(m),
    "spectral_norm": lambda m: torch.nn.utils.spectral_norm(m),
}


@pytest.mark.parametrize("cache", ["0", "1"])
@pytest.mark.parametrize("kind", HOOKED_WEIGHTS)
def test_the_weight_torchs_hooks_set_holds_each_calls_value(kind, cache, monkeypatch,
                                                          tmp_path):
    """prune, weight_norm and spectral_norm set `module.weight` in a forward pre-hook. After
    a compiled call it held the trace's FunctionalTensor: reading it (a pruning script
    counting zeros) raised 'Attempting to use FunctionalTensor on its own'."""
    monkeypatch.setenv("AOTGRAD_CACHE", cache)
    monkeypatch.setenv("AOTGRAD_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2))
    mine = copy.deepcopy(eager)
    compiled = aotgrad.compile(mine, backend="eager")
    for step in range(3):
        if step == 1:  # after the first compile
            for model in (eager, mine):
                torch.manual_seed(1)  # spectral_norm's random start
                HOOKED_WEIGHTS[kind](model[0])
        x = torch.randn(3, 4)
        eager(x).pow(2).sum().backward()
        compiled(x).pow(2).sum().backward()
        for a, b in ((eager[0].weight, mine[0].weight), *zip(eager.parameters(),
                                                            mine.parameters())):
            torch.testing.assert_close(b, a)
            assert b.requires_grad == a.requires_grad
        for a, b in zip(eager.parameters(), mine.parameters()):
            torch.testing.assert_close(b.grad, a.grad)
        for a, b in zip(eager.buffers(), mine.buffers()):  # spectral_norm's u, v
            torch.testing.assert_close(b, a)


def _train(model, compiled, xs, ema=None, ema_model=None):
    """SGD steps; with `ema`, its parameters follow the model's (an EMA model's update)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    outs = []
    for x in xs:
        out = compiled(x)
        out.pow(2).sum().backward()
        opt.step()
        opt.zero_grad()
        outs.append(out.detach())
        if ema is not None:
            with torch.no_grad():
                for e, p in zip(ema_model.parameters(), model.parameters()):
                    e.lerp_(p, 0.5)
            outs.append(ema(x).detach())
    return outs


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6),
                               torch.nn.Linear(6, 2))


def test_an_ema_model_deep_copied_from_the_compiled_one_after_steps_trains_as_eager():
    """`ema = copy.deepcopy(model)` after some steps (timm's ModelEmaV2): it raised
    "cannot pickle '_thread.lock' object" (the compiled entries)."""
    xs = [torch.randn(5, 4) for _ in range(4)]
    eager, mine = _net(), _net()
    compiled = aotgrad.compile(mine, backend="eager")
    _train(eager, eager, xs[:2])
    _train(mine, compiled, xs[:2])
    eager_ema, ema = copy.deepcopy(eager), copy.deepcopy(compiled)
    assert ema.orig_module[0].weight is not mine[0].weight
    expected = _train(eager, eager, xs[2:], eager_ema, eager_ema)
    got = _train(mine, compiled, xs[2:], ema, ema.orig_module)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(list(ema.state_dict().values()),
                               list(eager_ema.state_dict().values()))


@pytest.mark.parametrize("door", ["native", "native_budget", "native_settings", "dynamo",
                                  "dynamo_options", "dynamo_settings"])
def test_a_compiled_model_saved_whole_after_its_first_call_loads_and_trains_as_eager(
        door, tmp_path):
    """torch.save(compiled) raised: the native door's entries hold locks and generated
    code (and its options Inductor's decompositions, a budget's partitioner made in a
    closure); through Dynamo, torch.compile pickles its backend, a function made inside
    `make_backend`. torch.compile's own backends pickle."""
    torch._dynamo.reset()
    make = {"native": lambda m: aotgrad.compile(m, backend="eager"),
            "native_budget": lambda m: aotgrad.compile(m, memory_budget=0.5, backend="eager"),
            "dynamo": lambda m: torch.compile(m, backend="aotgrad"),
            "dynamo_options": lambda m: torch.compile(m, backend=aotgrad.backend(
                backend="eager", memory_budget=0.5)),
            # Inductor settings: the compilers that carry them pickle as they are
            "native_settings": lambda m: aotgrad.compile(m, options={"max_fusion_size": 7}),
            "dynamo_settings": lambda m: torch.compile(m, backend=aotgrad.backend(
                options={"max_fusion_size": 7}))}[door]
    xs = [torch.randn(5, 4) for _ in range(4)]
    eager, mine = _net(), _net()
    compiled = make(mine)
    expected = _train(eager, eager, xs)
    got = _train(mine, compiled, xs[:2])
    torch.save(compiled, tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    inner = loaded._orig_mod if door.startswith("dynamo") else loaded.orig_module
    got += _train(inner, loaded, xs[2:])
    torch.testing.assert_close(got, expected)


@pytest.mark.xfail(strict=True, reason="a parameter's .data replaced between a compiled "
                   "forward and its backward: eager's gradient reads the old values where its "
                   "op saved a view of the parameter (linear's addmm saves weight.t()) and the "
                   "new ones where it saved the parameter itself (conv); the compiled backward "
                   "reads the saved parameter, so it sees the new values for linear, silently. "
                   "Catching it would cost every call a check of its saved parameters")
def test_a_parameters_data_replaced_between_forward_and_backward_reads_as_eager():
    x = torch.randn(4, 3)
    grads = []
    for compile in (False, True):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(),
                                    torch.nn.Linear(4, 2))
        step = aotgrad.compile(model, backend="eager") if compile else model
        out = step(x)
        model[2].weight.data = torch.ones(2, 4)
        out.sum().backward()
        grads.append(model[0].weight.grad)
    torch.testing.assert_close(grads[1], grads[0])
