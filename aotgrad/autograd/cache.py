"""Cache keys of captured backwards, and why a backward missed the cache.

The engine keeps the cache itself (keyed by node types, saved-tensor metadata, hooks; sizes
specialized until one changes, dynamic after) and calls the capture only on a miss. To say
*why* it missed, each capture records its own key: the engine's walk (each node and hook,
in order) and the tensors and sizes the engine lifted, each with the node that owns it.
A miss is explained as the difference against the nearest earlier key, part by part.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass

log = logging.getLogger("aotgrad.autograd")
MAX_REASONS = 4  # a miss logs at most this many differences


@dataclass(frozen=True)
class Lifted:
    """A tensor or size the engine lifted into the graph's inputs, and whose it is."""
    owner: str  # "node 7 AddmmBackward0"
    what: str  # "saved tensor" / "size"
    value: tuple  # (shape, dtype) for a tensor, (int,) for a size


@dataclass(frozen=True)
class CaptureKey:
    """One captured backward's structure: a named list of parts, compared part by part."""
    walk: tuple[str, ...]  # "node 3 MulBackward0", "tensor pre-hook on node 3", ...
    lifted: tuple[Lifted, ...]

    def differences(self, older: "CaptureKey") -> list[str]:
        if self.walk != older.walk:
            return _walk_differences(older.walk, self.walk)
        if len(self.lifted) != len(older.lifted):
            return _count_differences(older.lifted, self.lifted)
        return [f"{new.owner}: {new.what} {_show(old.value)} -> {_show(new.value)}"
                for old, new in zip(older.lifted, self.lifted) if old != new]


def _walk_differences(old: tuple[str, ...], new: tuple[str, ...]) -> list[str]:
    for i, (a, b) in enumerate(zip(old, new)):
        if a != b:
            return [f"step {i} of the backward: {a} -> {b}"]
    longer, extra = ("now", new[len(old)]) if len(new) > len(old) else ("before", old[len(new)])
    return [f"{len(old)} steps -> {len(new)} ({longer} also: {extra})"]


def _count_differences(old: tuple[Lifted, ...], new: tuple[Lifted, ...]) -> list[str]:
    """Lifted inputs gained or lost (a .grad to accumulate into, a hook's tensor)."""
    before = Counter((x.what, _show(x.value)) for x in old)
    after = Counter((x.what, _show(x.value)) for x in new)
    gained = [f"now also lifts a {what} {value}" for what, value in after - before]
    lost = [f"no longer lifts a {what} {value}" for what, value in before - after]
    return [f"{len(old)} lifted inputs -> {len(new)}"] + gained + lost


def _show(value: tuple) -> str:
    if len(value) == 1:
        return str(value[0])
    shape, dtype = value
    return f"{tuple(shape)} {str(dtype).replace('torch.', '')}"


class CaptureLog:
    """Every key captured so far (per enable() context), to explain the next miss."""

    def __init__(self):
        self.keys: list[CaptureKey] = []

    def explain_miss(self, key: CaptureKey) -> str:
        if not self.keys:
            return "first backward captured"
        # Nearest: the same walk first (only sizes differ), then the fewest differences.
        nearest = min(self.keys, key=lambda old: (old.walk != key.walk,
                                                   len(key.differences(old))))
        diffs = key.differences(nearest)
        if not diffs:
            return "same structure as a cached capture (the engine's key differs elsewhere)"
        more = f" (+{len(diffs) - MAX_REASONS} more)" if len(diffs) > MAX_REASONS else ""
        return "; ".join(diffs[:MAX_REASONS]) + more

    def seen_walk(self, key: CaptureKey) -> bool:
        """Was this walk captured before (then only lifted sizes or metadata differ)?"""
        return any(old.walk == key.walk for old in self.keys)

    def record(self, key: CaptureKey) -> str:
        reason = self.explain_miss(key)
        self.keys.append(key)
        log.info("compiled autograd: capture %d: %s", len(self.keys), reason)
        return reason
