"""The cache directory: where entries live, whether to trust it, and how entries are written,
read, locked and evicted.

An entry is one file `<key digest>.json`: a first line holding the sha256 of the rest, then
JSON. It is written to a temporary file and renamed into place, so a reader sees a whole
entry or none; it is read only after its checksum matches. Beside it, `<digest>.key` holds
the entry's key components alone (for explaining another entry's miss) and `<digest>.lock`
exists while one process compiles what the entry will hold.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import stat
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

log = logging.getLogger("aotgrad.cache")

FORMAT = "v1"  # the layout of entries: a new one starts a new subdirectory
DEFAULT_SIZE_LIMIT = 1 << 30  # bytes of entries kept before the least recently used go
LOCK_TIMEOUT = 120.0  # seconds a compile waits for another process's before compiling itself
LOCK_WRITE_GRACE = 10.0  # seconds a new lock may stay without its holder's pid
_STATS = {"hits": 0, "misses": 0, "bypasses": 0, "stores": 0, "evictions": 0, "corrupt": 0,
          "untrusted": 0, "lock_timeouts": 0, "inductor_by_key": 0, "inductor_by_key_missing": 0}
_warned_untrusted: set[str] = set()


def enabled() -> bool:
    return os.environ.get("AOTGRAD_CACHE", "1").strip().lower() not in ("0", "false", "off", "")


def root() -> Path:
    """`$AOTGRAD_CACHE_DIR`, else `$XDG_CACHE_HOME/aotgrad`, else `~/.cache/aotgrad`."""
    explicit = os.environ.get("AOTGRAD_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "aotgrad"


def size_limit() -> int:
    mb = os.environ.get("AOTGRAD_CACHE_SIZE_MB")
    return int(float(mb) * (1 << 20)) if mb else DEFAULT_SIZE_LIMIT


def count(event: str, n: int = 1) -> None:
    _STATS[event] += n


def stats() -> dict[str, int]:
    """This process's counts: hits, misses, bypasses (not cacheable), stores, evictions,
    corrupt entries, untrusted directories met, lock timeouts; graphs Inductor loaded by
    their stored key (`inductor_by_key`), or did not find by it and compiled
    (`inductor_by_key_missing`)."""
    return dict(_STATS)


def reset_stats() -> None:
    for k in _STATS:
        _STATS[k] = 0


def untrusted_reason(path: Path) -> str | None:
    """Why `path` may not be read from: owned by another user, or writable by others (anyone
    who can write there could plant an entry)."""
    st = path.stat()
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"owned by uid {st.st_uid}, not {os.getuid()}"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def directory() -> Path | None:
    """The trusted entries directory, made (mode 0700) if missing; None, with a warning once,
    where the cache root or the directory is not trusted."""
    base = root()
    entries = base / FORMAT
    try:
        entries.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        return _untrusted(base, f"cannot be created ({exc})")
    for path in (base, entries):
        reason = untrusted_reason(path)
        if reason is not None:
            return _untrusted(path, reason)
    return entries


def _untrusted(path: Path, reason: str) -> None:
    count("untrusted")
    if str(path) not in _warned_untrusted:
        _warned_untrusted.add(str(path))
        warnings.warn(f"aotgrad: the compile cache directory {path} is {reason}: not used. "
                      "Fix its owner/permissions (chmod 700), or set AOTGRAD_CACHE_DIR to a "
                      "directory of your own, or AOTGRAD_CACHE=0.", stacklevel=3)
    return None


def write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def seal(payload: dict) -> bytes:
    body = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(body).hexdigest().encode() + b"\n" + body


def unseal(data: bytes) -> dict:
    """The entry's JSON; ValueError where its checksum does not match (truncated, edited)."""
    digest, sep, body = data.partition(b"\n")
    if not sep or hashlib.sha256(body).hexdigest().encode() != digest:
        raise ValueError("its sha256 does not match its contents")
    payload = json.loads(body)
    if not isinstance(payload, dict):
        raise ValueError("it is not a JSON object")
    return payload


@dataclass(frozen=True)
class Store:
    path: Path

    def entry(self, digest: str) -> Path:
        return self.path / f"{digest}.json"

    def read(self, digest: str) -> dict | None:
        """The entry's payload; None where there is none, or (with a warning) a corrupt one."""
        path = self.entry(digest)
        try:
            payload = unseal(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:  # unreadable (permissions, a directory), corrupt
            count("corrupt")
            what = "is corrupt" if isinstance(exc, ValueError) else "cannot be read"
            warnings.warn(f"aotgrad: compile cache entry {path} {what} ({exc}); "
                          "compiling instead.", stacklevel=3)
            return None
        self.touch(digest)  # its recent use, for eviction
        return payload

    def touch(self, digest: str) -> None:
        """Mark an entry used now (eviction takes the least recently used first)."""
        with contextlib.suppress(OSError):
            os.utime(self.entry(digest))

    def write(self, digest: str, payload: dict, components: dict[str, str],
              reads: tuple[str, ...] = ()) -> None:
        """`reads`: the entries this one refers to, marked used after it (eviction, oldest
        first, then takes this one before them: no entry outlives one it needs)."""
        write_atomic(self.path / f"{digest}.key", seal({"components": components}))
        write_atomic(self.entry(digest), seal(payload))
        for other in reads:
            self.touch(other)
        count("stores")
        self.evict(size_limit())

    def keys(self) -> Iterator[dict[str, str]]:
        """Every entry's key components (for explaining a miss); unreadable ones skipped."""
        for path in self.path.glob("*.key"):
            try:
                components = unseal(path.read_bytes())["components"]
            except (OSError, ValueError, KeyError, TypeError):  # unreadable, or not a key's
                continue
            if isinstance(components, dict):
                yield components

    def evict(self, limit: int) -> int:
        """Remove the least recently used entries until the rest fit in `limit` bytes."""
        entries = []  # Inductor's keys beside them (fxkeys.py) age alike
        for path in [*self.path.glob("*.json"), *self.path.glob("*.fxkey")]:
            with contextlib.suppress(OSError):
                st = path.stat()
                entries.append((st.st_mtime, st.st_size, path))
        total = sum(size for _, size, _ in entries)
        removed = 0
        for _, size, path in sorted(entries):
            if total <= limit:
                break
            for p in (path, path.with_suffix(".key")):
                with contextlib.suppress(OSError):
                    p.unlink()
            total -= size
            removed += 1
        count("evictions", removed)
        return removed

    @contextlib.contextmanager
    def lock(self, digest: str, timeout: float = LOCK_TIMEOUT):
        """Held while this process compiles the entry; yields whether it waited for another
        process's (which may have written the entry meanwhile). Past `timeout` it goes on
        without the lock; a lock whose holder died is broken; one this process holds (a
        compile inside its own compile of the same entry) is passed without waiting."""
        path = self.path / f"{digest}.lock"
        got, waited = _acquire(path, timeout)
        try:
            yield waited
        finally:
            if got:
                with contextlib.suppress(OSError):
                    path.unlink()


def _acquire(path: Path, timeout: float) -> tuple[bool, bool]:
    """(got the lock, waited for it)."""
    deadline = time.monotonic() + timeout
    waited = False
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            holder = _holder(path)
            if holder == os.getpid():  # a compile nested in this process's own: no waiting
                return False, False
            if holder is not None and _dead(holder) or holder is None and _abandoned(path):
                try:
                    path.unlink(missing_ok=True)
                except OSError as exc:  # a read-only directory: nobody holds it, go on
                    return _without_lock(path, exc)
                continue
            if time.monotonic() > deadline:
                count("lock_timeouts")
                log.warning("aotgrad cache: %s held past %.0f s; compiling without it",
                            path.name, timeout)
                return False, True
            time.sleep(0.05)
            waited = True
            continue
        except OSError as exc:  # a read-only or full directory: its entries still hit
            return _without_lock(path, exc)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(str(os.getpid()))
        except OSError as exc:  # a full disk: no lock without its pid may stay behind
            with contextlib.suppress(OSError):
                path.unlink()
            return _without_lock(path, exc)
        return True, waited


def _without_lock(path: Path, exc: OSError) -> tuple[bool, bool]:
    log.warning("aotgrad cache: cannot lock %s (%s); compiling without it", path.name, exc)
    return False, False


def _holder(path: Path) -> int | None:
    """The pid holding the lock at `path`; None while it is being written."""
    try:
        pid = int(path.read_text() or "0")
    except (OSError, ValueError):
        return None
    return pid if pid > 0 else None


def _abandoned(path: Path) -> bool:
    """A lock without a pid long after it was made: its holder died between making it and
    writing its pid, and no process could ever break it by the pid."""
    try:
        return time.time() - path.stat().st_mtime > LOCK_WRITE_GRACE
    except OSError:
        return False


def _dead(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def clear() -> int:
    """Remove every entry of the cache directory (only where trusted); how many."""
    path = directory()
    if path is None:
        return 0
    removed = 0
    for p in path.iterdir():
        if p.suffix in (".json", ".key", ".lock", ".tmp", ".fxkey"):
            with contextlib.suppress(OSError):
                p.unlink()
                removed += p.suffix == ".json"
    return removed
