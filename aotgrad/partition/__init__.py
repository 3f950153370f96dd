"""Stage 3: the joint graph cut into forward and backward: the split itself (split), the min-cut
(remat, flow), the memory model (memory), the plan space and the budget (plans, ilp, budget)."""
