"""Per-op knowledge, one line per entry. Passes look ops up here instead of testing names."""

import functools
from typing import Sequence

import torch

aten = torch.ops.aten

# Ops that do nothing once autograd is done: dropping them leaves the values unchanged.
NO_OP_AT_RUNTIME = frozenset({
    aten.detach.default,
})

# Ops that fill a new tensor with a constant: a gradient made by one is structurally zero.
CONSTANT_FILLS = frozenset({
    aten.zeros_like.default, aten.zeros.default, aten.new_zeros.default,
    aten.full_like.default, aten.full.default, aten.new_full.default,
})
FILLS_WITH_VALUE = frozenset({aten.full_like.default, aten.full.default, aten.new_full.default})

# Ops whose only effect is to raise when a check on their inputs fails; they return nothing.
# Traced as plain ops and kept where eager runs them, with no effect token (effects.py).
ERROR_CHECKS = frozenset({
    aten._linalg_check_errors.default,  # linalg.inv, cholesky, solve...: singular input
    aten._assert_async.default,  # torch._assert_async(tensor)
    aten._assert_async.msg,
    aten._assert_scalar.default,  # Dynamo's runtime check of a size (torch._check, nonzero)
})

# Reductions to one boolean that torch's Python code reads only to raise when it is False:
# torch.distributions' argument and sample validation (`validate_args`, on by default:
# `if not torch._is_all_true(valid): raise ValueError(...)`), `torch._check_tensor_all`.
# Reading the value would end the trace (it depends on data); the trace takes it as True
# and keeps a check that raises at run time where it is False (effects.py).
CHECKED_CONDITIONS = frozenset({aten._is_all_true.default})

# Higher-order ops (by name) whose fake-tensor rule makes symbols: they need a shape
# environment, which only Dynamo's fake tensors carry (semantics/hops.py).
HOPS_NEEDING_SHAPE_ENV = frozenset({"while_loop"})

# Higher-order ops refused by name, with what to do instead (semantics/hops.py). None now: a
# user Triton kernel's wrappers (`triton_kernel_wrapper_mutation`, refused until session 10)
# are functionalized by PyTorch's rule and traced as one op each.
REFUSED_HOPS: dict[str, str] = {}

# Ops that return a buffer of unspecified contents: two calls are two buffers, never merged.
UNINITIALIZED = frozenset({
    aten.empty.memory_format, aten.empty_like.default, aten.empty_strided.default,
    aten.new_empty.default, aten.new_empty_strided.default, aten.empty_permuted.default,
})

# Random ops (by overload packet) whose every output is drawn: values that depend on the
# inputs only through the distribution, so that a double backward's replay may take them
# from the compiled forward instead of drawing (random_values.py, which also tables the
# ops that compute from their inputs too, such as native_dropout). Other random ops are
# refused there.
DRAWN_OPS = frozenset({
    aten.rand, aten.rand_like, aten.randn, aten.randn_like, aten.randint, aten.randint_like,
    aten.randperm, aten.bernoulli, aten.bernoulli_, aten.uniform, aten.uniform_,
    aten.normal, aten.normal_, aten.exponential, aten.exponential_, aten.geometric,
    aten.geometric_, aten.cauchy, aten.cauchy_, aten.log_normal, aten.log_normal_,
    aten.random, aten.random_, aten.multinomial, aten.poisson, aten.binomial,
    aten._standard_gamma, aten._sample_dirichlet,
})

# Ops (by overload packet) that give a tensor other memory: in a graph holding one, the
# storages seen while tracing are not the ones the call will have (no saved value is then
# donated to the backward: partition.donate.mark_donated).
STORAGE_SWAPS = frozenset({aten.set_, aten.resize_, aten.resize_as_})

# Ops that resize an input's storage without a mutable schema (FSDP frees and re-allocates
# parameter memory with them): functionalization records the new size, and the runtime
# resizes the caller's storage (schema.InputInfo.storage_bytes). Absent from older torch.
STORAGE_RESIZES = frozenset(
    {torch.ops.inductor.resize_storage_bytes_.default}
    if hasattr(torch.ops.inductor, "resize_storage_bytes_") else ())

# In-place ops a functional graph may still hold: the trailing copy into a mutated input
# (inference graphs with keep_inference_input_mutations=True).
ALLOWED_INPUT_MUTATIONS = frozenset({
    aten.copy_.default,
})


# Arguments whose values an op's outputs do not read when its `training` flag is True (or
# always): batch norm in training mode normalizes with the batch's own statistics and only
# updates the running ones (some schemas do not even mark the update: native_batch_norm;
# the functional one returns them, `STATS_UPDATED_AS_OUTPUTS`).
# op -> (argument names, position of the flag or None)
_RUNNING_STATS = ("running_mean", "running_var")
UNREAD_WHEN_TRAINING = {
    aten.native_batch_norm.default: (_RUNNING_STATS, 5),
    aten._native_batch_norm_legit.default: (_RUNNING_STATS, 5),
    aten._batch_norm_with_update.default: (_RUNNING_STATS, None),
    aten.cudnn_batch_norm.default: (_RUNNING_STATS, 5),
    aten.miopen_batch_norm.default: (_RUNNING_STATS, 5),
    aten.native_batch_norm_backward.default: (_RUNNING_STATS, 7),
    aten.batch_norm_backward.default: (_RUNNING_STATS, 7),
    aten._native_batch_norm_legit_functional.default: (_RUNNING_STATS, 5),
}

# The outputs a functional batch norm returns its updated running statistics as: the only
# ones its old statistics reach (the in-place ops above update them in place instead).
STATS_UPDATED_AS_OUTPUTS = {
    aten._native_batch_norm_legit_functional.default: (3, 4),
}

# ---- rematerialization ---------------------------------------------------------------------

class Recompute:
    """How freely the partitioner may recompute an op's value in the backward."""

    FREE = "free"  # views and tuple element access: no compute, no memory
    CHEAP = "cheap"  # pointwise and cheap reductions: fuse into the backward's kernels
    NEVER = "never"  # expensive (matmul, convolution, attention), random, or effectful


# Reductions whose recomputation is a single pass over an input the backward often holds
# (normalizations and softmax are one fused reduction plus pointwise work).
# Ops that, given one tensor no larger than their result (and constants), cost a reader
# nothing to recompute but one arithmetic instruction per element: a drop-path's per-sample
# scale (`bernoulli / keep`) is read at the activation's size, and recomputed there it reads
# the mask instead of itself. Saved, it took a kernel of its own in the forward (Swin-T: 23).
SCALINGS = frozenset({
    aten.mul.Tensor, aten.mul.Scalar, aten.div.Tensor, aten.div.Scalar, aten.add.Tensor,
    aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar, aten.neg.default,
    torch.ops.prims.convert_element_type.default,
})

CHEAP_REDUCTIONS = frozenset({
    aten.sum.default, aten.sum.dim_IntList, aten.mean.default, aten.mean.dim,
    aten.amax.default, aten.amin.default, aten.var_mean.correction, aten.var.correction,
    aten.max.dim, aten.min.dim, aten.any.dim, aten.all.dim,
    aten._softmax.default, aten._safe_softmax.default, aten._log_softmax.default,
    aten.logsumexp.default,
    aten.native_layer_norm.default,
})

# Floating-point operations a matmul, convolution or attention does in the time memory moves
# one byte, by dtype: a pass over a tensor hides behind a kernel with enough arithmetic.
# (H100/H200: about 990 TFLOP/s in 16-bit, 67 TFLOP/s in float32 without TF32, 4.8 TB/s.)
KERNEL_FLOPS_PER_BYTE = {torch.bfloat16: 200, torch.float16: 200, torch.float32: 14,
                         torch.float64: 7}
TF32_FLOPS_PER_BYTE = 100  # float32 when torch.get_float32_matmul_precision() allows TF32

# A kernel launch's cost, as the bytes memory moves in its time (about 2 us at 4.8 TB/s). A
# value recomputed for a backward matmul or convolution is written by a kernel of its own:
# however few its bytes, that kernel costs a launch (Swin-T's bfloat16 weight casts, 42
# kernels of the backward's 534, issue 20).
KERNEL_LAUNCH_BYTES = 10 * 2**20

# Expensive ops that a memory budget below 1 may recompute, at the cost of their arithmetic
# (the min cut never does): deterministic, one output, a FLOP formula. Attention is left
# out: its outputs are tuples that carry random state.
BUDGETED_KERNELS = frozenset({
    aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default,
    aten.convolution.default,
})

# Ops without the pointwise tag that cost no more than one pointwise pass.
CHEAP_OTHERS = frozenset({
    aten._to_copy.default, aten.clone.default, aten.copy.default, aten.where.self,
    aten.full_like.default, aten.zeros_like.default, aten.ones_like.default,
    aten.full.default, aten.zeros.default, aten.ones.default, aten.scalar_tensor.default,
    aten.arange.start, aten.arange.default, aten.cat.default, aten.stack.default,
    aten.constant_pad_nd.default, aten.index_select.default, aten.gather.default,
    aten.embedding.default, aten.slice_scatter.default, aten.select_scatter.default,
})

# Cheap ops whose results a fusing compiler (Inductor) writes to a buffer even when only
# fusible ops read them: reductions and concatenations. Every other cheap op is computed
# inside the kernels that read it (`fuses_into_readers`).
WRITTEN_OUT = CHEAP_REDUCTIONS | {aten.cat.default, aten.stack.default}

# Ops that only reinterpret their input's memory although their schema does not say so.
VIEWS_IN_PRACTICE = frozenset({
    aten._unsafe_view.default,
})


@functools.lru_cache(maxsize=None)  # per op, and the memory model asks per node and plan
def recompute_class(target) -> str:
    """How freely a value made by `target` may be recomputed (a `Recompute` constant).

    Random ops and ops that mutate are never recomputed: a second run would not give the
    value the forward saw."""
    import operator
    if target is operator.getitem:
        return Recompute.FREE
    if not isinstance(target, torch._ops.OpOverload):
        return Recompute.NEVER
    if target.is_view or target in VIEWS_IN_PRACTICE:
        return Recompute.FREE
    tags = target.tags
    if torch.Tag.nondeterministic_seeded in tags or target._schema.is_mutable:
        return Recompute.NEVER
    if torch.Tag.pointwise in tags or target in CHEAP_REDUCTIONS or target in CHEAP_OTHERS:
        return Recompute.CHEAP
    return Recompute.NEVER


@functools.lru_cache(maxsize=None)
def fuses_into_readers(target) -> bool:
    """Does a fusing compiler compute this op's value inside the kernels that read it, when
    they are all fusible (cheap), instead of writing it to memory?"""
    return recompute_class(target) == Recompute.CHEAP and target not in WRITTEN_OUT


def broadcasts_statistics(node) -> bool:
    """Does this pointwise op broadcast an input over its result along some dimensions:
    per-row statistics (a layer norm's `mean` and `rstd` in `(x - mean) * rstd`), per-channel
    ones (a batch norm's)? Same rank as the result, fewer elements; a bias of lower rank is
    not one."""
    out = node.meta.get("val")
    if not (isinstance(out, torch.Tensor) and isinstance(node.target, torch._ops.OpOverload)
            and torch.Tag.pointwise in node.target.tags):
        return False  # (a `cat` of same-rank pieces broadcasts nothing)
    return any(isinstance(v := i.meta.get("val"), torch.Tensor) and v.dim() == out.dim()
               and v.numel() < out.numel() for i in node.all_input_nodes)


def unsafe_to_recompute(target) -> bool:
    """A second run would not give the value the forward saw (random ops, ops with effects,
    calls aotgrad does not know): such values come from the forward, whatever a policy says."""
    import operator
    if target is operator.getitem:
        return False
    if not isinstance(target, torch._ops.OpOverload):
        return True
    return (torch.Tag.nondeterministic_seeded in target.tags or target._schema.is_mutable
            or target in ERROR_CHECKS)


def needs_functionalization(target) -> bool:
    """Tracing must functionalize a function that runs this op (pure.py): it mutates, has an
    effect ordered by tokens, is an error check (tagged by the functional mode), or is not a
    plain ATen op (a higher-order op: what it runs inside is unknown)."""
    if not isinstance(target, torch._ops.OpOverload):
        return True
    return (target._schema.is_mutable or target in UNMARKED_MUTATIONS or target in ERROR_CHECKS
            or target in STORAGE_RESIZES or has_effect(target))


# Ops that update arguments in place although their schemas do not mark it: batch norm's
# kernels, in training mode, write the running statistics they are given. Functionalization
# cannot see such a write, so the functional mode runs each as its declared form: ops that
# compute the same values and whose schemas mark the writes. (Torch's own functionalization
# replaces native_batch_norm on some versions only; an explicit form holds on all.)
def _batch_norm_declared(input, weight, bias, running_mean, running_var, training, momentum,
                         eps):
    if running_mean is None:  # batch statistics only: nothing to write
        return aten._native_batch_norm_legit.no_stats(input, weight, bias, training, momentum,
                                                      eps)
    if not training:  # normalizes with the running statistics, writes nothing
        return aten._native_batch_norm_legit_no_training.default(
            input, weight, bias, running_mean, running_var, momentum, eps)
    return aten._native_batch_norm_legit.default(input, weight, bias, running_mean,
                                                 running_var, training, momentum, eps)


def _cudnn_batch_norm_declared(input, weight, bias, running_mean, running_var, training,
                               momentum, eps):
    """cuDNN's outputs: batch norm's three, then an empty workspace its backward ignores."""
    reserve = input.new_empty((0,), dtype=torch.uint8)
    return (*_batch_norm_declared(input, weight, bias, running_mean, running_var, training,
                                  momentum, eps), reserve)


# Reductions into `out=` whose kernels compute in the out tensor's dtype where no `dtype` is
# given, exactly as with it (eager's torch.sum(x, out=long) sums x cast to long, -1 where the
# float sum is -0.4). Functionalized they computed in the input's dtype and then cast; the
# functional mode passes the out tensor's dtype as `dtype`.
OUT_DTYPE_REDUCTIONS = frozenset({
    aten.sum.IntList_out, aten.sum.out, aten.nansum.out, aten.prod.int_out, aten.prod.out,
    aten.mean.out, aten.mean.dtype_out,
})
# Reductions into `out=` that cast their input to the out tensor's dtype and compute in it,
# with no `dtype` to pass: std and var of bfloat16 into float16 (3.0859 where computing in
# bfloat16 and casting gives 3.0938). The trace casts the input first.
OUT_DTYPE_INPUTS = frozenset({aten.std.out, aten.std.correction_out, aten.var.out,
                              aten.var.correction_out})
# Reductions into `out=` that compute partly in the out tensor's dtype, with no `dtype` to pass
# (logsumexp sums its exponentials in it): refused where that dtype differs from the input's.
OUT_DTYPE_PARTLY = frozenset({aten.logsumexp.out})


UNMARKED_MUTATIONS = {
    aten.native_batch_norm.default: _batch_norm_declared,
    # CUDA eager takes cuDNN's kernel for float inputs when cuDNN is on (ResNet, EfficientNet)
    aten.cudnn_batch_norm.default: _cudnn_batch_norm_declared,
    # ROCm's kernel returns what native_batch_norm does (output, mean, inverse std). Not run
    # here: no ROCm machine.
    aten.miopen_batch_norm.default: _batch_norm_declared,
}


def _fused_observer_resizes(self, observer_on, fake_quant_on, running_min, running_max, scale,
                            zero_point, averaging_const, quant_min, quant_max, ch_axis,
                            per_row_fake_quant=False, symmetric_quant=False):
    """Per channel, the kernel first sizes empty running statistics (+inf, -inf) and the
    scale and zero point to the channel count: a QAT weight observer's first step."""
    if per_row_fake_quant and running_min.numel() == 0:
        size = self.size(ch_axis)
        running_min.resize_(size).fill_(float("inf"))
        running_max.resize_(size).fill_(float("-inf"))
        scale.resize_(size)
        zero_point.resize_(size)


# Ops whose kernels resize arguments in place where their fake kernels do not: the trace
# would keep the old sizes, and the compiled step would fail to write the new values back.
# The functional mode runs each entry's resizes (traced as the input resizes they are)
# before the op itself.
KERNEL_RESIZES = {
    aten._fused_moving_avg_obs_fq_helper.default: _fused_observer_resizes,  # QAT observers
}


@functools.lru_cache(maxsize=None)
def writes_a_tensor_list(op) -> bool:
    """Does `op` write into a list of tensors in place (`_foreach_add_`'s `self`)? Eager's
    kernels step each one's version counter once; functionalization, which runs the op's
    functional form and swaps the results in, steps none."""
    if not isinstance(op, torch._ops.OpOverload) or not op._schema.arguments:
        return False
    first = op._schema.arguments[0]
    return (first.alias_info is not None and first.alias_info.is_write
            and isinstance(first.type, torch.ListType))


# Namespaces of torch's own C++ ops: a kernel there that writes an argument without an
# ADInplaceOrView kernel (c10d's collectives, BatchNorm-like aten kernels) leaves eager's
# version counter alone, as a trace does.
CPP_KERNEL_NAMESPACES = frozenset({"aten", "prims", "prim", "c10d", "_c10d_functional",
                                   "_dtensor", "inductor", "quantized", "_quantized", "mkldnn"})


@functools.lru_cache(maxsize=None)
def writes_behind_the_counter(op) -> bool:
    """Does a trace of `op` write arguments without stepping their version counters where
    eager's does? An op of a user's `torch.library.Library` has no ADInplaceOrView kernel:
    eager's counter steps by its kernel's own in-place ops, which its fake kernel, traced,
    does not run (custom_op's ops have one, which steps it in the trace too). An op with a
    functionalization kernel of its own (FSDP's `fsdp::copy_`) writes as that kernel says."""
    if not isinstance(op, torch._ops.OpOverload) or not op._schema.is_mutable \
            or op.namespace in CPP_KERNEL_NAMESPACES:
        return False
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return not has(op.name(), "ADInplaceOrView") and not has(op.name(), "Functionalize")


@functools.lru_cache(maxsize=None)
def differentiated_by_its_kernel(op) -> bool:
    """Is what `op` writes differentiated through its kernel's own ops in eager? An op of
    a user's Library with neither an autograd kernel nor an ADInplaceOrView one: autograd
    records the in-place ops its (Python) kernel runs, which its fake kernel does not."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return writes_behind_the_counter(op) and not any(
        has(op.name(), key) for key in ("Autograd", "AutogradCPU", "AutogradCUDA"))


def written_arguments(op, args: Sequence, kwargs: dict) -> list:
    """What a call of `op` writes in place: the values it is passed as the arguments its
    schema marks written (a list's members one by one). Nodes or tensors, as passed."""
    schema = getattr(op, "_schema", None)
    if schema is None or not schema.is_mutable:
        return []
    written = []
    for k, arg in enumerate(schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            value = args[k] if k < len(args) else kwargs.get(arg.name)
            written += value if isinstance(value, (list, tuple)) else [value]
    return [v for v in written if v is not None]


def has_effect(op) -> bool:
    """Does PyTorch order `op` with effect tokens (a print, a torchbind call...)?"""
    from torch._higher_order_ops.effects import has_effects
    try:
        return has_effects(op)
    except TypeError:  # older torch: has_effects(op, args, kwargs)
        return has_effects(op, (), {})
