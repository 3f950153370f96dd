"""torch.compile's `mode` and `options` through backend="aotgrad": Inductor's settings,
applied wherever aotgrad runs one of Inductor's steps."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from .compilers import inductor_compiler
from .inductor_defaults import USER_SETTINGS
from ..schema import Backend


@dataclass(frozen=True)
class WithInductorSettings:
    """One of Inductor's steps (its compiler, its joint-graph passes) run with some of its
    settings changed: torch.compile's `mode` and `options`, as `backend="inductor"` takes
    them (`("max_autotune", True)`). Applied at each run, so at the lazy backward's compile
    too; aotgrad's cache keys name them."""

    step: Callable
    settings: tuple[tuple[str, Any], ...]
    # As the Inductor compiler's own marks say: it records CUDA graphs itself, and it leaves
    # the graph it is given as it was.
    records_cudagraphs = True
    keeps_graph = True

    def __call__(self, *args):
        from torch._inductor import config
        chosen = USER_SETTINGS.set(frozenset(name for name, _ in self.settings))
        try:
            with config.patch(dict(self.settings)):
                return self.step(*args)
        finally:
            USER_SETTINGS.reset(chosen)


# Settings that torch's Inductor reads before the graph compile aotgrad calls (pre-grad
# passes on Dynamo's graph, freezing, which ops to decompose): they could not take effect.
SETTINGS_OUTSIDE_THE_COMPILE = ("freezing", "selective_decompose", "use_joint_graph_passes",
                                "use_pre_grad_passes", "add_pre_grad_passes",
                                "remove_pre_grad_passes", "pre_grad_custom_pass",
                                "pre_grad_fusion_options")


def is_inductor(compiler: Callable) -> bool:
    return inductor_compiler in (compiler, getattr(compiler, "step", None))


def settings_of(step: Callable | None) -> tuple[tuple[str, Any], ...]:
    """The Inductor settings `step` (a compiler or graph passes) runs under."""
    return step.settings if isinstance(step, WithInductorSettings) else ()


def unwrapped(step: Callable | None) -> Callable | None:
    """`step` without the settings it runs under."""
    return step.step if isinstance(step, WithInductorSettings) else step


def with_inductor_settings(backend: Backend, settings: dict) -> Backend:
    """`backend` (Inductor's) compiling under `settings`, over those it already had (the
    new win where both name one: torch.compile's over `aotgrad.backend(options=...)`'s); an
    `aotgrad:` error for another backend, or for a setting Inductor reads outside the graph
    compile."""
    if not settings:
        return backend
    compilers = (backend.fw_compiler, backend.bw_compiler, backend.inference_compiler)
    if not all(is_inductor(c) for c in compilers):
        raise ValueError(
            f"aotgrad: torch.compile's mode or options ({', '.join(sorted(settings))}) are "
            "Inductor settings, and this aotgrad backend does not compile with Inductor; "
            "drop them, or use aotgrad.backend(backend='inductor')")
    outside = sorted(set(settings) & set(SETTINGS_OUTSIDE_THE_COMPILE))
    if outside:
        raise ValueError(
            f"aotgrad: Inductor's {', '.join(map(repr, outside))} acts before the graph "
            "compile aotgrad hands Inductor, so backend='aotgrad' cannot apply it; use "
            "backend='inductor' for it, or drop it")
    frozen = tuple(sorted({**dict(settings_of(backend.fw_compiler)), **settings}.items()))
    compiler = WithInductorSettings(inductor_compiler, frozen)
    passes = unwrapped(backend.graph_passes)
    passes = passes and WithInductorSettings(passes, frozen)
    return replace(backend, fw_compiler=compiler, bw_compiler=compiler,
                   inference_compiler=compiler, graph_passes=passes)


def compile_settings(mode: str | None, options: dict | None) -> dict[str, Any]:
    """torch.compile's `mode` and `options` as the Inductor settings they stand for, as
    `backend="inductor"` takes them; an `aotgrad:` error for an unknown mode or setting."""
    if mode in (None, "default") and not options:  # without importing Inductor (eager backend)
        return {}
    from torch._inductor import config, list_mode_options
    try:
        settings = {**list_mode_options(mode or "default"), **(options or {})}
    except RuntimeError as exc:  # torch's message lists its modes
        raise ValueError(f"aotgrad: mode={mode!r}: {exc}") from None
    unknown = sorted(set(settings) - set(config.get_config_copy()))
    if unknown:
        raise ValueError(
            f"aotgrad: options has {', '.join(map(repr, unknown))}, which is not an Inductor "
            "setting (aotgrad's own options are keyword arguments of aotgrad.compile and "
            "aotgrad.backend)")
    return settings
