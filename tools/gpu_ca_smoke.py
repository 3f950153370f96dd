"""A quick check of aotgrad's compiled autograd on the GPU machine (torch 2.11 there): each
case runs the same training code eagerly and inside `aotgrad.compiled_autograd.enable`, on
identical copies, and prints one line, PASS or FAIL, with what differed. Under a minute.

    python tools/gpu_ca_smoke.py          # CUDA
    python tools/gpu_ca_smoke.py --cpu    # a check of the script itself

Exit status: the number of failed cases. A case that falls back to the eager engine fails
too (its line says why): on a new torch, that is how a change in the engine's protocol
shows (`MissingMethod` names the method).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
import traceback
from typing import Callable

import torch

sys.path.insert(0, __file__.rsplit("/tools/", 1)[0])  # run from anywhere in the repo
import aotgrad  # noqa: E402
from aotgrad import compiled_autograd  # noqa: E402

DEVICE = "cuda"


def mlp(width: int = 32) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh(),
                               torch.nn.Linear(width, width), torch.nn.ReLU(),
                               torch.nn.Linear(width, 4)).to(DEVICE)


def batch(k: int, rows: int = 16, width: int = 32, grad: bool = False) -> torch.Tensor:
    x = torch.randn(rows, width, generator=torch.Generator().manual_seed(k))
    return x.to(DEVICE).requires_grad_(grad)


# -- the cases: step(model) -> the values to compare (the parameters' .grad are compared too)
def plain_steps(m: torch.nn.Module) -> list:
    """Three steps, .grad accumulating; a new batch size in the third."""
    for k, rows in enumerate((16, 16, 24)):
        m(batch(k, rows)).pow(2).sum().backward()
    return []


def hooks(m: torch.nn.Module) -> list:
    calls: list = []
    h = m[0](batch(0))
    h.register_hook(lambda g: calls.append(("tensor hook", tuple(g.shape))) or g * 2)
    m[0].weight.register_post_accumulate_grad_hook(
        lambda p: calls.append(("post-accumulate", float(p.grad.norm()))))
    for layer in m[1:]:
        h = layer(h)
    h.sum().backward()
    return [len(calls), calls[0][0], calls[1][0], torch.tensor(calls[1][1])]


def grad_inputs(m: torch.nn.Module) -> list:
    """autograd.grad(inputs=...) leaves .grad alone; retain_graph, then a backward."""
    x = batch(1, grad=True)
    y = m(x).sum()
    got = torch.autograd.grad(y, [x, m[2].weight], retain_graph=True)
    y.backward(inputs=[m[0].bias])
    return list(got)


def penalty(front_door: str) -> Callable[[torch.nn.Module], list]:
    def step(m: torch.nn.Module) -> list:
        f = aotgrad.compile(m, backend="eager") if front_door == "aotgrad" else m
        out = []
        for k in range(2):
            x = batch(k, grad=True)
            y = f(x).sum()
            gx, = torch.autograd.grad(y, [x], create_graph=True)
            (y + gx.pow(2).sum()).backward()
            out.append(gx.detach())
        return out
    return step


def region(m: torch.nn.Module) -> list:
    """An aotgrad-compiled (Inductor) forward: its backward inlined into the capture."""
    f = aotgrad.compile(m)
    for k in range(2):
        f(batch(k)).pow(2).sum().backward()
    return []


CASES = [  # (name, step, compiler)
    ("mlp, .grad accumulation, new batch size (eager)", plain_steps, "eager"),
    ("mlp, .grad accumulation, new batch size (inductor)", plain_steps, "inductor"),
    ("tensor hook + post-accumulate-grad hook (eager)", hooks, "eager"),
    ("autograd.grad inputs=, retain_graph, backward inputs= (eager)", grad_inputs, "eager"),
    ("gradient penalty, create_graph, eager forward (inductor)", penalty("eager"), "inductor"),
    ("gradient penalty, create_graph, aotgrad forward (inductor)", penalty("aotgrad"),
     "inductor"),
    ("aotgrad region's backward inlined (inductor)", region, "inductor"),
]


# -- running and comparing ---------------------------------------------------------------------
def differences(expected, actual, path: str) -> list[str]:
    if isinstance(expected, (list, tuple)):
        if len(expected) != len(actual):
            return [f"{path}: {len(expected)} values, compiled {len(actual)}"]
        return [d for i, (e, a) in enumerate(zip(expected, actual))
                for d in differences(e, a, f"{path}[{i}]")]
    if expected is None or actual is None:
        return [] if expected is actual else [f"{path}: eager {expected}, compiled {actual}"]
    if isinstance(expected, torch.Tensor):
        if expected.shape != actual.shape:
            return [f"{path}: shape {tuple(expected.shape)} vs {tuple(actual.shape)}"]
        if not torch.allclose(expected, actual, rtol=1e-4, atol=1e-5):
            return [f"{path}: max difference {(expected - actual).abs().max().item():.3g}"]
        return []
    return [] if expected == actual else [f"{path}: eager {expected!r}, compiled {actual!r}"]


def run_case(step: Callable, compiler: str) -> str:
    model = mlp()
    other = copy.deepcopy(model)
    expected = step(model)
    with compiled_autograd.enable(compiler) as stats:
        actual = step(other)
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    found = differences(expected, actual, "values")
    found += differences([p.grad for p in model.parameters()],
                         [p.grad for p in other.parameters()], "grads")
    found += [f"fell back: {r}" for r in stats.fallbacks]
    if stats.captures == 0:
        found.append("nothing captured")
    return "; ".join(found[:3])


def main() -> int:
    global DEVICE
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="run on CPU")
    DEVICE = "cpu" if parser.parse_args().cpu else "cuda"
    print(f"torch {torch.__version__}, device {DEVICE}"
          + (f" ({torch.cuda.get_device_name()})" if DEVICE == "cuda" else ""))
    failed, start = 0, time.perf_counter()
    for name, step, compiler in CASES:
        began = time.perf_counter()
        try:
            problem = run_case(step, compiler)
        except Exception as error:  # noqa: BLE001 - one line per case, whatever happens
            problem = f"{type(error).__name__}: {error}".splitlines()[0]
            traceback.print_exc(limit=-3)
        failed += bool(problem)
        print(f"{'FAIL' if problem else 'PASS'} {name} [{time.perf_counter() - began:.1f}s]"
              + (f": {problem}" if problem else ""), flush=True)
    print(f"{len(CASES) - failed}/{len(CASES)} passed in {time.perf_counter() - start:.1f}s")
    return failed


if __name__ == "__main__":
    sys.exit(main())
