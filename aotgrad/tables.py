"""Per-op knowledge, one line per entry. Passes look ops up here instead of testing names."""

import torch

aten = torch.ops.aten

# Ops that do nothing once autograd is done: dropping them leaves the values unchanged.
NO_OP_AT_RUNTIME = frozenset({
    aten.detach.default,
})

# In-place ops a functional graph may still hold: the trailing copy into a mutated input
# (inference graphs with keep_inference_input_mutations=True).
ALLOWED_INPUT_MUTATIONS = frozenset({
    aten.copy_.default,
})
