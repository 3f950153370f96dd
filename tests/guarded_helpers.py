"""A module of the user's other than the test's: a global its function reads, changed after
a compile of a function that calls it (tests/test_guards.py)."""

import torch

OFFSET = 1.0


def shifted(x: torch.Tensor) -> torch.Tensor:
    return x + OFFSET
