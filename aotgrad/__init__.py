"""aotgrad: ahead-of-time autograd for PyTorch.

Captures a function or module into one functional forward+backward graph of ATen ops,
partitions it, compiles both halves, and runs them so that the call behaves like eager.
"""

import importlib.abc
import importlib.util
import sys

from . import log as _log
from .api import CompiledFunction, CompiledModule, compile
from .backends.compilers import make_boxed_compiler, make_boxed_func, nop
from .schema import Backend
from .explanation import Explanation, explain
from .partition.remat import min_cut_rematerialization_partition
from .partition.split import default_partition
from .artifact import Artifact
from .verify import verify
from . import autograd as compiled_autograd  # lazy: loads its capture at first use

# `import aotgrad.compiled_autograd` works too: the package lives in aotgrad/autograd/.
sys.modules[__name__ + ".compiled_autograd"] = compiled_autograd

__all__ = ["compile", "backend", "explain", "Explanation", "CompiledFunction", "CompiledModule",
           "Artifact", "Backend", "default_partition", "min_cut_rematerialization_partition",
           "make_boxed_compiler", "make_boxed_func", "nop", "verify", "compiled_autograd"]


def backend(**options):
    """A Dynamo backend with these options: `torch.compile(m, backend=aotgrad.backend(...))`.
    They are `aotgrad.compile`'s: backend, partitioner, memory_budget, decompositions,
    keep_inference_input_mutations, compile_backward, cudagraphs, mode, options (torch.compile's
    own `mode` and `options` are applied over these two)."""
    from .dynamo import make_backend
    unknown = sorted(set(options) - set(make_backend.__kwdefaults__))
    if unknown:
        raise TypeError(f"aotgrad: backend() takes no option {', '.join(unknown)}; it takes "
                        f"{', '.join(sorted(make_backend.__kwdefaults__))}")
    return make_backend(**options)


_DYNAMO_REGISTRY = "torch._dynamo.backends.registry"


def _register_with_dynamo() -> None:
    """`backend="aotgrad"` works even when the package is not installed (entry point absent).
    Importing Dynamo here would make `import aotgrad` about a second slower: unless it is
    imported already, the registration waits for Dynamo's registry to be imported."""
    registry = sys.modules.get(_DYNAMO_REGISTRY)
    if registry is not None:
        _register_in(registry)
    elif not any(isinstance(f, _RegisterWhenImported) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterWhenImported())


def _register_in(registry) -> None:
    """Register, unless Dynamo found the installed entry point: then its lookup is loading
    this package, and registers the name itself right after (twice would be an error)."""
    from .dynamo import aotgrad_backend
    if "aotgrad" not in registry._COMPILER_FNS and \
            getattr(registry, "_BACKENDS", {}).get("aotgrad") is None:
        registry.register_backend(name="aotgrad")(aotgrad_backend)


class _RegisterWhenImported(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when Dynamo's registry is imported, it has the module run as
    usual, then registers aotgrad in it, and leaves `sys.meta_path`."""

    def find_spec(self, name, path, target=None):
        if name != _DYNAMO_REGISTRY:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _register_in(module)
        spec.loader.exec_module = exec_module  # this spec's own loader object
        return spec


_register_with_dynamo()
_log.configure_from_env()
