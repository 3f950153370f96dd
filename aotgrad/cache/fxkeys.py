"""Inductor's FX graph cache keys of the graphs an entry holds, beside the entry.

A stored graph is compiled after its entry is written (a backward at its first call), so its
Inductor key cannot be part of the entry: it lives in `<graph digest>.fxkey`, named by the
sha256 of the graph as the entry holds it (either level of the cache finds it), as sealed
JSON: {context digest: {"key", "guards"}} (backends/fxcache.py says what the context is).
A graph carries its `InductorKeys` in `gm.meta[INDUCTOR_FX_KEY]`; Inductor's compiler reads
the record of its context there, and tells it the key of what it compiled.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field

from torch import fx

from ..schema import INDUCTOR_FX_KEY
from . import store

log = logging.getLogger("aotgrad.cache")
SUFFIX = ".fxkey"


def graph_digest(rows: list) -> str:
    text = json.dumps(rows, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class InductorKeys:
    """One stored graph's Inductor keys, by context digest (mutable: a compile adds its)."""

    path: store.Store
    digest: str
    records: dict = field(default_factory=dict)

    def remember(self, context: str | None, record: dict | None) -> None:
        if context is None or record is None or self.records.get(context) == record:
            return
        self.records[context] = record
        try:  # others' records too: another context's process may have written meanwhile
            latest = read(self.path, self.digest)
            store.write_atomic(self._file(), store.seal({**latest, context: record}))
        except Exception as exc:  # a cache bug must cost a later compile, never this one
            log.warning("aotgrad cache: could not write Inductor's key (%r)", exc)

    def loaded(self, found: bool) -> None:
        store.count("inductor_by_key" if found else "inductor_by_key_missing")

    def _file(self):
        return self.path.path / f"{self.digest}{SUFFIX}"


def read(path: store.Store, digest: str) -> dict:
    """The records of a graph; none where the file is missing or damaged."""
    try:
        records = store.unseal((path.path / f"{digest}{SUFFIX}").read_bytes())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in records.items() if _well_formed(v)}


def _well_formed(record) -> bool:
    """A record that loads by key without raising (a sealed file may still be edited)."""
    return isinstance(record, dict) and isinstance(record.get("key"), str) and \
        "guards" in record and isinstance(record["guards"], (str, type(None)))


def attach(gm: fx.GraphModule, path: store.Store, rows: list) -> InductorKeys:
    digest = graph_digest(rows)
    keys = InductorKeys(path, digest, read(path, digest))
    gm.meta[INDUCTOR_FX_KEY] = keys
    return keys
