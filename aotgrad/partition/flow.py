"""Maximum flow and minimum cut (Dinic's algorithm) on integer-capacity networks.

Vertices are any hashable keys, numbered on first use; the search itself runs on flat
integer lists (edge `e ^ 1` is the reverse of edge `e`), which keeps a graph of tens of
thousands of edges well under a second in plain Python.
"""

from __future__ import annotations

from collections import deque
from typing import Hashable


class FlowNetwork:
    """A directed network. `min_cut` returns the cut's value and its source side."""

    def __init__(self):
        self.ids: dict[Hashable, int] = {}
        self.keys: list[Hashable] = []
        self.out: list[list[int]] = []  # per vertex: its edges
        self.head: list[int] = []  # per edge: its target vertex
        self.cap: list[int] = []  # per edge: residual capacity

    def vertex(self, key: Hashable) -> int:
        v = self.ids.get(key)
        if v is None:
            v = self.ids[key] = len(self.keys)
            self.keys.append(key)
            self.out.append([])
        return v

    def add_edge(self, u: Hashable, v: Hashable, capacity: int) -> None:
        a, b = self.vertex(u), self.vertex(v)
        self.out[a].append(len(self.head))
        self.head.append(b)
        self.cap.append(capacity)
        self.out[b].append(len(self.head))
        self.head.append(a)
        self.cap.append(0)

    def min_cut(self, source: Hashable, sink: Hashable, latest: bool = False) -> tuple[int, set]:
        """(value of a minimum cut, keys of the vertices on its source side). Of the minimum
        cuts, the one nearest the source, or with `latest` the one nearest the sink."""
        s, t = self.vertex(source), self.vertex(sink)
        flow = 0
        while True:
            level = self._levels(s)
            if level[t] < 0:
                break
            cursor = [0] * len(self.keys)
            pushed = self._push(s, t, level, cursor)
            while pushed:
                flow += pushed
                pushed = self._push(s, t, level, cursor)
        if latest:
            reaches_sink = self._reaching(t)
            return flow, {key for v, key in enumerate(self.keys) if not reaches_sink[v]}
        level = self._levels(s)
        return flow, {self.keys[v] for v, lv in enumerate(level) if lv >= 0}

    def _levels(self, s: int) -> list[int]:
        """Breadth-first distances from `s` along edges with residual capacity (-1: unreached)."""
        level = [-1] * len(self.keys)
        level[s] = 0
        queue = deque([s])
        out, head, cap = self.out, self.head, self.cap
        while queue:
            u = queue.popleft()
            next_level = level[u] + 1
            for e in out[u]:
                v = head[e]
                if cap[e] > 0 and level[v] < 0:
                    level[v] = next_level
                    queue.append(v)
        return level

    def _reaching(self, t: int) -> list[bool]:
        """Which vertices can still send flow to `t` (along edges with residual capacity)."""
        reached = [False] * len(self.keys)
        reached[t] = True
        stack = [t]
        out, head, cap = self.out, self.head, self.cap
        while stack:
            v = stack.pop()
            for e in out[v]:  # e ^ 1 runs from head[e] into v
                u = head[e]
                if cap[e ^ 1] > 0 and not reached[u]:
                    reached[u] = True
                    stack.append(u)
        return reached

    def _push(self, s: int, t: int, level: list[int], cursor: list[int]) -> int:
        """Send one augmenting path's worth of flow along the level graph (iteratively)."""
        out, head, cap = self.out, self.head, self.cap
        path: list[int] = []
        u = s
        while u != t:
            edges = out[u]
            i = cursor[u]
            while i < len(edges):
                e = edges[i]
                if cap[e] > 0 and level[head[e]] == level[u] + 1:
                    break
                i += 1
            cursor[u] = i
            if i == len(edges):
                if u == s:
                    return 0
                level[u] = -1  # dead end: retreat and never come back
                e = path.pop()
                u = head[e ^ 1]
                cursor[u] += 1
                continue
            path.append(edges[i])
            u = head[edges[i]]
        pushed = min(cap[e] for e in path)
        for e in path:
            cap[e] -= pushed
            cap[e ^ 1] += pushed
        return pushed
