"""`aotgrad.compat.config`: the flags of torch's functorch compile config, by name.

Every flag of the installed torch reads as torch's default. A flag aotgrad honours
(`ACCEPTED`) may be set to any value it lists; any other flag may be set to its default
only: a value aotgrad would silently ignore is refused, with the flag's name.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import pickle
from typing import Any, Callable

import torch._functorch.config as torch_config

from ..partition.budget import budget_partition
from ..partition.remat import min_cut_rematerialization_partition


def _any_budget(value) -> bool:
    return isinstance(value, (int, float)) and 0 <= value <= 1


# flag -> which values aotgrad honours, and why.
ACCEPTED: dict[str, Callable[[Any], bool]] = {
    # The min-cut partitioner's memory budget (budget.py), as torch's partitioner reads it.
    "activation_memory_budget": _any_budget,
    # aotgrad's graphs are always checked (verify.py): asking for the checks changes nothing.
    "debug_assert": lambda v: isinstance(v, bool),
    # Random ops replay the forward's numbers in the backward whatever this says
    # (random_values.py); export refuses it as torch does.
    "functionalize_rng_ops": lambda v: isinstance(v, bool),
    # The file format draw_graph writes when its file name has no extension.
    "torch_compile_graph_format": lambda v: isinstance(v, str),
}


def _torch_defaults() -> dict[str, Any]:
    entries = getattr(torch_config, "_config", None)
    if entries is None:  # a torch whose config module keeps no entries
        return dict(torch_config.get_config_copy())
    return {name: entry.default for name, entry in entries.items()}


class Config:
    """Flags read and set by attribute, and `patch(...)` as a context manager or decorator:

    >>> from aotgrad.compat import config
    >>> with config.patch(activation_memory_budget=0.5):
    ...     pass
    """

    def __init__(self) -> None:
        object.__setattr__(self, "_defaults", _torch_defaults())
        object.__setattr__(self, "_values", dict(self._defaults))

    def __getattr__(self, name: str) -> Any:
        values = object.__getattribute__(self, "_values")
        if name not in values:
            raise AttributeError(f"aotgrad.compat.config has no flag {name!r}")
        return values[name]

    def __setattr__(self, name: str, value: Any) -> None:
        self._check(name, value)
        self._values[name] = value

    def __dir__(self):
        return sorted(self._values)

    def _check(self, name: str, value: Any) -> None:
        if name not in self._values:
            raise AttributeError(f"aotgrad.compat.config has no flag {name!r}")
        if name in ACCEPTED and ACCEPTED[name](value):
            return
        if value != self._defaults[name]:
            raise NotImplementedError(
                f"aotgrad: config.{name}={value!r} is not supported (only its default "
                f"{self._defaults[name]!r}); leave it unset, or use aotgrad.compile's options.")

    @contextlib.contextmanager
    def _patched(self, changes: dict[str, Any]):
        for name, value in changes.items():
            self._check(name, value)
        saved = {name: self._values[name] for name in changes}
        self._values.update(changes)
        try:
            yield
        finally:
            self._values.update(saved)

    def patch(self, changes: dict[str, Any] | str | None = None, value: Any = None, **kwargs):
        """`patch(flag=value, ...)`, `patch({"flag": value})` or `patch("flag", value)`."""
        if isinstance(changes, str):
            changes = {changes: value}
        return _Patch(self, {**(changes or {}), **kwargs})

    # torch's ConfigModule methods, for code that saves, restores or prints the config.
    def get_config_copy(self) -> dict[str, Any]:
        return dict(self._values)

    to_dict = shallow_copy_dict = get_config_copy

    def save_config(self) -> bytes:
        return pickle.dumps(self._values, protocol=2)

    def load_config(self, saved: bytes | dict[str, Any]) -> None:
        """What save_config (or get_config_copy) returned; each flag checked as if set."""
        values = pickle.loads(saved) if isinstance(saved, bytes) else dict(saved)
        for name, value in values.items():
            setattr(self, name, value)

    def get_hash(self) -> bytes:
        return hashlib.md5(repr(sorted(self._values.items())).encode()).digest()

    def codegen_config(self) -> str:
        """Python lines setting the flags that differ from their defaults."""
        return "\n".join(f"aotgrad.compat.config.{name} = {value!r}"
                         for name, value in self._values.items()
                         if value != self._defaults[name])

    def partitioner(self, partition_fn: Callable) -> Callable:
        """The partitioner a compile uses: the min-cut one under the memory budget set here
        (read when the compiled function is made)."""
        budget = self.activation_memory_budget
        if _is_min_cut(partition_fn) and budget < 1:
            return budget_partition(budget)
        return partition_fn


def _is_min_cut(partition_fn: Callable) -> bool:
    """The min-cut partitioner, or a partial of it (torch's Inductor passes
    `partial(min_cut_rematerialization_partition, compiler="inductor")`)."""
    while isinstance(partition_fn, functools.partial):
        partition_fn = partition_fn.func
    return partition_fn is min_cut_rematerialization_partition


class _Patch(contextlib.ContextDecorator):
    """Both a context manager and a decorator, re-entered on each decorated call."""

    def __init__(self, config: Config, changes: dict[str, Any]):
        self._config, self._changes, self._stack = config, changes, []

    def __enter__(self):
        patched = self._config._patched(self._changes)
        patched.__enter__()
        self._stack.append(patched)
        return self

    def __exit__(self, *exc):
        return self._stack.pop().__exit__(*exc)


config = Config()
