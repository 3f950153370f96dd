"""The persistent compile cache: a second process compiling the same program skips the
backend's passes and the partition, and Inductor's code generation (its own cache).

`stats()` counts this process's hits and misses; `clear()` empties the directory;
`events()` tells why each recent compile hit, missed or bypassed the cache. The directory
is `$AOTGRAD_CACHE_DIR`, else `$XDG_CACHE_HOME/aotgrad` (`~/.cache/aotgrad`);
`AOTGRAD_CACHE=0` turns the cache off; `AOTGRAD_CACHE_SIZE_MB` bounds it (default 1024).
"""

from . import entry, store
from .entry import events
from .store import clear, root, stats


def reset_stats() -> None:
    """Zero this process's counts and forget its events (tests, benchmarks)."""
    store.reset_stats()
    entry.forget_events()

__all__ = ["stats", "clear", "events", "reset_stats", "root"]
