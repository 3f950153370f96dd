"""The order in which eager's engine runs the AccumulateGrad tasks that one node readies.

The engine's ready queue is a `std::priority_queue` (a binary heap, libstdc++'s) ordered by
sequence number, and every AccumulateGrad task has the top one: among those one node
pushes (in the order of its outputs), the heap, not the push order, decides which runs
first. With nothing else queued (an aotgrad region's node, readying every parameter, is the
last node of most backwards), the order is `pop_order(k)`: 0, 2, 1, 3 for four.
"""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=None)
def pop_order(k: int) -> tuple[int, ...]:
    """The pops of a libstdc++ heap of k equal items pushed as 0..k-1 (equal pushes never
    sift up)."""
    heap, popped = list(range(k)), []
    while heap:
        popped.append(heap[0])
        last = heap.pop()
        if heap:
            _fill_root(heap, last)
    return tuple(popped)


def _fill_root(heap: list, last: int) -> None:
    """std::__adjust_heap on equal items: the root's hole moves down, always to the right
    child (a left one only last, where the heap's size is even), and `last` fills it."""
    n, hole, child = len(heap), 0, 0
    while child < (n - 1) // 2:
        child = 2 * (child + 1)
        heap[hole], hole = heap[child], child
    if n % 2 == 0 and child == (n - 2) // 2:
        child = 2 * (child + 1)
        heap[hole], hole = heap[child - 1], child - 1
    heap[hole] = last
