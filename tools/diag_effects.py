"""Why a print vanishes on this torch (a diagnostic for the GPU machine's torch 2.11)."""
import inspect
import re

import torch
import torch._subclasses.functional_tensor as ft
from torch._higher_order_ops import effects

import aotgrad
from aotgrad import tables

print("torch", torch.__version__)
print("has_effect(_print):", tables.has_effect(torch.ops.aten._print.default))
print("has_effects signature:", inspect.signature(effects.has_effects))
src = inspect.getsource(ft.FunctionalTensorMode.__torch_dispatch__)
lines = src.splitlines()
for i, line in enumerate(lines):
    if re.search(r"effect|token", line):
        print("FTM:", i, line)
hit = next((i for i, l in enumerate(lines) if "has_effects(" in l), 0)
print("\n".join(f"{i:4} {l}" for i, l in enumerate(lines) if hit - 75 <= i <= hit + 3))
print("FTM.__init__:", [l.strip() for l in inspect.getsource(ft.FunctionalTensorMode.__init__)
                        .splitlines() if "token" in l])


def f(x):
    torch.ops.aten._print("hello")
    return x * 2


graphs = []
from aotgrad.semantics import effects as effects_module  # noqa: E402
for cls in [v for v in vars(effects_module).values()
            if isinstance(v, type) and issubclass(v, ft.FunctionalTensorMode)]:
    seen = cls.__torch_dispatch__

    def spy(self, func, types, args=(), kwargs=None, _seen=seen, _name=cls.__name__):
        if "print" in str(func):
            print(f"  {_name} sees {func}", flush=True)
        return _seen(self, func, types, args, kwargs)
    cls.__torch_dispatch__ = spy


def keep(gm, example_inputs):
    graphs.append(gm)
    return gm.forward


x = torch.randn(2, requires_grad=True)
try:
    fn = aotgrad.compile(f, backend=keep)
    print("call 1:")
    fn(x)
    print("call 2:")
    fn(x)
except Exception as e:  # noqa: BLE001
    print("raised", type(e).__name__, e)
for gm in graphs:
    print(gm.code)
