"""Maximum flow and minimum cut (Dinic's algorithm) on small integer-capacity networks."""

from __future__ import annotations

from collections import deque


class FlowNetwork:
    """A directed network; `min_cut` returns the vertices on the source side of a minimum cut."""

    def __init__(self):
        self.head: list[int] = []  # per edge: its target
        self.cap: list[int] = []  # per edge: residual capacity; edge e ^ 1 is its reverse
        self.out: dict[object, list[int]] = {}

    def add_edge(self, u, v, capacity: int) -> None:
        for a, b, c in ((u, v, capacity), (v, u, 0)):
            self.out.setdefault(a, []).append(len(self.head))
            self.head.append(b)
            self.cap.append(c)

    def min_cut(self, source, sink) -> set:
        while self._augment_phase(source, sink):
            pass
        return set(self._levels(source, sink=None))

    def _levels(self, source, sink) -> dict:
        level = {source: 0}
        queue = deque([source])
        while queue:
            u = queue.popleft()
            for e in self.out.get(u, ()):
                if self.cap[e] > 0 and self.head[e] not in level:
                    level[self.head[e]] = level[u] + 1
                    queue.append(self.head[e])
        return level

    def _augment_phase(self, source, sink) -> bool:
        level = self._levels(source, sink)
        if sink not in level:
            return False
        cursor = {u: 0 for u in level}
        while self._push(source, sink, level, cursor):
            pass
        return True

    def _push(self, source, sink, level, cursor) -> int:
        """Send one blocking path's worth of flow along the level graph (iteratively)."""
        path: list[int] = []
        u = source
        while u != sink:
            edges = self.out.get(u, ())
            while cursor[u] < len(edges):
                e = edges[cursor[u]]
                v = self.head[e]
                if self.cap[e] > 0 and level.get(v) == level[u] + 1:
                    break
                cursor[u] += 1
            else:
                if u == source:
                    return 0
                level[u] = -1  # dead end: retreat
                e = path.pop()
                u = self.head[e ^ 1]
                cursor[u] += 1
                continue
            path.append(e)
            u = self.head[e]
        pushed = min(self.cap[e] for e in path)
        for e in path:
            self.cap[e] -= pushed
            self.cap[e ^ 1] += pushed
        return pushed
