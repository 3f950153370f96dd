"""Stage 5: the compiled call at run time (call: an autograd.Function around the compiled graphs)
and the per-entry call guards (guards)."""
