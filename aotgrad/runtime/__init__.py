"""Stage 5: the compiled call at run time (call: an autograd.Function around the compiled graphs;
outputs: how each user output is obtained, aliases rebuilt as eager made them) and the
per-entry call guards (guards)."""
