"""What the op-database sweep knows per op: which are random or uninitialized, which are
slow, the tolerances, and the rules that group failures by cause (`tools/opdb_sweep.py`)."""

# Substrings of op names whose outputs are random: eager and compiled draw different numbers,
# so comparing them says nothing about aotgrad.
RANDOM_NAME_PARTS = ("rand", "normal", "bernoulli", "dropout", "multinomial", "uniform",
                     "exponential", "geometric", "cauchy", "log_normal")

# Names that contain a part above but compute a deterministic function.
NOT_RANDOM = frozenset({
    "__rand__",  # reflected bitwise and
    "nn.functional.normalize",  # x / ||x||
    "masked.normalize",
    "signal.windows.exponential",  # a fixed window
    "native_dropout_backward",  # grad * mask * scale, with the mask given
    "nn.functional.feature_alpha_dropout.without_train",  # the identity
})

# Random ops whose names do not say so. OpInfo reseeds these (`wrapper_set_seed`) so that eager
# repeats itself, but the reseed happens at trace time, not in the compiled graph. Found by
# calling each op twice with the reseeding disabled.
RANDOM_OPS = frozenset({
    "nn.functional.rrelu",  # random negative slopes in training mode
    "nn.functional.fractional_max_pool2d",  # random pooling regions
    "nn.functional.fractional_max_pool3d",
    "nn.functional.scaled_dot_product_attention",  # dropout_p > 0 in some samples
    "nn.functional.multi_head_attention_forward",  # dropout in training mode
    "svd_lowrank",  # random projection
    "pca_lowrank",
})

# Ops whose outputs are uninitialized memory: two calls may differ.
UNINITIALIZED_OPS = frozenset({
    "empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided",
})

# Ops that take too long for a sweep (op id -> why); the per-op time limit catches the rest.
SLOW_OPS: dict[str, str] = {}

OP_TIME_LIMIT_S = 120.0

# (rtol, atol) for float32; assert_close's own defaults. The eager backend runs the same
# kernels as eager, so a difference beyond rounding is a bug, not noise.
DEFAULT_TOLERANCE = (1.3e-6, 1e-5)

# Ops whose compiled graph computes the same math through a different kernel (a decomposed
# composite, another reduction order), so rounding differs: op id -> (rtol, atol). Empty for
# now: with the eager backend, and inductor on every third op, all ops match at the default.
TOLERANCES: dict[str, tuple[float, float]] = {}

# How failures group by cause: the first rule whose pattern matches "ExceptionType: message"
# names the group. Anything unmatched groups by its type and normalized first line.
FAILURE_RULES: tuple[tuple[str, str], ...] = (
    (r"^OpTimeout", "timeout"),
    (r"^SweepError", "sweep error (a bug in tools/opdb_sweep.py)"),
    (r"depends on tensor data", "refused: data-dependent value"),
    (r"^DataDependentOutputException", "DataDependentOutputException"),
    (r"^DynamicOutputShapeException", "DynamicOutputShapeException"),
    (r"share memory and at least one of them is mutated", "unsupported: aliased mutated inputs"),
    (r"calls set_\(\) on an input", "unsupported: set_ on an input"),
    (r"^GraphInvariantError: .* mutates its input", "verify: graph not functional"),
    (r"^GraphInvariantError: .* has no meta\['val'\]", "verify: node without meta['val']"),
    (r"^GraphInvariantError: .* never read by the backward", "verify: saved value unused"),
    (r"derivative for .* is not implemented", "NotImplementedError: derivative not implemented"),
    (r"Could not find a token for effect|op with ordered side effects",
     "unsupported: effectful op (no effect tokens)"),
    (r"data is not allocated yet", "data-dependent: a kernel reads tensor data at trace time"),
    (r"(?i)\bsparse\b.*\btensors?\b", "unsupported: sparse tensors"),
    (r"to view \w+ as \w+ \(different element sizes\)", "regenerate_view: dtype-changing view"),
    (r"double backward .* draws random numbers", "refused: double backward of a random op"),
    (r"double backward .* branches on tensor values", "refused: double backward, data-dependent"),
    (r"double backward .* would not record the autograd history",
     "refused: double backward, history a replay would not record"),
    (r"linalg_eig_backward: The eigenvectors in the complex case",
     "eig's phase check: the replay's and the forward's gradients arrive apart"),
    (r"double backward .* custom autograd.Function",
     "refused: double backward of a custom Function"),
    (r"double backward .* mutates input", "refused: double backward, old value of a mutated input"),
)
