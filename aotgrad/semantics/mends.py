"""Where torch's Python code, run by our traces, is not what eager runs: mended for the trace.

Traces run under the python dispatcher, so torch's Python decompositions of composite ops
(`aten.lstm`, for one) stand in for the C++ kernels eager calls. Two of them differ from eager
in ways a training trace meets:

- `aten.lstm` calls mkldnn's LSTM kernel in its inference mode whenever the input does not
  require grad, the weights' gradients notwithstanding: the backward then reads a workspace
  the kernel never made (`lstm_for_training`);
- on torch 2.11, its unrolled per-layer LSTM returns each layer's final states as
  (1, batch, hidden) (`squeeze(1)` where `squeeze(0)` was meant), so `h_n` and `c_n` come out
  with an extra dimension (`lstm_states_shaped`; torch 2.13's is right).

And one our traces cannot mend: torch 2.11's tracer cannot hold a `torch.Generator` in a
graph (2.13's keeps it as an opaque object), so a random op given the user's generator is
refused by name (`generators_traceable`).

`patched` is the one way this package swaps a module's attribute for a while (torch's here
and in checkpoints.py and custom_functions.py, Python's `random` in capture/analysis.py).
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch._decomp import decompositions


@contextlib.contextmanager
def patched(owner, **values):
    """`owner`'s attributes replaced by `values` meanwhile. The originals are read from the
    owner's own `__dict__`, so a classmethod is put back as the classmethod it was."""
    originals = {name: vars(owner)[name] for name in values}
    for name, value in values.items():
        setattr(owner, name, value)
    try:
        yield
    finally:
        for name, value in originals.items():
            setattr(owner, name, value)


@contextlib.contextmanager
def lstm_for_training():
    """With mkldnn off, the decomposition takes matmuls and pointwise ops whose backward is
    whole (the sequence unrolled, as it does whenever the input requires grad)."""
    enabled = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(False)
    try:
        with lstm_states_shaped():
            yield
    finally:
        torch._C._set_mkldnn_enabled(enabled)


def lstm_states_shaped():
    """Each layer's final states in the shape of the states it started from."""
    if not _lstm_states_misshaped():
        return contextlib.nullcontext()
    unrolled = decompositions.one_layer_lstm

    def one_layer_lstm(inp, hidden, params, has_biases, reverse=False):
        out, (h, c) = unrolled(inp, hidden, params, has_biases, reverse)
        return out, (h.reshape(hidden[0].shape), c.reshape(hidden[1].shape))

    return patched(decompositions, one_layer_lstm=one_layer_lstm)


@functools.cache
def _lstm_states_misshaped() -> bool:
    """Whether this torch's unrolled LSTM layer returns misshaped final states (asked once,
    on a sequence of one step, batch 2)."""
    state = torch.zeros(2, 3)
    weights = [torch.zeros(12, 2), torch.zeros(12, 3)]
    with torch.no_grad():
        _, (h, _) = decompositions.one_layer_lstm(torch.zeros(1, 2, 2), (state, state),
                                                  weights, False)
    return h.shape != state.shape


@functools.cache
def generators_traceable() -> bool:
    """Whether this torch's tracer keeps a `torch.Generator` argument in its graph (asked
    once, by tracing `torch.rand(1, generator=g)`)."""
    from torch.fx.experimental.proxy_tensor import make_fx
    try:
        make_fx(lambda g: torch.rand(1, generator=g))(torch.Generator())
    except NotImplementedError:
        return False
    return True
