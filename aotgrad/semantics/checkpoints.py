"""Plain `torch.utils.checkpoint` regions, traced once and tagged for the partitioner.

In eager, a plain non-reentrant checkpoint runs its region again in the backward, with the
RNG state replayed so that dropout draws the same mask. A trace cannot replay RNG state: a
second run would draw a fresh mask, a silently wrong gradient. torch's selective-checkpoint
machinery (which torch.compile also uses for plain checkpoints) avoids that by caching
every op's output, and so refuses a region that writes in place to one of them
(`ReLU(inplace=True)` after a linear layer), where eager is fine.

So a plain region runs once, as if it were not checkpointed: autograd saves what the
backward reads, and every node the region's ops record is tagged "prefer recompute" with
the region's id. The partitioner then recomputes those values in the backward, where that
is safe (never random ops), which is what the checkpoint asked for. A reentrant checkpoint
(an autograd.Function whose backward calls `backward`, which a trace's `autograd.grad`
cannot take) runs the same way. A double backward's replay runs every checkpoint, selective
ones included, as if it were not there (a checkpoint does not change eager's gradients).

One thing eager does cannot be had this way: writing twice. A region that writes in place
to a tensor from outside it (BatchNorm's running statistics in training mode) writes it
again in eager, when the backward recomputes the region. Such a region is refused with
aotgrad's error; a selective checkpoint (`context_fn`) keeps torch's own machinery.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
from typing import Iterator

import torch
import torch.fx.traceback as fx_traceback
import torch.utils._pytree as pytree
import torch.utils.checkpoint as checkpoint_module
from torch.fx.experimental.proxy_tensor import get_proxy_mode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import CheckpointPolicy
from torch.utils.weak import WeakTensorKeyDictionary

from .autocast import autocast_cache
from .mends import patched

_IDS: contextvars.ContextVar[Iterator[int] | None] = contextvars.ContextVar(
    "aotgrad_checkpoint_ids", default=None)
# Tensors plain regions read from outside them but not as arguments (closed over), while
# `noting_closed_over()` is on: eager's recompute reads such a tensor anew.
_CLOSED_OVER: contextvars.ContextVar[WeakTensorKeyDictionary | None] = contextvars.ContextVar(
    "aotgrad_checkpoint_closed_over", default=None)
# Inside Dynamo's selective region, whose op calls checkpoint() with preserve_rng_state=False
# whatever the user passed (torch keeps the RNG state its own way): the user's is its kwarg.
_IN_DYNAMO_OP: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "aotgrad_checkpoint_in_dynamo_op", default=False)
# The regions entered inside `run_once()`, closed by it if an error left them open.
_OPEN: contextvars.ContextVar[list | None] = contextvars.ContextVar(
    "aotgrad_open_checkpoints", default=None)


@contextlib.contextmanager
def run_once():
    """Plain checkpoints, reentrant or not, run their regions once, tagged (`PlainRegion`);
    selective ones (a `context_fn`) go through torch's machinery. Regions are numbered
    from 1: their ids are in the graph's nodes (and the cache's key), so two traces of the
    same code number them alike."""
    original = checkpoint_module._checkpoint_without_reentrant_generator

    def generator(fn, preserve_rng_state=True, context_fn=checkpoint_module.noop_context_fn,
                  *args, **kwargs):
        if context_fn is checkpoint_module.noop_context_fn:
            with PlainRegion(args, fresh_draws=not preserve_rng_state):
                yield
            return
        # past the region its policy must not tag the ops after
        with _policies_confined(), \
                selective_region(preserve_rng_state or _IN_DYNAMO_OP.get()):
            yield from original(fn, preserve_rng_state, context_fn, *args, **kwargs)

    ids, opened = _IDS.set(itertools.count(1)), _OPEN.set([])
    try:
        with patched(checkpoint_module, _checkpoint_without_reentrant_generator=generator,
                      CheckpointFunction=_ReentrantRegion), \
                _policies_confined():  # nor, after an error inside it, the next trace's
            yield
    finally:
        # An error inside a region leaves checkpoint()'s generator suspended, its mode on
        # the stack until the generator is collected: closed here, before anything else
        # runs under it.
        for region in reversed(_OPEN.get()):
            region.__exit__(None, None, None)
        _OPEN.reset(opened)
        _IDS.reset(ids)


def run_region(fn, args, reentrant: bool, preserve_rng_state: bool = True):
    """A plain region's call: once, tagged. A reentrant one (`use_reentrant=True`, which
    eager runs under no_grad in the forward) passes no gradient back, to its inputs or to
    the parameters it uses, unless an input of it requires grad: so here too."""
    if reentrant and not any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
        with torch.no_grad():
            return fn(*args)
    # Eager's gradients through a reentrant region come from its rerun in the backward,
    # whose casts are its own: a leaf used in and around it adds those gradients apart.
    with PlainRegion(args, fresh_draws=not preserve_rng_state), \
            autocast_cache(False) if reentrant else contextlib.nullcontext():
        return fn(*args)


class _ReentrantRegion:
    """A reentrant checkpoint (an autograd.Function whose backward runs the region again
    and calls `backward` inside, which a trace's `autograd.grad` cannot take) as a plain
    region."""

    @staticmethod
    def apply(run_function, preserve_rng_state, *args):
        return run_region(run_function, args, reentrant=True,
                          preserve_rng_state=preserve_rng_state)


@contextlib.contextmanager
def run_plainly():
    """Every non-reentrant checkpoint, selective ones included, runs its region as if it
    were not checkpointed: for a double backward's replay, which needs eager's gradients
    (a checkpoint does not change them) and no dispatch modes of torch's below autograd
    (a selective checkpoint's detach what they cache, which the replay would take for the
    user's detaches)."""
    def generator(*args, **kwargs):
        yield

    with patched(checkpoint_module, _checkpoint_without_reentrant_generator=generator):
        yield


_POLICY_KEYS = ("recompute", "ac_graph_id")


@contextlib.contextmanager
def _policies_confined():
    """torch's selective checkpoint, traced, leaves each op's policy in the tracer's current
    metadata (a global, copied onto every new node) and does not take it back: the nodes
    traced after it, in this trace or any later one in the process, would be tagged with
    it. Set back on the way out."""
    before = {k: fx_traceback.current_meta[k] for k in _POLICY_KEYS
              if k in fx_traceback.current_meta}
    try:
        yield
    finally:
        for key in _POLICY_KEYS:
            fx_traceback.current_meta.pop(key, None)
        fx_traceback.current_meta.update(before)


def _next_id() -> int:
    ids = _IDS.get()
    return next(ids) if ids is not None else 0


class PlainRegion(TorchDispatchMode):
    """The ops of one plain checkpoint's region, run once: each node they record is
    tagged; an in-place write to a tensor the region did not make is refused where a
    backward may recompute the region, and so is a random op where the recompute would
    draw afresh (`fresh_draws`: preserve_rng_state=False)."""

    def __init__(self, args: tuple = (), fresh_draws: bool = False):
        super().__init__()
        self.fresh_draws = fresh_draws
        self.closed_over = _CLOSED_OVER.get()
        self.graph_id = _next_id()
        self.made = WeakTensorKeyDictionary()  # by identity: `==` on tensors is theirs
        self.given = WeakTensorKeyDictionary()  # its arguments: read, not closed over
        self.given.update((t, True) for t in pytree.tree_leaves(args)
                          if isinstance(t, torch.Tensor))
        self.open = False

    def __enter__(self):
        self.open = True
        opened = _OPEN.get()
        if opened is not None:
            opened.append(self)
        return super().__enter__()

    def __exit__(self, *exc):
        if self.open:  # closed once, by the region's end or by `run_once`
            self.open = False
            super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self._refuse_outer_writes(func, args, kwargs)
        if self.fresh_draws:
            refuse_fresh_draws(func)
        if self.closed_over is not None:
            self._note_closed_over(args, kwargs)
        proxy_mode = get_proxy_mode()
        graph = proxy_mode.tracer.graph if proxy_mode is not None else None
        before = len(graph.nodes) if graph is not None else 0
        out = func(*args, **kwargs)
        if graph is not None:
            for node in itertools.islice(reversed(graph.nodes), len(graph.nodes) - before):
                node.meta["recompute"] = CheckpointPolicy.PREFER_RECOMPUTE
                node.meta["ac_graph_id"] = self.graph_id
        self.made.update((t, True) for t in pytree.tree_leaves(out)
                         if isinstance(t, torch.Tensor))
        return out

    def _note_closed_over(self, args, kwargs) -> None:
        self.closed_over.update((t, True) for t in pytree.tree_leaves((args, kwargs))
                                if isinstance(t, torch.Tensor) and t not in self.made
                                and t not in self.given)

    def _refuse_outer_writes(self, func, args, kwargs) -> None:
        """Under no_grad no backward recomputes the region: eager writes once, as here."""
        schema = getattr(func, "_schema", None)
        if schema is None or not schema.is_mutable or not torch.is_grad_enabled():
            return
        bound = dict(zip((a.name for a in schema.arguments), args), **kwargs)
        for arg in schema.arguments:
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            written = [t for t in pytree.tree_leaves(bound.get(arg.name))
                       if isinstance(t, torch.Tensor)]
            if any(t not in self.made for t in written):
                raise NotImplementedError(
                    f"aotgrad: a torch.utils.checkpoint region writes in place to a tensor "
                    f"from outside it ({func}, argument {arg.name}; BatchNorm's running "
                    "statistics in training mode, say): eager writes it again when the "
                    "backward recomputes the region, which a compiled backward does not. "
                    "Move the write out of the checkpointed region, or compile the "
                    "function without the checkpoint.")


@contextlib.contextmanager
def noting_closed_over():
    """Plain regions note the tensors they read from outside them, not as arguments."""
    token = _CLOSED_OVER.set(WeakTensorKeyDictionary())
    try:
        yield
    finally:
        _CLOSED_OVER.reset(token)


def refuse_closed_over_write(t: torch.Tensor) -> None:
    """`t`, saved for the backward, was changed in place later: if a plain region read it
    closed over, eager's backward recomputes the region with its new value (no error),
    which the values a compiled forward saves cannot give."""
    closed_over = _CLOSED_OVER.get()
    if closed_over is not None and t in closed_over:
        raise NotImplementedError(
            f"aotgrad: a torch.utils.checkpoint region reads a tensor of shape "
            f"{list(t.shape)} from outside it (closed over, not passed as an argument) that "
            "is changed in place after the region: eager's backward recomputes the region "
            "with the new value, which a compiled backward does not. Pass the tensor to "
            "checkpoint() as an argument (eager then raises at the backward, as aotgrad "
            "does), or change a copy of it.")


def refuse_fresh_draws(func) -> None:
    """In a region whose recompute draws afresh (preserve_rng_state=False), a random op is
    refused where a backward may recompute it (under no_grad eager draws once, as here).
    A selective region's too, whatever its policy says of the op (aotgrad never recomputes
    a random op)."""
    if torch.is_grad_enabled() and torch.Tag.nondeterministic_seeded in getattr(
            func, "tags", ()):
        raise NotImplementedError(
            f"aotgrad: a torch.utils.checkpoint region with preserve_rng_state=False draws "
            f"random numbers ({func}): eager's backward recomputes the region with fresh "
            "draws (another dropout mask than the forward's, and the global generator moved "
            "on), which a compiled backward does not repeat. Pass preserve_rng_state=True "
            "(the default), or compile the function without the checkpoint.")


@contextlib.contextmanager
def selective_region(preserve_rng_state: bool):
    """Around a selective region, run by torch's machinery: random ops refused where its
    recompute would draw afresh, and torch's assertion on the contexts made aotgrad's."""
    try:
        with contextlib.nullcontext() if preserve_rng_state else FreshDrawsRefused():
            yield
    except AssertionError as e:
        if "`context_fn`" not in str(e):
            raise
        raise NotImplementedError(
            "aotgrad: a torch.utils.checkpoint context_fn is traced by torch's selective "
            "checkpointing (as under torch.compile), which takes only two TorchDispatchModes; "
            "this one returns other contexts. Use create_selective_checkpoint_contexts, or "
            "compile the function without the checkpoint.") from e


@contextlib.contextmanager
def dynamo_selective_region(preserve_rng_state: bool):
    """Around Dynamo's op for a selective region, the user's `preserve_rng_state` its kwarg."""
    token = _IN_DYNAMO_OP.set(True)
    try:
        with selective_region(preserve_rng_state):
            yield
    finally:
        _IN_DYNAMO_OP.reset(token)


class FreshDrawsRefused(TorchDispatchMode):
    """Around a selective region with preserve_rng_state=False: `refuse_fresh_draws`."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        refuse_fresh_draws(func)
        return func(*args, **(kwargs or {}))


def is_plain(body: torch.fx.GraphModule) -> bool:
    """Is this body of Dynamo's `tag_activation_checkpoint` a plain checkpoint's (Dynamo
    keeps a selective one's `context_fn` in its meta)?"""
    return "_checkpoint_context_fn" not in getattr(body, "meta", {})
