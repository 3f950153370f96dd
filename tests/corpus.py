"""The differential corpus: small functions and modules, each a `Case` with fresh inputs.

Every case states one behaviour of eager PyTorch that a compiled call must reproduce
(mutations, aliasing, autograd facts, errors). Cases register themselves in `CASES`, in the
order they appear. Tag "inductor" marks the subset also run on the slow Inductor front doors.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from harness import Case, Inputs, call_index

CASES: list[Case] = []
INDUCTOR = "inductor"


# ---- input helpers -----------------------------------------------------------------------

def leaf(*shape, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype, requires_grad=True)


def nonleaf(*shape) -> torch.Tensor:
    """Requires grad but is not a leaf: what a layer inside a model receives."""
    return leaf(*shape) * 1


def const(*shape, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype)


def inference(*shape) -> torch.Tensor:
    """An inference tensor (made under inference_mode): no version counter, no autograd."""
    with torch.inference_mode():
        return torch.randn(*shape)


def call(*args, **kwargs) -> Inputs:
    return args, kwargs


def case(inputs: Callable[[], Inputs], tags=(), context="grad"):
    """Register the decorated function as a case named after it."""
    def register(fn):
        CASES.append(Case(fn.__name__, inputs, fn=fn, tags=frozenset(tags), context=context))
        return fn
    return register


def factory_case(name: str, factory: Callable[[], Callable], inputs: Callable[[], Inputs],
                 tags=(), context="grad", before_call=None) -> None:
    """A callable built by `factory` (a module, a closure), one for eager, one compiled."""
    CASES.append(Case(name, inputs, factory=factory, tags=frozenset(tags), context=context,
                      before_call=before_call))


def module_case(name: str, factory: Callable[[], nn.Module], inputs: Callable[[], Inputs],
                tags=(INDUCTOR,), **options) -> None:
    """Every module case runs on the Inductor doors too."""
    factory_case(name, factory, inputs, tags, **options)


# ---- plain functions ---------------------------------------------------------------------

@case(lambda: call(leaf(4)), tags={"backward_twice", INDUCTOR})
def sin_sum_backward_twice(x):
    # Eager saves x for SinBackward: a second backward finds it freed and raises.
    return x.sin().sum()


@case(lambda: call(leaf(4)), tags={"backward_twice"})
def saves_nothing_backward_twice(x):
    # Eager saves no tensor: a second backward works and accumulates again.
    return (x * 2).sum()


@case(lambda: call(leaf(3, 4), leaf(4, 5)))
def matmul_relu(a, b):
    return (a @ b).relu()


@case(lambda: call(leaf(4), const(4)))
def mixed_requires_grad(x, y):
    return x * y + y.exp()


@case(lambda: call(const(4), const(4)))
def no_input_requires_grad(x, y):
    return x.sin() + y


@case(lambda: call(leaf(3, 5)))
def softmax_logsoftmax(x):
    return x.softmax(-1), x.log_softmax(0)


@case(lambda: call(leaf(3, 4, dtype=torch.float64)))
def float64_reductions(x):
    return x.mean(0, keepdim=True), x.var(1), x.norm()


@case(lambda: call(leaf(3, 4)))
def dtype_conversions(x):
    return x.double() * 2, x.to(torch.bfloat16).float(), (x > 0).float() * x


@case(lambda: call(leaf(6), leaf(6)))
def where_masked_fill(x, y):
    return torch.where(x > 0, x, y), y.masked_fill(y < 0, 0.5)


@case(lambda: call(leaf(2, 3), leaf(2, 3)))
def cat_stack(x, y):
    return torch.cat([x, y], 0), torch.stack([x, y * 2], -1)


@case(lambda: call(leaf(0, 3)))
def empty_tensor(x):
    return x * 2, x.sum(0)


@case(lambda: call(leaf(()), leaf(3)))
def zero_dim_tensor(s, x):
    return s * x, s.exp()


@case(lambda: call(leaf(5, 4), torch.tensor([0, 2, 2, 4])))
def index_select_long_input(x, idx):
    return x[idx] * 2, x.index_select(1, idx[:2])


@case(lambda: call(leaf(5)), tags={INDUCTOR})
def norm_ord_zero(x):
    # Its backward gives x no gradient (undefined, not zeros), yet the output requires grad.
    return torch.linalg.norm(x, ord=0), x.norm(p=0) * 2


@case(lambda: call(leaf(5), const(5)))
def norm_ord_zero_of_mixed_inputs(x, y):
    return torch.linalg.vector_norm(x * y, ord=0)


@case(lambda: call(leaf(4, 3), leaf(4, 3)))
def intermediate_inplace_ops(x, y):
    z = x * y
    z.add_(1).mul_(y)
    z.relu_()
    return z


@case(lambda: call(leaf(4, 3)))
def intermediate_view_mutation(x):
    y = x.clone()
    y[0].mul_(2)
    y[:, 1].zero_()
    return y * x


@case(lambda: call(leaf(4)))
def no_grad_block_inside(x):
    with torch.no_grad():
        y = x * 2
    return x * y


@case(lambda: call(leaf(4)), context="no_grad")
def enable_grad_inside_no_grad(x):
    with torch.enable_grad():
        y = x * 2
    return y, x * 3


@case(lambda: call(leaf(4)), context="inference_mode")
def enable_grad_inside_inference_mode(x):
    with torch.enable_grad():  # inference mode records no autograd history all the same
        y = x * 2
    return y, x * 3


@case(lambda: call(leaf(3, 4)))
def view_under_inference_mode_inside(x):
    with torch.inference_mode():
        v = x[0]  # no grad_fn: a backward through it leaves x.grad None
    return v, x[1] * 2


@case(lambda: call(leaf(3, 4)))
def computed_under_inference_mode_inside(x):
    with torch.inference_mode():
        y = x.sum(0) * 2  # an inference tensor: eager refuses it in autograd, in-place
    return y, x * 3


@case(lambda: call(leaf(3, 4)), context="no_grad")
def view_under_enable_grad_inside_no_grad(x):
    with torch.enable_grad():
        v = x[0]  # a differentiable view (SelectBackward), its gradient reaching x
    return v, x[1]


@case(lambda: call(leaf(4, 4), leaf(4, 4)))
def autocast_inside(x, y):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z = x @ y
    return z, z.float().sum()


@case(lambda: call(leaf(8, 8)))
def dropout_train_random(x):
    # Seeded identically before both calls: eager and compiled draw the same mask.
    return F.dropout(x, 0.5, training=True)


@case(lambda: call(leaf(3, 4)))
def detach_output(x):
    return x.detach(), x * 2


@case(lambda: call(const(3, 4)), context="no_grad")
def detach_output_no_grad_call(x):
    # A new tensor object sharing x's storage, not x itself.
    return x.detach()


@case(lambda: call(const(3, 4)), tags={INDUCTOR})
def detach_of_written_input(x):
    x.add_(1)
    return x.detach()  # over x's memory, as in eager, not the graph's new value


@case(lambda: call(leaf(3, 4)))
def detach_of_leaf_written_under_no_grad(x):
    with torch.no_grad():  # a weight initialized in place, then handed out detached
        x.mul_(0.5)
    return x.detach(), x * 2


@case(lambda: call(inference(4, 3), const(3)), context="inference_mode")
def inference_tensor_written_then_sliced(cache, k):
    # A cache written in place: views of an inference tensor are no views, yet alias it.
    cache[1].copy_(k)
    return cache[:2], cache[3]


@case(lambda: call(leaf(3, 4)), tags={INDUCTOR})
def view_of_detached_input(x):
    # The views' _base is the detached tensor, an intermediate, not x (which Inductor
    # returns for it: the views then required grad).
    return x.detach()[0], x.detach().t()


@case(lambda: call(leaf(3)))
def fresh_leaf_created_inside(x):
    w = torch.ones(3).requires_grad_()
    return w, x * w


@case(lambda: call(leaf(3)), tags={INDUCTOR})
def fresh_leaf_returned(x):
    w = torch.ones(3, requires_grad=True)
    return w, x * 2


@case(lambda: call(const(2, 3)), tags={INDUCTOR})
def requires_grad_on_output_view_of_input(x):
    out = x.view(-1)
    out.requires_grad_(True)
    return out


@case(lambda: call(const(2, 3), leaf(3)))
def requires_grad_on_output_view_of_intermediate(x, w):
    v = (x * 2).view(-1)
    v.requires_grad_()
    y = x.detach() * 3
    y.requires_grad_()
    return v, y, x[0] * w


@case(lambda: call(const(2, 3)))
def value_of_view_made_leaf_inside(x):
    out = x[0]
    out.requires_grad_(True)
    return out * 2


@case(lambda: call(leaf(4)), tags={"double_backward"})
def double_backward_gradient_penalty(x):
    return x.sin() * x


class StraightThroughRound(torch.autograd.Function):
    """Rounds forward, passes the gradient through unchanged: not round's derivative."""

    @staticmethod
    def forward(ctx, x):
        return x.round()

    @staticmethod
    def backward(ctx, grad):
        return grad


@case(lambda: call(leaf(4)))
def custom_autograd_function(x):
    return StraightThroughRound.apply(x * 3) * x


class HalfGradIdentity(torch.autograd.Function):
    """Returns its input as is (eager makes the output a view of it, whose gradient is
    this Function's backward, not the view's)."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad * 0.5


class HalfGradTranspose(torch.autograd.Function):
    """Returns a view of its input made in forward: a view with the Function's backward."""

    @staticmethod
    def forward(ctx, x):
        return x.t()

    @staticmethod
    def backward(ctx, grad):
        return grad.t() * 0.5


@case(lambda: call(leaf(4)), tags={INDUCTOR})
def custom_function_returns_input(x):
    return HalfGradIdentity.apply(x)


@case(lambda: call(leaf(3, 2)))
def custom_function_returns_view_of_input(x):
    return HalfGradTranspose.apply(x)


class ViewAndDouble(torch.autograd.Function):
    """Two outputs, the first a view of the input: eager marks it as one of the Function's
    outputs (its gradient goes through this backward), not as a view to rebuild."""

    @staticmethod
    def forward(ctx, x):
        return x.view(2, 2), x * 2

    @staticmethod
    def backward(ctx, g_view, g_double):
        return g_view.reshape(4) * 3 + g_double * 2


@case(lambda: call(leaf(4)))  # Inductor: tests/test_semantics.py (the output is no view)
def custom_function_outputs_a_view_of_its_input_among_others(x):
    return ViewAndDouble.apply(x)


@case(lambda: call(leaf(4)))
def custom_function_outputs_a_view_of_an_intermediate_among_others(x):
    return ViewAndDouble.apply(x * 1)


@case(lambda: call(leaf(4)))
def custom_function_returns_view_of_intermediate(x):
    y = x * 2
    return HalfGradIdentity.apply(y), y


@case(lambda: call(leaf(4)))
def view_of_custom_function_output(x):
    # A view made outside the Function of the Function's view: its gradient still goes
    # through the Function's backward.
    return HalfGradIdentity.apply(x)[1:]


class ExpSavingItsResult(torch.autograd.Function):
    """exp with its own backward, which reads the output it saved: eager's backward raises
    where the caller changed that output in place after the call (tests/test_semantics.py,
    tests/torch_compiled_autograd_cases.py)."""

    @staticmethod
    def forward(ctx, x):
        y = x.exp()
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * y


class Square(torch.autograd.Function):
    """x * x with its own backward, which reads the input it saved: a Function whose
    backward a double backward must differentiate (tests/test_semantics.py,
    tests/test_compiled_autograd.py)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g


class ZeroSavedInBackward(torch.autograd.Function):
    """Saves a tensor and zeroes it in backward: eager changes the caller's tensor then."""

    @staticmethod
    def forward(ctx, x, buf):
        ctx.save_for_backward(buf)
        return x * buf

    @staticmethod
    def backward(ctx, grad):
        buf, = ctx.saved_tensors
        grad_x = grad * buf
        buf.zero_()
        return grad_x, None


@case(lambda: call(leaf(4), const(4)), tags={INDUCTOR})
def custom_function_mutates_input_in_backward(x, buf):
    return ZeroSavedInBackward.apply(x, buf).sum()


@case(lambda: call(leaf(4)), tags={"double_backward"})
def double_backward_custom_function(x):
    # The replay applies the Function and runs its backward with create_graph=True (refused
    # through Dynamo, which traces that backward under no_grad).
    return StraightThroughRound.apply(x * 3) * x


@case(lambda: call(leaf(5)), tags={"double_backward"})
def double_backward_detach_and_no_grad(x):
    # detach, .data and no_grad regions cut second-order paths exactly where eager's do.
    with torch.no_grad():
        m = x.sum()
    y = x * 2
    with torch.no_grad():
        y.add_(1)  # in place on a tensor with history, not recorded
    return x * x.detach() * m + y.pow(2) + x * x.data + x.exp()


@case(lambda: call(leaf(4)))
def complex_intermediate(x):
    z = x * (1 + 2j)
    return (z * z).abs(), torch.view_as_real(z).sum(-1)


@case(lambda: call(leaf(3, 4), leaf(4, 4)), context="autocast_bf16")
def called_under_autocast(x, w):
    y = x @ w
    return y, y.float().softmax(-1)


def _closure_over_tensor():
    scale = torch.randn(3)
    return lambda x: x * scale


def _closure_over_grad_tensor():
    weight = torch.randn(3, requires_grad=True)
    return lambda x: (x * weight).sum()


factory_case("closure_over_tensor", _closure_over_tensor, lambda: call(leaf(3)))
factory_case("closure_over_grad_tensor", _closure_over_grad_tensor, lambda: call(const(3)))


# ---- integer, bool and constant outputs --------------------------------------------------

@case(lambda: call(leaf(3, 5)))
def argmax_and_sum(x):
    return x.argmax(), x.argmax(1), x.sum()


@case(lambda: call(leaf(3, 5)))
def max_dim_values_indices(x):
    values, indices = x.max(dim=1)
    return values, indices


@case(lambda: call(leaf(6)))
def topk_sort(x):
    top = x.topk(3)
    return top.values, top.indices, x.sort(descending=True)


@case(lambda: call(leaf(5)))
def bool_output(x):
    return x > 0, (x > 0).any(), x.abs()


@case(lambda: call(leaf(3)))
def output_not_depending_on_grad_inputs(x):
    return torch.arange(4), torch.ones(2) * 3, x.detach().sum()


@case(lambda: call(leaf(3), const(3)))
def output_only_from_non_grad_input(x, y):
    return y * 2


@case(lambda: call(5))
def no_tensor_inputs(n):
    return torch.arange(n).float() * 2


@case(lambda: call(leaf(3, 4)))
def shape_int_output(x):
    return x * 2, x.shape[0], x.size(), x.dim()


@case(lambda: call(leaf(4)))
def item_float_output(x):
    return x * 2, x.sum().item()


@case(lambda: call(leaf(6)))
def data_dependent_shape(x):
    return x[x > 0] * 2


# ---- non-tensor inputs and pytrees -------------------------------------------------------

@case(lambda: call(leaf(4), 3, 0.5, True, None, "sum"))
def non_tensor_inputs(x, n, scale, flag, nothing, mode):
    y = x * scale + n
    if flag and nothing is None:
        y = y.relu()
    return y.sum() if mode == "sum" else y


@case(lambda: call(leaf(4), 2, 0.25, False, None, "mean"))
def non_tensor_inputs_other_branch(x, n, scale, flag, nothing, mode):
    y = x * scale + n
    if flag:
        y = y.relu()
    return y.mean() if mode == "mean" else y


@case(lambda: call(leaf(3)))
def non_tensor_outputs(x):
    return x * 2, 7, None, "done", 1.5, True


@case(lambda: call(leaf(3)))
def tuple_and_dict_outputs(x):
    return {"double": x * 2, "meta": (3, None), "pair": (x.sin(), x.cos())}


@case(lambda: call({"a": leaf(3), "b": [leaf(3), (const(3), 4)]}, (leaf(2),)))
def nested_pytree_inputs(d, t):
    c, k = d["b"][1]
    return {"out": [d["a"] * d["b"][0] + c * k, t[0].exp()], "n": k}


@case(lambda: call(leaf(3), y=leaf(3), scale=2.0))
def kwargs_tensors(x, *, y, scale=1.0):
    return x * y * scale


@case(lambda: call(leaf(3), extra={"w": leaf(3), "b": const(3)}))
def kwargs_nested(x, extra=None):
    return (x * extra["w"] + extra["b"],)


@case(lambda: call(leaf(3)))
def returns_empty_containers(x):
    return (), [], {}, x + 1


@case(lambda: call(nonleaf(3, 4)), tags={INDUCTOR, "first_output_loss"})
def shape_output_of_mutated_input(x):
    # The mutated input's new value gets no gradient: a zero one of its size, symbolic
    # with dynamic shapes, is made at the backward.
    x.mul_(2)
    return x.shape, x * 3


@case(lambda: call(leaf(3, 4)), tags={INDUCTOR, "first_output_loss"})
def output_unused_by_loss(x):
    return x.sin(), x.cos().sum(0), x.shape


@case(lambda: call(leaf(3, 4), torch.Size([4, 3])))
def size_input(x, shape):
    return x.reshape(shape) * shape.numel()


@case(lambda: call(leaf(3), 2 + call_index()))
def int_input_changes_on_second_call(x, n):
    return x * n, n * 2


@case(lambda: call(leaf(3 + call_index(), 2)))
def shape_changes_on_second_call(x):
    return x.sin() * 2


# ---- outputs aliasing inputs -------------------------------------------------------------

@case(lambda: call(leaf(3)))
def returns_input_leaf(x):
    return x


@case(lambda: call(nonleaf(3)))
def returns_input_nonleaf(x):
    return x


@case(lambda: call(const(3)))
def returns_input_no_grad(x):
    return x


@case(lambda: call(leaf(3)))
def returns_input_and_result(x):
    return x, x * 2


@case(lambda: call(leaf(3)))
def returns_input_twice(x):
    return x, x


@case(lambda: call(leaf(3, 4)))
def identity_ops_return_input(x):
    # On a contiguous float32 tensor these return x itself in eager.
    return x.contiguous(), x.to(torch.float32), x.float(), x.type_as(x)


@case(lambda: call(leaf(3, 4)), tags={INDUCTOR})
def view_of_input(x):
    return x.view(-1), x.t(), x[1:]


@case(lambda: call(nonleaf(3, 4)))
def view_of_nonleaf_input(x):
    return x.transpose(0, 1)[0], x.sum()


@case(lambda: call(const(3, 4)))
def view_of_input_no_grad(x):
    return x.view(4, 3), x * 2


@case(lambda: call(leaf(1, 4)))
def expand_of_input(x):
    return x.expand(3, 4), x.unsqueeze(0).expand(2, 1, 4)


@case(lambda: call(leaf(4, 4)))
def diagonal_of_input(x):
    return x.diagonal(), x.diagonal(1)


@case(lambda: call(leaf(3, 4)))
def unbind_input(x):
    return x.unbind(0)


@case(lambda: call(const(3, 4)))
def dtype_view_of_input(x):
    return x.view(torch.int32)


@case(lambda: call(leaf(2, 3)))
def view_chain_of_input(x):
    return x.t().unsqueeze(0)[:, 1:].squeeze(0)


@case(lambda: call(const(3, 4)))
def view_of_input_then_input_mutated(x):
    row = x[0]
    x.add_(1)
    return row


# ---- views of intermediates and of each other --------------------------------------------

@case(lambda: call(leaf(3, 4)))
def view_of_intermediate(x):
    return (x * 2).view(-1)


@case(lambda: call(leaf(3, 4)))
def two_views_of_one_intermediate(x):
    y = x * 2
    return y[0], y[1]


@case(lambda: call(leaf(3, 4)), tags={INDUCTOR})
def output_and_its_view(x):
    y = x * 2
    return y, y.view(-1)


@case(lambda: call(leaf(3, 4)))
def view_before_its_base(x):
    y = x.exp()
    return y.t(), y


@case(lambda: call(leaf(6)))
def split_intermediate(x):
    return (x + 1).split(2)


@case(lambda: call(leaf(3)))
def same_output_twice(x):
    y = x * 2
    return y, y


@case(lambda: call(leaf(3, 4)))
def view_of_intermediate_and_input(x):
    return x[0], (x + 1)[1], x


@case(lambda: call(leaf(3, 4)))
def intermediate_view_then_mutated(x):
    y = x * 2
    v = y[0]
    y.add_(1)
    return v, y.sum()


# ---- duplicated and aliased inputs -------------------------------------------------------

def _same_twice(make):
    def inputs():
        t = make()
        return (t, t), {}
    return inputs


@case(_same_twice(lambda: leaf(3)))
def duplicated_input(a, b):
    return a * b + b


@case(_same_twice(lambda: leaf(3)))
def duplicated_input_returned(a, b):
    return a, b * 2


@case(_same_twice(lambda: const(3)))
def duplicated_input_mutated(a, b):
    a.add_(1)
    return b * 2


def _base_and_its_row():
    base = const(3, 4)
    return (base, base[0]), {}


@case(_base_and_its_row)
def aliased_inputs_one_mutated(base, row):
    row.mul_(2)
    return base.sum(0)


def _base_and_its_row_twice():
    base = const(3, 4)
    return (base, base[0], base[0]), {}


@case(_base_and_its_row_twice)
def aliased_inputs_no_mutation(base, row, same_row):
    return row * 2, base.t(), same_row


def _aliased_on_second_call():
    if call_index() == 0:
        return (const(3), const(3)), {}
    shared = const(1, 3)
    return (shared[0], shared[0]), {}  # two view objects, one memory, same metadata


@case(_aliased_on_second_call)
def inputs_alias_only_on_second_call(a, b):
    a.add_(1)
    return b * 2


# ---- input mutations ---------------------------------------------------------------------

@case(lambda: call(const(3)), tags={INDUCTOR})
def mutate_input_no_grad(x):
    x.add_(1)
    return x * 2


@case(lambda: call(const(3)))
def mutate_input_returns_none(x):
    x.mul_(3)


@case(lambda: call(const(3)), tags={INDUCTOR})
def requires_grad_on_input(x):
    x.requires_grad_()
    return x * 2


@case(lambda: call(const(3), leaf(3)))
def requires_grad_on_input_after_use(x, w):
    # y is computed before: it is a constant to x's gradient (w * y, not 2 * w * y).
    y = x * w
    x.requires_grad_()
    return y, y * x, x


@case(lambda: call(const(3)), context="no_grad")
def requires_grad_on_input_under_no_grad(x):
    x.requires_grad_()
    return x * 2


@case(lambda: call(leaf(3)))
def requires_grad_false_on_input(x):
    y = x * 2
    x.requires_grad_(False)
    return y, x * 3


@case(lambda: call(nonleaf(3)), tags={INDUCTOR})
def mutate_nonleaf_input(x):
    x.mul_(2)
    return x.sin()


@case(lambda: call(nonleaf(3)))
def mutate_nonleaf_input_return_it(x):
    x.mul_(2)
    return x


@case(lambda: call(nonleaf(3), leaf(3)), tags={INDUCTOR})  # Inductor drops the input's clone
def mutate_nonleaf_input_with_grad_value(x, w):
    x.mul_(w)
    return x.sum()


@case(lambda: call(const(3), leaf(3)))
def mutate_no_grad_input_by_grad_value(x, w):
    x.mul_(w)
    return x.sum()


@case(lambda: call(const(3), leaf(3)))
def mutate_no_grad_input_by_grad_value_return_it(x, w):
    x.mul_(w)
    return x


@case(lambda: call(const(3), leaf(3)))
def copy_grad_value_into_no_grad_input(x, w):
    x.copy_(w * 2)


@case(lambda: call(const(3)))
def int_intermediate_mutated(x):
    n = torch.zeros(3, dtype=torch.long)
    n.add_(2)
    return x + n


@case(lambda: call(torch.zeros(2, dtype=torch.long), leaf(2)))
def mutate_long_counter(count, x):
    count.add_(1)
    return x * count


@case(lambda: call(const(3)))
def mutate_then_use_old_value(x):
    y = x * 2
    x.add_(1)
    return y + x


@case(lambda: call(nonleaf(3)))
def mutate_saved_nonleaf_backward_raises(x):
    # x is saved by sin, then changed: eager's call works, its backward raises.
    y = x.sin()
    x.mul_(3)
    return y + x


@case(lambda: call(const(4), const(4)))
def mutate_two_inputs(x, y):
    x.add_(y)
    y.mul_(2)
    return x + y


@case(lambda: call(const(4)))
def mutate_with_several_inplace_ops(x):
    x.add_(1).mul_(2).clamp_(max=3.0)
    x.zero_()


@case(lambda: call(const(4, 4)))
def random_inplace_on_input(x):
    x.uniform_()
    return x + torch.rand(4)


@case(lambda: call(const(3, 4)))
def setitem_on_input(x):
    x[0] = 5.0
    x[:, 1] = torch.arange(3.0)
    return x.sum()


@case(lambda: call(const(6), leaf(2)))
def index_put_grad_value(x, v):
    x[torch.tensor([1, 3])] = v
    return x * 2


@case(lambda: call(const(3), y=const(3)))
def mutate_kwarg_input(x, *, y):
    y.sub_(x)
    return x + 1


@case(lambda: call({"state": const(3), "step": leaf(3)}))
def mutate_input_in_dict(d):
    d["state"].add_(d["step"].detach())
    return d["state"] * d["step"]


@case(lambda: call(const(3)))
def mutate_input_return_view(x):
    x.add_(1)
    return x.view(-1)


@case(lambda: call(nonleaf(3)))
def mutate_nonleaf_input_return_view(x):
    x.mul_(2)
    return x[1:]


# ---- mutations hidden from autograd ------------------------------------------------------

@case(lambda: call(leaf(3)))
def mutate_leaf_under_no_grad(x):
    with torch.no_grad():
        x.add_(1)
    return x * 2


@case(lambda: call(const(3)))
def mutate_no_grad_input_under_no_grad(x):
    with torch.no_grad():
        x.mul_(2)
    return x + 1


@case(lambda: call(nonleaf(3)))
def mutate_nonleaf_under_no_grad(x):
    with torch.no_grad():
        x.mul_(2)
    return x.sin()


@case(lambda: call(leaf(3)))
def mutate_leaf_through_detach(x):
    x.detach().mul_(2)
    return x * 3


@case(lambda: call(leaf(3, 4), const(3, 4)))
def sgd_step_under_no_grad(w, x):
    g = w * 2  # a value that requires grad, as a gradient would with create_graph
    with torch.no_grad():
        w.add_(-0.1 * g)
    return (w * x).sum()


def _running_stats():
    return call(leaf(6, 3, 5), const(3), const(3).abs() + 0.5, leaf(3), leaf(3))


@case(_running_stats)
def functional_batch_norm_updates_running_stats(x, mean, var, w, b):
    """The kernel writes `mean` and `var` although its schema does not say so: no in-place op
    in sight, yet the function mutates its inputs."""
    return F.batch_norm(x, mean, var, w, b, training=True, momentum=0.3).tanh()


@case(lambda: call(nonleaf(3, 4), leaf(4)))
def mutate_input_after_saving_its_view(x, w):
    # mul saves the view x[0]; the mutation of x changes it: eager's backward raises.
    z = (x[0] * w).sum()
    x.mul_(2)
    return z


@case(lambda: call(leaf(3)))
def mutate_leaf_through_data(x):
    x.data.add_(1)
    return x.sin()


@case(lambda: call(const(3)))
def mutate_no_grad_input_through_data(x):
    x.data.mul_(4)
    return x * 2


# ---- mutation through a view of an input -------------------------------------------------

@case(lambda: call(const(3, 4)))
def mutate_view_of_input(x):
    x[0].add_(1)
    return x * 2


@case(lambda: call(nonleaf(3, 4)))
def mutate_view_of_nonleaf_input(x):
    x[0].mul_(2)
    return x.sum()


@case(lambda: call(const(3, 4)))
def mutate_view_of_input_return_view(x):
    row = x[1]
    row.mul_(3)
    return row


@case(lambda: call(const(3, 4), leaf(4)))
def mutate_view_of_input_by_grad_value(x, w):
    x[2].copy_(w)
    return x.sum(0)


def _view_of_nonleaf_base():
    base = leaf(3, 4) * 1
    return (base[1],), {}


@case(_view_of_nonleaf_base)
def input_is_view_mutated(x):
    # Eager writes through to the base the caller still holds.
    x.mul_(2)
    return x.sum()


def _transposed_const():
    return (const(4, 3).t(),), {}


@case(_transposed_const)
def noncontiguous_input(x):
    return x * 2, x.sum(0)


@case(_transposed_const)
def noncontiguous_input_mutated(x):
    x.add_(1)
    return x.contiguous()


# ---- metadata and storage mutations ------------------------------------------------------

@case(lambda: call(const(3, 4)))
def t_on_input(x):
    x.t_()
    return x * 2


@case(lambda: call(nonleaf(3, 4)))
def transpose_on_nonleaf_input(x):
    x.transpose_(0, 1)
    return x.sin()


@case(lambda: call(const(1, 3)))
def squeeze_on_input(x):
    x.squeeze_(0)
    return x + 1


@case(lambda: call(nonleaf(3)))
def unsqueeze_on_nonleaf_input(x):
    x.unsqueeze_(1)
    return x * x.t()


@case(lambda: call(const(6)))
def as_strided_on_input(x):
    x.as_strided_((2, 2), (1, 2))
    return x.sum()


@case(lambda: call(const(2, 3)))
def resize_on_input(x):
    x.resize_(3, 2)
    return x * 2


@case(lambda: call(const(2, 3)))
def resize_grows_input(x):
    x.resize_(4, 3)
    x.fill_(2.0)
    return x * 2


@case(lambda: call(const(2, 3)))
def resize_grows_input_then_view_written(x):
    x.resize_(3, 3)
    x[2] = 1.0
    return x.sum()


@case(lambda: call(const(2, 3), const(6)))
def set_on_input(x, source):
    x.set_(source)
    return x + 1


@case(lambda: call(const(2, 3)))
def metadata_and_data_mutation(x):
    x.t_()
    x.mul_(2)
    return x[0]


@case(lambda: call(const(3, 3)), tags={INDUCTOR})
def t_then_view_of_input_mutated(x):
    # Square: an in-graph copy into the old layout would fit, and land transposed.
    x.t_()
    x[0].mul_(2)
    return x.view(x.shape)


# ---- errors eager raises -----------------------------------------------------------------

@case(lambda: call(leaf(3)))
def leaf_requires_grad_mutated_raises(x):
    x.add_(1)
    return x


@case(lambda: call(leaf(2, 3)))
def leaf_requires_grad_t__raises(x):
    x.t_()
    return x


@case(lambda: call(leaf(3, 4)))
def view_of_leaf_mutated_raises(x):
    x[0].add_(1)
    return x


def _view_of_leaf():
    return (leaf(3, 4)[0],), {}


@case(_view_of_leaf)
def input_view_of_leaf_mutated_raises(x):
    x.add_(1)
    return x.sum()


@case(lambda: call(leaf(3, 4), leaf(5, 2)))
def shape_mismatch_raises(a, b):
    return a @ b


@case(lambda: call(leaf(3), True))
def python_exception_raises(x, fail):
    if fail:
        raise ValueError("requested failure")
    return x


# ---- the inference path: calls under no_grad / inference_mode ----------------------------

@case(lambda: call(leaf(3, 4), leaf(4, 2)), context="no_grad", tags={INDUCTOR})
def no_grad_call(x, w):
    return (x @ w).tanh()


@case(lambda: call(const(3)), context="no_grad")
def no_grad_call_mutates_input(x):
    x.add_(1)
    return x * 2


@case(lambda: call(leaf(3)), context="no_grad")
def no_grad_call_mutates_leaf(x):
    x.mul_(2)
    return x + 1


@case(lambda: call(leaf(3, 4)), context="no_grad")
def no_grad_call_returns_views(x):
    return x[0], x.t(), x


@case(lambda: call(const(3, 4)), context="no_grad")
def no_grad_call_metadata_mutation(x):
    x.t_()
    return x + 1


@case(lambda: call(const(3, 3)), context="no_grad")
def no_grad_call_t_then_view_of_input_mutated(x):
    x.t_()
    x[0].mul_(2)
    return x.view(x.shape)


@case(lambda: call(leaf(4)), tags={INDUCTOR})
def leaf_mutated_under_no_grad_output_too(x):
    # No output requires grad: the inference graph writes a leaf that requires grad.
    with torch.no_grad():
        x.mul_(2)
        return x + 3


@case(lambda: call(leaf(3, 4)), context="inference_mode")
def inference_mode_call(x):
    return x.sin() * 2, x.argmax()


@case(lambda: call(leaf(3, 4)), context="inference_mode")
def inference_mode_call_views(x):
    return x[0], x, x.t()  # views of a normal tensor: normal, and requiring grad as x does


@case(lambda: call(leaf(3, 4)), context="inference_mode")
def inference_mode_call_composite_views(x):
    # Ops that eager decomposes into views (inference mode skips autograd, where they would)
    return x.view_as(x), x.reshape(12), x.flatten(), x.T, x.movedim(0, 1), x[0].expand_as(x)


@case(lambda: call(const(3, 4)), context="inference_mode")
def inference_mode_call_writes_through_view(x):
    x[0].add_(1)
    return x[1], x.view_as(x)


@case(lambda: call(leaf(3), const(4)), context="inference_mode")
def inference_mode_call_writes_inputs(x, y):
    x.add_(1)  # both version counters move
    y.mul_(2)
    return y + x.sum()


@case(lambda: call(inference(3, 4), leaf(4, 2)))
def inference_tensor_saved_for_backward(x, w):
    return x @ w  # eager refuses to save x for w's gradient


@case(lambda: call(inference(3, 4), leaf(4)))
def inference_tensor_not_saved(x, w):
    return x + w, x[0], x.t(), x  # views of an inference tensor are inference tensors


@case(lambda: call(inference(3)))
def inference_tensor_written_outside_inference_mode(x):
    return x.add_(1)  # eager refuses


@case(lambda: call(inference(4), const(4)), context="inference_mode")
def inference_tensor_written_in_inference_mode(x, y):
    x.add_(y)
    return x + y


# ---- modules -----------------------------------------------------------------------------

class MLP(nn.Module):
    def __init__(self, d_in=6, d_hidden=8, d_out=3, inplace=False, p=0.0):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, d_hidden), nn.ReLU(inplace=inplace),
                                 nn.Dropout(p), nn.Linear(d_hidden, d_out))

    def forward(self, x):
        return self.net(x)


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4),
                                      nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Linear(4 * 4 * 4, 5)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


class Conv1dGroupNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(4, 6, 3)
        self.norm = nn.GroupNorm(2, 6)

    def forward(self, x):
        return F.gelu(self.norm(self.conv(x)))


class CounterBuffer(nn.Module):
    """Counts calls in a buffer updated in place, as BatchNorm's num_batches_tracked."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))
        self.register_buffer("running", torch.zeros(3))

    def forward(self, x):
        self.calls += 1
        y = self.lin(x)
        with torch.no_grad():
            self.running.mul_(0.9).add_(y.mean(0), alpha=0.1)
        return y * self.calls


class ReassignedBuffer(nn.Module):
    """Replaces its buffer with a new tensor instead of updating it in place (the compiled
    module binds the tensor its graph returns after each call)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.register_buffer("steps", torch.zeros(()))

    def forward(self, x):
        self.steps = self.steps + 1
        return self.lin(x) + self.steps


class ClampedWeight(nn.Module):
    """Projects its parameter in place under no_grad before using it."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        with torch.no_grad():
            self.lin.weight.clamp_(-0.2, 0.2)
        return self.lin(x)


class Attention(nn.Module):
    def __init__(self, dim=8, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    """A pre-norm transformer block."""

    def __init__(self, dim=8):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class PartlyFrozen(nn.Module):
    def __init__(self):
        super().__init__()
        self.frozen = nn.Linear(4, 4).requires_grad_(False)
        self.trained = nn.Linear(4, 2)

    def forward(self, x):
        return self.trained(self.frozen(x).relu())


class TiedWeights(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.out = nn.Linear(4, 10, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, idx):
        return self.out(self.embed(idx))


class KwargsAndDict(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, *, scale=1.0, mask=None):
        y = self.lin(x) * scale
        if mask is not None:
            y = y.masked_fill(mask, 0.0)
        return {"y": y, "norm": y.norm(), "argmax": y.argmax(-1)}


class ReturnsState(nn.Module):
    """Returns a parameter and a view of a buffer: outputs that are module state."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.register_buffer("scale", torch.ones(3))

    def forward(self, x):
        return self.lin(x) * self.scale, self.lin.weight, self.scale[:2]


def _hooked_linear() -> nn.Module:
    lin = nn.Linear(4, 4)
    lin.register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
    lin.register_forward_hook(lambda mod, args, out: out.relu())
    return lin


def _tanh_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2))


def _batchnorm_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Tanh(), nn.Linear(4, 1))


def _dropout_mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 4), nn.Dropout(0.5), nn.Tanh(), nn.Linear(4, 1))


def _eval_from_second_call(module: nn.Module, call: int) -> None:
    if call == 1:
        module.eval()


def _freeze_weight_from_second_call(module: nn.Module, call: int) -> None:
    if call == 1:
        module.weight.requires_grad_(False)


def _sgd_step_before_second_call(module: nn.Module, call: int) -> None:
    if call == 1:
        with torch.no_grad():
            for p in module.parameters():
                p.sub_(0.1 * p.grad)


class ParamMutatedWithGrad(nn.Module):
    """Changes its parameter in place outside no_grad: eager refuses (a leaf needing grad)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        self.lin.bias.add_(1)
        return self.lin(x)


class BufferTakesGradValue(nn.Module):
    """Copies a value that requires grad into a buffer: the buffer joins the graph."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.register_buffer("last_mean", torch.zeros(3))

    def forward(self, x):
        y = self.lin(x)
        self.last_mean.copy_(y.mean(0))
        return y * 2


def _eval(module: nn.Module) -> nn.Module:
    return module.eval()


def _tokens():
    return call(torch.randint(0, 10, (2, 5)))


module_case("linear", lambda: nn.Linear(4, 3), lambda: call(nonleaf(2, 4)))
module_case("mlp_backward_twice", MLP, lambda: call(const(5, 6)),
            tags=(INDUCTOR, "backward_twice"))
module_case("mlp_inplace_relu", lambda: MLP(inplace=True), lambda: call(leaf(5, 6)))
module_case("inplace_relu_mutates_input", lambda: nn.ReLU(inplace=True),
            lambda: call(const(3, 4)))
module_case("inplace_relu_mutates_nonleaf_input", lambda: nn.ReLU(inplace=True),
            lambda: call(nonleaf(3, 4)))
module_case("mlp_eval_dropout", lambda: _eval(MLP(p=0.5)), lambda: call(leaf(5, 6)))
module_case("conv2d_bn_pool_train", ConvNet, lambda: call(const(2, 3, 8, 8)))
module_case("conv2d_bn_pool_eval", lambda: _eval(ConvNet()), lambda: call(leaf(2, 3, 8, 8)))
module_case("conv1d_groupnorm_gelu", Conv1dGroupNorm, lambda: call(leaf(2, 4, 7)))
module_case("layernorm", lambda: nn.LayerNorm(5), lambda: call(nonleaf(3, 5)))
module_case("embedding", lambda: nn.Embedding(10, 4), _tokens)
module_case("embedding_max_norm_renorms_weight", lambda: nn.Embedding(10, 4, max_norm=1.0),
            _tokens)
module_case("batchnorm1d_train", lambda: nn.BatchNorm1d(4), lambda: call(leaf(6, 4)))
module_case("batchnorm2d_train", lambda: nn.BatchNorm2d(3), lambda: call(nonleaf(2, 3, 4, 4)))
module_case("batchnorm2d_eval", lambda: _eval(nn.BatchNorm2d(3)), lambda: call(leaf(2, 3, 4, 4)))
module_case("counter_buffer_inplace", CounterBuffer, lambda: call(leaf(2, 3)))
module_case("buffer_reassigned", ReassignedBuffer, lambda: call(leaf(2, 3)))
module_case("param_clamped_under_no_grad", ClampedWeight, lambda: call(leaf(3, 4)))
module_case("param_mutated_with_grad_raises", ParamMutatedWithGrad, lambda: call(leaf(2, 3)))
module_case("buffer_updated_with_grad_value", BufferTakesGradValue, lambda: call(leaf(2, 3)))
module_case("attention_sdpa", Attention, lambda: call(leaf(2, 5, 8)))
module_case("transformer_block", Block, lambda: call(nonleaf(2, 5, 8)))
module_case("multihead_attention", lambda: nn.MultiheadAttention(8, 2, batch_first=True),
            lambda: call(leaf(2, 4, 8), leaf(2, 4, 8), leaf(2, 4, 8)))
module_case("partly_frozen_params", PartlyFrozen, lambda: call(leaf(3, 4)))
module_case("tied_weights", TiedWeights, _tokens)
module_case("kwargs_and_dict_output", KwargsAndDict,
            lambda: call(leaf(3, 4), scale=0.5, mask=torch.rand(3, 4) > 0.5))
module_case("mlp_no_grad_call", MLP, lambda: call(leaf(5, 6)), context="no_grad")
module_case("batchnorm1d_train_no_grad_call", lambda: nn.BatchNorm1d(4),
            lambda: call(const(6, 4)), context="no_grad")
module_case("returns_parameter_and_buffer_view", ReturnsState, lambda: call(leaf(2, 3)))
module_case("forward_hooks", _hooked_linear, lambda: call(leaf(3, 4)))
module_case("double_backward_tanh_mlp", _tanh_mlp, lambda: call(leaf(3, 4)),
            tags=(INDUCTOR, "double_backward"))
# BatchNorm in training mode mutates its running statistics; the gradients do not read them.
module_case("double_backward_batchnorm_train", _batchnorm_mlp, lambda: call(leaf(6, 3)),
            tags=("double_backward",))
# The replay takes the mask the compiled forward drew.
module_case("double_backward_dropout_train", _dropout_mlp, lambda: call(leaf(6, 3)),
            tags=("double_backward",))
# Module state that changes between the two calls, as in a training loop.
module_case("batchnorm_train_then_eval", lambda: nn.BatchNorm1d(4), lambda: call(leaf(6, 4)),
            before_call=_eval_from_second_call)
module_case("weight_frozen_between_calls", lambda: nn.Linear(4, 3), lambda: call(leaf(2, 4)),
            before_call=_freeze_weight_from_second_call)
module_case("sgd_step_between_calls", _tanh_mlp, lambda: call(leaf(3, 4)),
            before_call=_sgd_step_before_second_call)

CASES_BY_NAME = {c.name: c for c in CASES}
assert len(CASES_BY_NAME) == len(CASES), "case names must be unique"
