"""aotgrad: ahead-of-time autograd for PyTorch.

Captures a function or module into one functional forward+backward graph of ATen ops,
partitions it, compiles both halves, and runs them so that the call behaves like eager.
"""

from .api import CompiledFunction, CompiledModule, compile
from .backends.compilers import make_boxed_compiler, make_boxed_func, nop
from .schema import Backend
from .explanation import Explanation, explain
from .partition.remat import min_cut_rematerialization_partition
from .partition.split import default_partition
from .artifact import Artifact
from .verify import verify

__all__ = ["compile", "backend", "explain", "Explanation", "CompiledFunction", "CompiledModule",
           "Artifact", "Backend", "default_partition", "min_cut_rematerialization_partition",
           "make_boxed_compiler", "make_boxed_func", "nop", "verify"]


def backend(**options):
    """A Dynamo backend with these options: `torch.compile(m, backend=aotgrad.backend(...))`."""
    from .dynamo import make_backend
    return make_backend(**options)


def _register_with_dynamo() -> None:
    """`backend="aotgrad"` works even when the package is not installed (entry point absent)."""
    try:
        from torch._dynamo.backends.registry import _BACKENDS, register_backend
        from .dynamo import aotgrad_backend
    except ImportError:  # a torch without Dynamo
        return
    if "aotgrad" not in _BACKENDS:
        register_backend(name="aotgrad")(aotgrad_backend)


_register_with_dynamo()
