"""A cache key: a named list of (component, value), so that a miss can be explained part by
part ("memory_budget 0.5 -> 0.6", "input 2 stride (64, 1) -> (1, 64)").

The program is the graph as traced, before any pass: what the function computes, in ATen
ops, with its nodes renamed by position (names are noise). Keying the trace rather than the
Python source is what makes the key safe: a function's source does not say what its globals,
closures and callees do; its trace does. Input metadata, every option that changes what the
later stages produce, and the versions of everything that produces it complete the key.
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch
from torch import fx

from ..schema import (AUTOGRAD_COPY, BACKWARD_WRITES, JOINT_FW_OUTPUTS, JOINT_ROLE, PHASE,
                      RANDOM_VALUE, Backend)
from . import codec

# Node meta the partition and the passes after the trace read, besides the graph itself.
_KEYED_META = (JOINT_ROLE, PHASE, AUTOGRAD_COPY, RANDOM_VALUE, "recompute", "ac_graph_id")


@dataclass(frozen=True)
class Key:
    components: tuple[tuple[str, str], ...]  # (name, readable value), in order

    @functools.cached_property
    def digest(self) -> str:
        text = json.dumps(self.components, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def as_dict(self) -> dict[str, str]:
        return dict(self.components)


def sha(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def program(gm: fx.GraphModule) -> str:
    """The traced graph, renamed by position: `sha256:<digest> (<n> nodes)`."""
    rows = codec.encode_graph(gm, _keyed_meta, names=lambda i, node: f"n{i}")
    graph_meta = [gm.meta.get(JOINT_FW_OUTPUTS), codec.fingerprint(gm.meta.get(BACKWARD_WRITES))]
    return f"sha256:{sha([rows, graph_meta])} ({len(rows)} nodes)"


def _keyed_meta(node: fx.Node) -> dict:
    return {k: codec.fingerprint(node.meta[k]) for k in _KEYED_META if k in node.meta}


def describe_input(t: Any) -> str:
    m = codec.encode_tensor_meta(t)
    dtype = str(t.dtype).removeprefix("torch.")
    grad = " requires_grad" if m["requires_grad"] else ""
    offset = f" offset {m['offset']}" if m["offset"] else ""
    return (f"{dtype}{list(m['shape'])} stride {tuple(m['stride'])}{offset} "
            f"{m['device']}{grad}")


def user_modes() -> str | None:
    """The torch function and dispatch modes the caller compiles under, if any: a trace runs
    the program's ops through them (a mode may rewrite an op), the analysis's op log sees
    a dispatch mode's ops before it, and a graph's code does not say what they do. The
    default device's mode (`torch.set_default_device`) is global state instead."""
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._device import DeviceContext
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
    modes = [m for m in _get_current_function_mode_stack() if not isinstance(m, DeviceContext)]
    modes += _get_current_dispatch_mode_stack()
    return ", ".join(type(m).__name__ for m in modes) or None


@functools.lru_cache(maxsize=None)
def aotgrad_version() -> str:
    """The package's source, hashed: any change to aotgrad may change what it produces."""
    return f"source sha256:{source_digest(Path(__file__).resolve().parent.parent)[:16]}"


def source_digest(package: Path) -> str:
    """The sha256 of a package's Python sources, their paths in it included (hex)."""
    h = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        h.update(str(path.relative_to(package)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def _triton_version() -> str:
    try:
        import importlib.metadata
        return importlib.metadata.version("triton")
    except Exception:
        return "none"


def versions(devices: Iterable[torch.device]) -> list[tuple[str, str]]:
    # Its build's commit too: two builds of one version (nightlies, source builds) differ.
    build = getattr(torch.version, "git_version", None) or "unknown"
    parts = [("torch", f"{torch.__version__} ({build[:12]})"), ("triton", _triton_version()),
             ("python", platform.python_version()), ("aotgrad", aotgrad_version()),
             ("machine", platform.machine())]
    for device in sorted({str(d) for d in devices}):
        parts.append((f"device {device}", _device_description(torch.device(device))))
    return parts


def _device_description(device: torch.device) -> str:
    if device.type == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(device)
        return f"{props.name} sm{props.major}{props.minor} cuda {torch.version.cuda}"
    return device.type


def backend_components(backend: Backend) -> list[tuple[str, str]]:
    """The compilers by name (they run again on a hit: only the passes before the partition
    are skipped, so those must be known ones, the named backends': any other name may hide
    a closure), and Inductor's configuration where it runs."""
    from ..backends.compilers import inductor_graph_passes
    from ..backends.passes import undo_transpose_pairs
    from ..backends.settings import is_inductor, settings_of, unwrapped
    compilers = (backend.fw_compiler, backend.bw_compiler, backend.inference_compiler)
    names = [_name(c) for c in compilers]
    parts = [("backend", " / ".join(dict.fromkeys(names)))]
    passes = unwrapped(backend.graph_passes)
    if passes not in (None, inductor_graph_passes, undo_transpose_pairs):  # the named
        raise codec.Unencodable(f"the backend's own graph passes ({_name(passes)})")
    parts.append(("graph passes", _name(passes)))
    if any(is_inductor(c) for c in compilers):
        parts.append(("inductor config", _inductor_config()))
        # torch.compile's mode and options, which the compilers apply at each compile
        settings = [settings_of(c) for c in (*compilers, backend.graph_passes)
                    if settings_of(c)]
        for name, value in (item for each in settings for item in each):
            if not _plain(value):  # a custom pass's repr names an address, not its code
                raise codec.Unencodable(f"Inductor's {name} set to {type(value).__name__}")
        if settings:
            parts.append(("inductor settings", " / ".join(sorted(set(map(repr, settings))))))
    return parts


def _plain(value: Any) -> bool:
    """Data whose repr is the same in every process."""
    if isinstance(value, (list, tuple)):
        return all(map(_plain, value))
    if isinstance(value, dict):
        return all(_plain(k) and _plain(v) for k, v in value.items())
    return value is None or isinstance(value, (bool, int, float, str))


def _name(f) -> str:
    """A function by module and qualified name; an object by its type's (never an address)."""
    if f is None:
        return "None"
    named = f if hasattr(f, "__qualname__") else type(f)
    return f"{getattr(named, '__module__', '')}.{named.__qualname__}"


def _inductor_config() -> str:
    """Its hash, and the options set away from their defaults by name: a miss then says
    which ("inductor config sha256:.. (max_autotune=True)"). A hit may load Inductor's code
    by the key it was stored under, without Inductor checking its config again."""
    from torch._inductor import config
    try:
        saved = config.save_config_portable()
    except Exception:  # older torch: the whole config
        saved = config.get_config_copy()
    changed = [f"{k}={saved[k]!r}" for k in sorted(saved) if _set_away(config, k, saved[k])]
    digest = f"sha256:{sha({k: repr(v) for k, v in sorted(saved.items())})}"
    return f"{digest} ({', '.join(changed)})" if changed else digest


def _set_away(config, name: str, value: Any) -> bool:
    """Whether an option holds another value than its default. Not `_is_default` alone: an
    option set to its default value (Inductor's first compile in a process sets some) is not
    default by that test, and a key naming it missed the same config keyed in a fresh process."""
    is_default = getattr(config, "_is_default", None)
    if is_default is None or is_default(name):
        return False
    default = getattr(getattr(config, "_config", {}).get(name), "default", object())
    return value != default


def diff(mine: dict[str, str], theirs: dict[str, str]) -> list[str]:
    """What differs, as "name theirs -> mine", in this key's order."""
    out = []
    for name in [*theirs, *[n for n in mine if n not in theirs]]:
        a, b = theirs.get(name, "(absent)"), mine.get(name, "(absent)")
        if a != b:
            out.append(f"{name} {a} -> {b}")
    return out


def nearest(mine: dict[str, str], others: Sequence[dict[str, str]]) -> dict[str, str] | None:
    """The entry whose key shares the most components with `mine`, among those of its kind
    and program if any, else of its kind, else all. Components are counted within that group
    only (a 2298-entry cache: 2-8 ms a miss, was 15-18)."""
    kind, program = mine.get("kind"), mine.get("program")
    same_kind = [theirs for theirs in others if theirs.get("kind") == kind]
    same_program = [theirs for theirs in same_kind if theirs.get("program") == program]
    group = same_program or same_kind or others
    return max(group, key=lambda theirs: sum(theirs.get(k) == v for k, v in mine.items()),
               default=None)


def explain_miss(mine: dict[str, str], others: Sequence[dict[str, str]],
                 shown: int = 6) -> str:
    theirs = nearest(mine, others)
    if theirs is None or theirs.get("kind") != mine.get("kind"):
        return "no entry in the cache yet" if theirs is None else "no entry of this kind yet"
    parts = [_shortened(p) for p in diff(mine, theirs)]
    more = f", and {len(parts) - shown} more" if len(parts) > shown else ""
    return ", ".join(parts[:shown]) + more or "the entry with this key is unreadable"


def _shortened(text: str, most: int = 200) -> str:
    return text if len(text) <= most else text[:most - 3] + "..."
