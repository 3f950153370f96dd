"""Effectful ops: error checks are traced as plain ops; other side effects are refused.

PyTorch's functionalization threads "effect tokens" through the ops it registers as
effectful (`torch._higher_order_ops.effects`), so that no later pass drops or reorders them.
The effectful op a training step meets in practice is an error check: `torch.linalg.inv`,
`cholesky`, `solve`... compute a result and an `info` tensor, then raise through
`aten._linalg_check_errors` when the input was singular or not positive definite. Asserts
(`torch._assert_async`) are the same kind of op, although PyTorch does not register them.

An error check returns nothing, changes no state and only reads its inputs: no token is
needed to order it, only a data dependence on the value it checks (which it has) and a place
in the half of the step where eager runs it. So capture traces every op of
`tables.ERROR_CHECKS` as a plain op with no outputs, tagged with the phase it ran in
(`PHASE`); FX's dead-code elimination keeps it (`keep_when_unused`); the partitioner makes it
a root of the forward or of the backward (`partition.split.joint_of`). A failing check then
raises at run time exactly as eager does: the same kernel, the same exception type and
message. Ops with other effects (prints, torchbind calls, custom ops registered effectful)
need their order kept: PyTorch's functionalization runs each as `with_effects(token, op,
...)`, which returns a new token that the next such op takes. The chain starts at a token
the graph makes itself (`prims._make_token`, as torch's AOTAutograd leaves it once it
unlifts its token inputs: `EffectTokens`); each `with_effects` node is tagged with its phase
and rooted like an error check, so that it runs once, in order, in the half eager runs it.
"""

from __future__ import annotations

import functools
import warnings
import weakref
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree
from torch import fx
from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode
from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

from . import regions
from .hops import functionalize_hop
from .inference import decompose_tracking_views, normal_views
from .inplace_layouts import inplace_keeping_layout, out_keeping_layout
from .swaps import SET_FROM_TENSOR, SetCalls, mirror_set_on_wrapper
from ..tables import (CHECKED_CONDITIONS, ERROR_CHECKS, KERNEL_RESIZES, OUT_DTYPE_INPUTS,
                      OUT_DTYPE_PARTLY, OUT_DTYPE_REDUCTIONS, STORAGE_RESIZES, UNMARKED_MUTATIONS,
                      differentiated_by_its_kernel, has_effect, writes_a_tensor_list,
                      writes_behind_the_counter, written_arguments)
from ..schema import PHASE, is_tangent

FORWARD, BACKWARD = "forward", "backward"
aten = torch.ops.aten


def keep_when_unused() -> None:
    """Mark the error checks as side effects, so that FX's dead-code elimination (ours, and
    any a backend runs) keeps them. PyTorch does the same for the effectful ops it traces;
    some torch versions already count `_linalg_check_errors` among them, others do not."""
    for op in ERROR_CHECKS:
        fx.node.has_side_effect(op)
    fx.node.has_side_effect(torch.ops.higher_order.with_effects)  # its token is not returned


keep_when_unused()


class CheckingFunctionalMode(FunctionalTensorMode):
    """Functionalization that lets error checks through as they are: they neither mutate
    nor alias, so they need no functional form, and once tagged they need no token. It also
    records `set_()` calls and gives their target the metadata eager would (swaps.py),
    records the storage resizes it keeps out of the graph, and runs ops that write arguments
    without marking it as their declared forms (`tables.UNMARKED_MUTATIONS`), so that their
    writes are seen."""

    def __init__(self, observe: Callable | None = None):
        super().__init__()
        self._observe = observe  # told of every op and its result (capture.oplog.note)
        self._phase = FORWARD
        self._tokens = EffectTokens()  # read by PyTorch's handle_effects
        self.set_calls = SetCalls()
        # Per tensor (by id): its storage's size in bytes after its last
        # resize_storage_bytes_(), which the runtime replays (the graph holds none).
        self.storage_bytes: dict[int, int] = {}
        # Per in-place view op (`t_`, `unsqueeze_`...) on a view, with grad on: its root
        # base (by id). Autograd refuses it on a view of a leaf that requires grad, which
        # the trace's inputs are not (the analysis checks against the caller's).
        self.view_metadata_writes: list[int] = []
        self.conditions = CheckedConditions()  # reading one traces a run-time check

    # Higher-order ops (cond, scan, invoke_subgraph...) look their rule up by the mode's
    # exact class: without this they would find none for a subclass. `__torch_dispatch__`
    # hands them to functionalization's own rules (hops.py).
    supports_higher_order_operators = True

    @property
    def phase(self) -> str:
        """FORWARD, or BACKWARD while the joint trace takes the gradients."""
        return self._phase

    @phase.setter
    def phase(self, phase: str) -> None:
        # The backward's effects start a chain of their own: the runtime runs the backward
        # after the forward, and a token saved across would be an input Inductor cannot lower.
        self._phase = phase
        self._tokens = EffectTokens()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = self._dispatch(func, types, args, kwargs)
        if self._observe is not None:
            self._observe(func, args, kwargs, out)
        return out

    def _dispatch(self, func, types, args, kwargs):
        if torch.Tag.inplace_view in getattr(func, "tags", ()) and args[0]._is_view() \
                and torch.is_grad_enabled():
            self.view_metadata_writes.append(id(args[0]._base))  # a view's _base is its root
        if func is regions.INVOKE_SUBGRAPH and regions.is_built(args[0]):
            return regions.emit(self, *args)
        if isinstance(func, torch._ops.HigherOrderOperator):
            out = functionalize_hop(self, func, args, kwargs or {})
            _tag_traced_effects(self.phase, func if has_effect(func) else None)
            return out
        out = decompose_tracking_views(self, func, args, kwargs)
        if out is not NotImplemented:
            return out
        if self.conditions.read_as_bool(func, args):
            return self._checked_true(args[0])
        if func is SET_FROM_TENSOR:
            self.set_calls.record(args)
            out = super().__torch_dispatch__(func, types, args, kwargs)
            mirror_set_on_wrapper(args)
            return out
        if func in STORAGE_RESIZES:
            self.storage_bytes[id(args[0])] = args[1]
            with disable_proxy_modes_tracing():
                return super().__torch_dispatch__(func, types, args, kwargs)
        resizes = KERNEL_RESIZES.get(func)
        if resizes is not None:
            with self:  # traced as resizes of the inputs, which the runtime replays
                resizes(*args, **(kwargs or {}))
        args, kwargs = self._out_dtype_as_eager(func, args, kwargs)
        if _out_names(func):
            self._resize_outs_as_eager(func, args, kwargs)
        declared = UNMARKED_MUTATIONS.get(func)
        if declared is not None:
            with self:  # its ops are functionalized in turn
                return declared(*args, **(kwargs or {}))
        if differentiated_by_its_kernel(func) and torch.is_grad_enabled():
            _refuse_writes_that_require_grad(func, written_arguments(func, args, kwargs or {}))
        kept = _keeping_layout(self, func, args, kwargs or {})
        if kept is not NotImplemented:
            return kept
        if func not in ERROR_CHECKS:
            out = normal_views(func, args, super().__torch_dispatch__(func, types, args, kwargs),
                               self)
            if has_effect(func):
                _tag_traced_effects(self.phase, func)
            self.conditions.note(func, out)
            if writes_a_tensor_list(func):
                # As eager's foreach kernels do: the runtime copies the count back to the
                # inputs, and a value saved before the write fails autograd's check.
                torch.autograd.graph.increment_version(args[0])
            elif writes_behind_the_counter(func):  # once: a value saved before the call
                # then fails autograd's check, as in eager (a kernel that writes with torch's
                # in-place ops steps it once each; one that writes raw memory, not at all)
                torch.autograd.graph.increment_version(written_arguments(func, args, kwargs or {}))
            return out
        args, kwargs = pytree.tree_map_only(
            FunctionalTensor, FunctionalTensor.from_functional, (args, kwargs or {}))
        result = func(*args, **kwargs)  # below functionalization: traced (or run) as is
        _tag_traced_check(func, self.phase)
        return result

    def _out_dtype_as_eager(self, func, args, kwargs):
        """A reduction into `out=` computing in the out tensor's dtype, as eager's kernel does
        (`tables.OUT_DTYPE_REDUCTIONS`, `OUT_DTYPE_INPUTS`), or refused where it cannot
        (`OUT_DTYPE_PARTLY`)."""
        if func in OUT_DTYPE_REDUCTIONS and kwargs.get("dtype") is None:
            return args, {**kwargs, "dtype": kwargs["out"].dtype}
        if func in OUT_DTYPE_INPUTS and args[0].dtype != kwargs["out"].dtype \
                and args[0].dtype.is_floating_point and kwargs["out"].dtype.is_floating_point:
            with self:  # traced, as the kernel's own cast
                return (args[0].to(kwargs["out"].dtype), *args[1:]), kwargs
        if func in OUT_DTYPE_PARTLY and kwargs["out"].dtype != _floating(args[0].dtype):
            raise NotImplementedError(
                f"aotgrad: {func.name()} into an out= tensor of dtype {kwargs['out'].dtype} "
                f"from a {args[0].dtype} input: eager's kernel computes partly in the out "
                "tensor's dtype, which the trace does not reproduce. Convert the input first "
                "(torch.logsumexp(x.to(out.dtype), dim, out=out)) or drop out=.")
        return args, kwargs

    def _resize_outs_as_eager(self, func, args, kwargs) -> None:
        """Eager's out= kernels resize an out tensor of another shape (with a deprecation
        warning). Functionalized, the out tensor took the new value but kept its old sizes:
        `o.shape` read the old ones, and the copy back into an input failed. So each out
        tensor is resized first, functionalized, to the shape the op gives a fresh one."""
        names = [n for n in _out_names(func) if isinstance(kwargs.get(n), FunctionalTensor)]
        if not names:
            return
        inner_args, inner_kwargs = pytree.tree_map_only(
            FunctionalTensor, FunctionalTensor.from_functional, (args, kwargs))
        fresh = {n: inner_kwargs[n].new_empty(0) for n in names}
        with disable_proxy_modes_tracing():  # a probe on fake tensors, not traced
            func(*inner_args, **{**inner_kwargs, **fresh})
        for n in names:
            if fresh[n].shape != kwargs[n].shape:
                if kwargs[n].numel():
                    warnings.warn(_resized_output(kwargs[n].shape, fresh[n].shape))
                with self:
                    kwargs[n].resize_(fresh[n].shape)

    def _checked_true(self, condition) -> bool:
        """A checked condition read as a bool: True, with a check traced where the code read
        it. Where it is False at run time, eager would have raised (a distribution's invalid
        argument) or taken another branch: the check raises instead, never a silently
        different result."""
        with self:
            aten._assert_async.msg(condition, CONDITION_FAILED)
        return True


def _resized_output(old, new) -> str:
    """Eager's deprecation warning for an out= tensor with elements that a kernel resizes
    (ATen's, less the C++ source line it names). The trace warns once, as Python's default
    filter shows eager's once per line."""
    def sizes(shape):
        return f"[{', '.join(map(str, shape))}]"
    return (f"An output with one or more elements was resized since it had shape {sizes(old)}, "
            f"which does not match the required output shape {sizes(new)}. This behavior is "
            "deprecated, and in a future PyTorch release outputs will not be resized unless "
            "they have zero elements. You can explicitly reuse an out tensor t by resizing it, "
            "inplace, to zero elements with t.resize_(0).")


def _refuse_writes_that_require_grad(func, written) -> None:
    """Eager differentiates the in-place ops the kernel runs; traced, the fake kernel runs
    none, and the write took the gradient as it was: silently wrong gradients."""
    if any(isinstance(t, torch.Tensor) and t.requires_grad for t in written):
        raise NotImplementedError(
            f"aotgrad: {func} writes a tensor that requires grad and has no autograd kernel: "
            "eager differentiates the in-place ops its kernel runs, which aotgrad cannot see "
            "through its fake kernel. Define it with torch.library.custom_op (with "
            "register_autograd on a functional form), or write a tensor that does not require "
            "grad (under torch.no_grad(), or a detached one).")


def _keeping_layout(mode: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    """An in-place or out= op whose target keeps its strides in eager (inplace_layouts.py)."""
    if _out_names(func):
        return out_keeping_layout(mode, func, args, kwargs)
    return inplace_keeping_layout(mode, func, args, kwargs)


@functools.cache
def _out_names(func) -> tuple[str, ...]:
    """The out= arguments of an ATen op (none for a higher-order op)."""
    schema = getattr(func, "_schema", None)
    return tuple(a.name for a in schema.arguments if a.is_out) if schema is not None else ()


def _floating(dtype: torch.dtype) -> torch.dtype:
    # What a reduction that computes in floating point takes an integral input as.
    return dtype if dtype.is_floating_point or dtype.is_complex else torch.get_default_dtype()


class CheckedConditions:
    """The results of `tables.CHECKED_CONDITIONS` a trace made, by id (with a weak reference
    to tell an id reused by another tensor), and whether an op reads one as a Python bool."""

    def __init__(self):
        self._refs: dict[int, weakref.ref] = {}

    def note(self, func, out) -> None:
        if func in CHECKED_CONDITIONS:
            self._refs[id(out)] = weakref.ref(out)

    def read_as_bool(self, func, args) -> bool:
        if func is not aten._local_scalar_dense.default:
            return False
        ref = self._refs.get(id(args[0]))
        return ref is not None and ref() is args[0]

    def run(self, func, args, kwargs):
        """`func(*args, **kwargs)`, where reading a condition gives True: for a trace whose
        inputs another graph checks (a double-backward replay of the forward's values)."""
        if self.read_as_bool(func, args):
            return True
        out = func(*args, **kwargs)
        self.note(func, out)
        return out


CONDITION_FAILED = (
    "aotgrad: a condition the compiled function was traced as holding (torch._is_all_true: "
    "torch.distributions' argument or sample validation, torch._check_tensor_all) is False "
    "for these inputs, where eager raises its own error (a ValueError naming the invalid "
    "parameter or value) or takes another branch. Call the function eagerly to see which, "
    "or construct the distribution with validate_args=False")


class EffectTokens(dict):
    """The last token of each kind of effect. The first op of a kind finds one made where it
    runs: in a trace, a `prims._make_token` node (PyTorch's functionalization would instead
    assert that the token was passed in as an input)."""

    def __contains__(self, key) -> bool:
        return True

    def __missing__(self, key) -> torch.Tensor:
        with torch.autograd.grad_mode.no_grad():
            token = torch.ops.prims._make_token.default()
        self[key] = token
        return token


def _tag_traced_effects(phase: str, effectful: Any = None) -> None:
    """Tag the `with_effects` nodes the last op traced (nothing when not tracing). Where
    `effectful` (an op with effects) traced none, refuse: on torch 2.11 a print traced so
    left nothing in the graph, and the compiled function silently printed nothing."""
    proxy_mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.PROXY)
    if proxy_mode is None:
        return
    found = False
    for node in reversed(proxy_mode.tracer.graph.nodes):
        if PHASE in node.meta:
            break
        if is_effect(node):
            node.meta[PHASE] = phase
            found = True
    if effectful is not None and not found:
        raise NotImplementedError(
            f"aotgrad: {effectful} has side effects, but tracing it on torch "
            f"{torch.__version__} left no call in the graph (the compiled function would "
            f"silently skip it); use torch >= 2.13, or keep the call outside the compiled code")


def is_effect(node: fx.Node) -> bool:
    """An op with ordered side effects, as functionalization left it (a print...)."""
    return node.op == "call_function" and node.target is torch.ops.higher_order.with_effects


def _tag_traced_check(func, phase: str) -> None:
    """Tag the node that tracing just recorded for `func` (nothing when not tracing)."""
    proxy_mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.PROXY)
    if proxy_mode is None:
        return
    node = next(iter(reversed(proxy_mode.tracer.graph.nodes)))
    assert node.target is func, f"effects: expected {func} last in the trace, got {node}"
    node.meta[PHASE] = phase
    node.meta["val"] = None  # it returns nothing


def is_error_check(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target in ERROR_CHECKS


def checks_by_phase(graph: fx.Graph) -> tuple[list[fx.Node], list[fx.Node]]:
    """The error checks and effects eager runs in the forward, and those in the backward.

    A check traced without a phase (a backend's rewrite made it) goes by its data: in the
    backward when it reads a tangent, else in the forward."""
    forward, backward = [], []
    for node in graph.nodes:
        if is_error_check(node) or is_effect(node):
            phase = node.meta.get(PHASE) or _phase_from_data(node)
            (backward if phase == BACKWARD else forward).append(node)
    return forward, backward


def _phase_from_data(node: fx.Node) -> str:
    stack, seen = list(node.all_input_nodes), set()
    while stack:
        current = stack.pop()
        if current.op == "placeholder" and is_tangent(current):
            return BACKWARD
        if current not in seen:
            seen.add(current)
            stack.extend(current.all_input_nodes)
    return FORWARD


# ---- backends that schedule ops freely ----------------------------------------------------

def split_checks(gm: fx.GraphModule) -> tuple[fx.GraphModule, fx.GraphModule | None]:
    """`gm` without its error checks, returning the values they read after its own outputs,
    and a graph running the checks, in their order, on those values (None: no checks).

    For a compiler that schedules ops by data dependence alone (Inductor): an op with no
    output may be dropped or run in any order, and then a singular input would raise another
    check's error, or none. Run after the compiled graph, the checks raise what eager raises:
    eager stops at the first failing check, and the checks before it passed."""
    checks = [n for n in gm.graph.nodes if is_error_check(n)]
    if not checks:
        return gm, None
    read = list(dict.fromkeys(i for n in checks for i in n.all_input_nodes))
    body, env = fx.Graph(), {}
    for node in gm.graph.nodes:
        if node.op == "output":
            outs = [env[o] if isinstance(o, fx.Node) else o for o in node.args[0]]
            body.output(outs + [env[r] for r in read]).meta = dict(node.meta)
        elif not is_error_check(node):
            env[node] = body.node_copy(node, env.__getitem__)
    checking, inputs = fx.Graph(), {}
    for r in read:
        inputs[r] = checking.placeholder(r.name)
    for node in checks:
        checking.node_copy(node, inputs.__getitem__)
    checking.output(None)
    return fx.GraphModule(gm, body), fx.GraphModule(gm, checking)


def run_checks_after(compiled, checks: fx.GraphModule, num_outputs: int):
    """A boxed function: `compiled` (boxed, returning the values the checks read after its
    `num_outputs` outputs), then the checks."""
    from ..backends.codegen import python_function
    run_checks = python_function(checks)

    def run(args):
        outs = compiled(args)
        run_checks(list(outs[num_outputs:]))
        return outs[:num_outputs]

    run._boxed_call = True
    return run


def refuse_effectful_op(error: AssertionError) -> NotImplementedError:
    """PyTorch's "no token" assertion, for an op with an effect other than an error check."""
    op = str(error).rsplit(" ", 1)[-1]
    return NotImplementedError(
        f"aotgrad: {op} is an op with ordered side effects (a print, a torchbind call, a custom "
        "op registered as effectful); aotgrad supports error checks such as linalg's, but not "
        "effects that need PyTorch's effect tokens. Call it outside the compiled function.")
