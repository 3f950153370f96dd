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
