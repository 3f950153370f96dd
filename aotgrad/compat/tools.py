"""functorch's compile module: its compilers and debugging tools, for `aotgrad.compat`.

Compilers take `(fx_g, example_inputs)` as every aotgrad compiler does (backends/compilers.py).
The TorchScript ones (`ts_compile`, `nnc_jit`, `memory_efficient_fusion`) work where the
installed torch still has `torch.jit.script`; elsewhere they raise, naming what is missing.
"""

from __future__ import annotations

import functools
import os
import tempfile
from typing import Any, Callable, Sequence

import torch
from torch import fx
from torch.fx.experimental.proxy_tensor import decompose as pythonkey_decompose
from torch._subclasses.fake_tensor import is_fake

from ..backends.compilers import make_boxed_compiler

__all__ = ["print_compile", "debug_compile", "draw_graph", "draw_graph_compile", "ts_compile",
           "pythonkey_decompose", "minifier"]


def __getattr__(name: str):
    """torch's `minifier`, imported at first use: its module imports sympy (~0.5 s)."""
    if name == "minifier":
        from torch._functorch.fx_minifier import minifier
        return minifier
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@make_boxed_compiler
def print_compile(fx_g: fx.GraphModule, _: Any) -> fx.GraphModule:
    """Print the graph's code, then run the graph as it is."""
    print(fx_g.code)
    return fx_g


# ---- TorchScript ---------------------------------------------------------------------------

def _require_torchscript(name: str) -> None:
    if not hasattr(torch.jit, "script") or not hasattr(torch.jit, "freeze"):
        raise RuntimeError(f"aotgrad: {name} compiles with TorchScript, which this torch "
                           f"({torch.__version__}) lacks; use fw_compiler=nop or "
                           "aotgrad.compile(..., backend='inductor').")


def _scriptable(fx_g: fx.GraphModule) -> fx.GraphModule:
    """TorchScript resolves an op by its packet, and takes a device's type, not a device."""
    for node in fx_g.graph.nodes:
        if isinstance(node.target, torch._ops.OpOverload):
            node.target = node.target.overloadpacket
        node.kwargs = {k: v.type if isinstance(v, torch.device) else v
                       for k, v in node.kwargs.items()}
    fx_g.graph.lint()
    fx_g.recompile()
    return fx_g


def _frozen_script(fx_g: fx.GraphModule) -> torch.jit.ScriptModule:
    scripted = torch.jit.script(_scriptable(fx_g))
    return torch.jit.freeze(scripted.eval())


@make_boxed_compiler
def ts_compile(fx_g: fx.GraphModule, inps: Sequence[Any]) -> torch.jit.ScriptModule:
    """The graph as a frozen TorchScript module, optimized for inference."""
    _require_torchscript("ts_compile")
    previous = torch._C._jit_set_autocast_mode(False)  # the graph holds autocast's casts
    try:
        scripted = torch.jit.script(_scriptable(fx_g))
        torch._C._jit_pass_remove_mutation(scripted.graph)
        compiled = torch.jit.optimize_for_inference(torch.jit.freeze(scripted.eval()))
        if not any(is_fake(t) for t in inps if isinstance(t, torch.Tensor)):
            compiled(*inps)  # TorchScript specializes on its first run: not on a user's call
    finally:
        torch._C._jit_set_autocast_mode(previous)
    return compiled


@make_boxed_compiler
def simple_ts_compile(fx_g: fx.GraphModule, _: Any) -> torch.jit.ScriptModule:
    _require_torchscript("nnc_jit")
    return _frozen_script(fx_g)


# ---- drawing and debugging -----------------------------------------------------------------

def draw_graph(traced: fx.GraphModule, fname: str, figname: str = "fx_graph",
               clear_meta: bool = True, prog: str | list[str] | None = None,
               parse_stack_trace: bool = False, dot_graph_shape: str | None = None) -> None:
    """Write the graph as a picture: `fname`'s extension picks the format (default
    `config.torch_compile_graph_format`). Needs pydot and Graphviz."""
    from .config import config
    drawer_cls = _graph_drawer()
    base, ext = os.path.splitext(fname)
    ext = ext or "." + config.torch_compile_graph_format
    print(f"Writing FX graph to file: {base}{ext}")
    if clear_meta:  # the drawer prints every meta entry: keep the picture readable
        traced = fx.GraphModule(traced, _without_meta(traced.graph))
    drawer = drawer_cls(traced, figname, parse_stack_trace=parse_stack_trace,
                        dot_graph_shape=dot_graph_shape)
    write = getattr(drawer.get_main_dot_graph(), "write_" + ext.lstrip("."))
    write(f"{base}{ext}") if prog is None else write(f"{base}{ext}", prog=prog)


def _graph_drawer():
    try:
        import pydot  # noqa: F401
    except ImportError:
        raise RuntimeError("aotgrad: draw_graph needs the pydot package and Graphviz "
                           "(pip install pydot; apt-get install graphviz).") from None
    from torch.fx.passes.graph_drawer import FxGraphDrawer
    return FxGraphDrawer


def _without_meta(graph: fx.Graph) -> fx.Graph:
    copy = fx.Graph()
    copy.output(copy.graph_copy(graph, {}))
    for node in copy.nodes:
        node.meta = {}
    return copy


def _draw_graph_compile(fx_g: fx.GraphModule, _: Any, name: str) -> fx.GraphModule:
    print(fx_g.code)
    draw_graph(fx_g, name)
    return fx_g


def draw_graph_compile(name: str) -> Callable[[fx.GraphModule, list[Any]], fx.GraphModule]:
    """A compiler that prints and draws each graph to `name`, then runs it as it is."""
    return make_boxed_compiler(functools.partial(_draw_graph_compile, name=name))


def debug_compile(fx_g: fx.GraphModule, inps: Sequence[torch.Tensor]) -> torch.jit.ScriptModule:
    """Save the graph as a Python folder, print a script that minifies a failure of it, check
    that the saved graph runs on `inps`, then compile it with `ts_compile`."""
    folder = tempfile.mkdtemp(prefix="aotgrad_debug_")
    fx_g.to_folder(folder, "FxModule")
    print(_repro_script(folder, inps))
    fx_g(*inps)  # the graph as saved must run before it is blamed on the compiler
    return ts_compile(fx_g, inps)


def _repro_script(folder: str, inps: Sequence[torch.Tensor]) -> str:
    metas = [(tuple(t.shape), t.dtype, str(t.device)) for t in inps]
    return (f"import sys, torch, torch.fx as fx\n"
            f"from aotgrad.compat import minifier, ts_compile\n"
            f"sys.path.insert(0, {os.path.dirname(folder)!r})\n"
            f"from {os.path.basename(folder)} import FxModule\n"
            f"inps = [torch.ones(s, dtype=d, device=v) for s, d, v in {metas!r}]\n"
            f"def fails(gm, inps):\n"
            f"    try:\n        ts_compile(gm, inps)\n        return False\n"
            f"    except Exception:\n        return True\n"
            f"minifier(fx.symbolic_trace(FxModule()), inps, fails)\n")
