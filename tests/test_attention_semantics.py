"""Attention and transformer code against eager, on CPU: `scaled_dot_product_attention` in its
argument forms, `nn.MultiheadAttention`, the transformer layers and `nn.Transformer`, in
training and eval, with grads and under `no_grad`, through the three front doors (the
harness compares outputs, strides, autograd facts, input and parameter gradients).

Shapes are tiny; the Inductor doors run a few cases only (each compile takes seconds).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import aotgrad
from aotgrad.compat import aot_function, aot_module, nop
from harness import Case, call_index, check_case

SDPA = F.scaled_dot_product_attention
E, H = 8, 2  # embedding width and heads of the module cases


# ---- front doors ---------------------------------------------------------------------------

def compat(target):
    return aot_module(target, nop) if isinstance(target, nn.Module) else aot_function(target, nop)


def compile_eager(target):
    return aotgrad.compile(target, backend="eager")


def dynamo(target):
    torch._dynamo.reset()
    return torch.compile(target, backend=aotgrad.backend(backend="eager"))


def dynamo_dynamic(target):
    torch._dynamo.reset()
    return torch.compile(target, backend=aotgrad.backend(backend="eager"), dynamic=True)


def compile_inductor(target):
    return aotgrad.compile(target)


def dynamo_inductor(target):
    torch._dynamo.reset()
    return torch.compile(target, backend="aotgrad")


DOORS = pytest.mark.parametrize("door", [compat, compile_eager, dynamo],
                                ids=["compat", "compile", "dynamo"])
INDUCTOR_DOORS = pytest.mark.parametrize("door", [compile_inductor, dynamo_inductor],
                                         ids=["compile-inductor", "dynamo-inductor"])


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the transformer modules' nested-tensor notices
        yield


# ---- inputs --------------------------------------------------------------------------------

def qkv(b=2, h=2, t=5, s=None, d=4, kv_heads=None):
    """As a model's projections give them: [b, t, h, d] transposed to [b, h, t, d]."""
    s, kv_heads = s or t, kv_heads or h
    q = torch.randn(b, t, h, d).transpose(1, 2)
    k, v = (torch.randn(b, s, kv_heads, d).transpose(1, 2) for _ in range(2))
    return tuple(x.requires_grad_() for x in (q, k, v))


def bool_mask(*shape, empty_row=False):
    m = torch.rand(*shape) > 0.3
    m[..., 0] = True
    if empty_row:  # a query that sees no key: eager's math path gives zeros there
        m[..., 1, :] = False
    return m


def learned_bias(*shape):
    return torch.randn(*shape, requires_grad=True)


def attention_case(name, inputs, context="grad", tags=(), **options):
    """SDPA of (q, k, v) and, where `inputs` gives one, a mask."""
    def fn(q, k, v, mask=None):
        return SDPA(q, k, v, attn_mask=mask, **options)
    return Case(name, lambda: (inputs(), {}), fn=fn, context=context, tags=frozenset(tags))


def _neg_inf_row():
    m = torch.zeros(5, 5)
    m[1] = float("-inf")
    return m


SDPA_CASES = [
    attention_case("plain", qkv),
    attention_case("causal", qkv, is_causal=True),
    attention_case("causal_fewer_queries", lambda: qkv(t=3, s=6), is_causal=True),
    attention_case("scale", qkv, scale=0.3),
    attention_case("bool_mask", lambda: (*qkv(), bool_mask(2, 2, 5, 5))),
    attention_case("bool_mask_broadcast", lambda: (*qkv(), bool_mask(5, 5))),
    attention_case("bool_mask_expanded",
                   lambda: (*qkv(), bool_mask(2, 1, 1, 5).expand(2, 2, 5, 5))),
    attention_case("bool_mask_empty_row", lambda: (*qkv(), bool_mask(2, 2, 5, 5, empty_row=True))),
    attention_case("float_mask", lambda: (*qkv(), torch.randn(2, 2, 5, 5))),
    attention_case("float_mask_neg_inf_row", lambda: (*qkv(), _neg_inf_row())),
    attention_case("learned_bias", lambda: (*qkv(), learned_bias(2, 5, 5))),
    attention_case("learned_bias_broadcast", lambda: (*qkv(), learned_bias(5, 5))),
    attention_case("learned_bias_expanded",
                   lambda: (*qkv(), learned_bias(1, 1, 5, 5).expand(2, 2, 5, 5))),
    attention_case("learned_bias_transposed",
                   lambda: (*qkv(), learned_bias(2, 1, 5, 5).transpose(-1, -2))),
    attention_case("gqa", lambda: qkv(h=4, kv_heads=2), enable_gqa=True),
    attention_case("gqa_learned_bias", lambda: (*qkv(h=4, kv_heads=2), learned_bias(4, 5, 5)),
                   enable_gqa=True),
    attention_case("dropout", qkv, dropout_p=0.3),
    attention_case("dropout_bool_mask", lambda: (*qkv(), bool_mask(5, 5)), dropout_p=0.3),
    attention_case("dropout_causal", qkv, dropout_p=0.3, is_causal=True),
    attention_case("three_dims", lambda: tuple(torch.randn(3, 5, 4, requires_grad=True)
                                               for _ in range(3))),
    attention_case("bf16_inputs", lambda: tuple(t.detach().bfloat16().requires_grad_()
                                                for t in qkv())),
    attention_case("autocast_bf16", qkv, context="autocast_bf16"),
    attention_case("autocast_bf16_causal", qkv, context="autocast_bf16", is_causal=True),
    attention_case("autocast_bf16_learned_bias", lambda: (*qkv(), learned_bias(5, 5)),
                   context="autocast_bf16"),
    attention_case("no_grad_bool_mask", lambda: (*qkv(), bool_mask(5, 5)), context="no_grad"),
    attention_case("double_backward_learned_bias", lambda: (*qkv(), learned_bias(5, 5)),
                   tags={"double_backward"}),
    attention_case("double_backward_causal", qkv, tags={"double_backward"}, is_causal=True),
    attention_case("double_backward_gqa", lambda: qkv(h=4, kv_heads=2),
                   tags={"double_backward"}, enable_gqa=True),
    attention_case("double_backward_dropout", qkv, tags={"double_backward"}, dropout_p=0.3),
]


@DOORS
@pytest.mark.parametrize("case", SDPA_CASES, ids=[c.name for c in SDPA_CASES])
def test_sdpa_matches_eager(case, door):
    check_case(case, door)


# Inductor: the forms whose lowering differs (masks, GQA, the math path's bfloat16 casts).
# Dropout draws Inductor's own numbers: its consistency is tested below instead.
INDUCTOR_SDPA = ["causal", "learned_bias_transposed", "gqa_learned_bias", "bool_mask_empty_row",
                 "double_backward_learned_bias"]


@INDUCTOR_DOORS
@pytest.mark.parametrize("name", INDUCTOR_SDPA)
def test_sdpa_matches_eager_with_inductor(name, door):
    check_case(next(c for c in SDPA_CASES if c.name == name), door)


def test_sdpa_under_autocast_with_inductor_matches_eager_at_bfloat16s_rounding():
    """Inductor computes the masked softmax in float32 where eager rounds between ops: values
    agree to bfloat16's rounding (a few ulps), not bit for bit."""
    torch.manual_seed(0)
    q, k, v = qkv()
    bias = learned_bias(5, 5)

    def fn(q, k, v, bias):
        return SDPA(q, k, v, attn_mask=bias)
    with torch.autocast("cpu", torch.bfloat16):
        got, want = aotgrad.compile(fn)(q, k, v, bias), fn(q, k, v, bias)
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, atol=1e-2, rtol=2e-2)
    grads = [torch.autograd.grad(o.float().sum(), (q, k, v, bias)) for o in (got, want)]
    for g, w in zip(*grads):
        torch.testing.assert_close(g, w, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("door", [compat, compile_eager, compile_inductor, dynamo_inductor],
                         ids=["compat", "compile", "compile-inductor", "dynamo-inductor"])
def test_sdpa_dropouts_gradients_use_the_forwards_mask(door):
    """With v the identity, the output is the dropped-out attention matrix itself, so the
    mask the forward drew can be read off it: first- and second-order gradients must be
    those of eager's math on that mask (Inductor draws its own numbers)."""
    p = 0.4

    def reference(q, k, v, keep):
        a = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, -1)
        return (a * keep / (1 - p)) @ v

    def gradients(out):
        gq, gk = torch.autograd.grad(out, (q, k), g, create_graph=True)
        return (out, gq, *torch.autograd.grad((gq * h).sum() + gk.square().sum(), (q, k, v)))

    torch.manual_seed(0)
    q, k = (torch.randn(2, 2, 6, 4, requires_grad=True) for _ in range(2))
    v = torch.eye(6).expand(2, 2, 6, 6).clone().requires_grad_()
    g, h = torch.randn(2, 2, 6, 6), torch.randn(2, 2, 6, 4)
    out = door(lambda q, k, v: SDPA(q, k, v, dropout_p=p))(q, k, v)
    assert 0 < (out == 0).float().mean() < 1
    expected = reference(q, k, v, (out != 0).float())
    torch.testing.assert_close(gradients(out), gradients(expected), atol=1e-4, rtol=1e-4)


def _grown(make):
    """Inputs whose sequence length grows on the second call (a dynamic graph's reuse)."""
    return lambda: make(5 + 2 * call_index())


@pytest.mark.parametrize("door", [dynamo_dynamic,
                                  lambda f: aotgrad.compile(f, backend="eager", dynamic=True)],
                         ids=["dynamo", "compile"])
@pytest.mark.parametrize("case", [
    Case("causal", _grown(lambda t: (qkv(t=t), {})),
         fn=lambda q, k, v: SDPA(q, k, v, is_causal=True)),
    Case("bool_mask", _grown(lambda t: ((*qkv(t=t), bool_mask(t, t)), {})),
         fn=lambda q, k, v, m: SDPA(q, k, v, attn_mask=m)),
    Case("gqa", _grown(lambda t: (qkv(t=t, h=4, kv_heads=2), {})),
         fn=lambda q, k, v: SDPA(q, k, v, enable_gqa=True)),
    Case("double_backward_causal", _grown(lambda t: (qkv(t=t), {})),
         fn=lambda q, k, v: SDPA(q, k, v, is_causal=True), tags=frozenset({"double_backward"})),
], ids=lambda c: c.name)
def test_sdpa_with_dynamic_shapes_matches_eager_at_a_second_length(case, door):
    check_case(case, door)


# ---- dropout of a non-contiguous tensor (the transformer layers' batch_first) --------------

@DOORS
@pytest.mark.parametrize("view", [lambda x: x.transpose(0, 1), lambda x: x.permute(1, 2, 0),
                                  lambda x: x[0].t()], ids=["transposed", "permuted", "2d"])
def test_dropout_of_a_non_contiguous_tensor_in_training_matches_eager(view, door):
    """Dropout's kernel fills `empty_like(input)` (the input's layout) with `bernoulli_`,
    which functionalization draws into a contiguous value under the transposed wrapper; the
    in-place layout rewrite then rewrote its own write-back `copy_` again and again: a
    RecursionError for every dropout of a non-contiguous tensor in training (every
    TransformerEncoderLayer/DecoderLayer/Transformer with batch_first=True)."""
    case = Case("dropout", lambda: ((torch.randn(3, 4, 5, requires_grad=True),), {}),
                fn=lambda x: F.dropout(view(x), 0.3, True))
    check_case(case, door)


BERNOULLI_FILLS = {  # dropout written by hand, as attention code often does
    "noise_of_a_transposed_input": lambda x: x.t() * torch.empty_like(x.t()).bernoulli_(0.7)
    .div_(0.7),
    "returned_after_an_in_place_op": lambda x: (x.t() * 1).bernoulli_(0.5).div_(0.3),
    "default_p": lambda x: (x.t() * 1).bernoulli_(),
    "permuted": lambda x: x.view(2, 2, 3).permute(2, 0, 1)
    * torch.empty(2, 2, 3).permute(2, 0, 1).bernoulli_(0.3),
}


@pytest.mark.parametrize("door", [compat, compile_eager, dynamo, dynamo_dynamic],
                         ids=["compat", "compile", "dynamo", "dynamo-dynamic"])
@pytest.mark.parametrize("name", list(BERNOULLI_FILLS))
def test_bernoulli_fill_of_a_non_contiguous_tensor_draws_eagers_numbers(name, door):
    """Eager's `t.bernoulli_(p)` draws in `t`'s memory order, in place; functionalization
    drew `bernoulli.p`, contiguous, in logical order: with the eager backend another mask
    than eager's at each position (which the docs promise to match), and a returned `t`
    came out contiguous (strides (3, 1) where eager's are (1, 4)). Now drawn in memory
    order and permuted back (inplace_layouts.bernoulli_in_memory_order)."""
    fn = BERNOULLI_FILLS[name]
    case = Case(name, lambda: ((torch.randn(3 + call_index(), 4, requires_grad=True),), {}),
                fn=fn, tags=frozenset({"double_backward"}))
    if name == "permuted":  # its shape is fixed by the view
        case = Case(name, lambda: ((torch.randn(4, 3, requires_grad=True),), {}), fn=fn)
    check_case(case, door)


# ---- nn.MultiheadAttention -----------------------------------------------------------------

def x(b=2, t=5, e=E, batch_first=True, requires_grad=True):
    shape = (b, t, e) if batch_first else (t, b, e)
    return torch.randn(*shape, requires_grad=requires_grad)


def padding(b=2, s=5, as_float=False):
    m = torch.zeros(b, s, dtype=torch.bool)
    m[1, -2:] = True
    return m.float().masked_fill(m, float("-inf")) if as_float else m


def causal(t=5, as_float=False):
    m = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
    return m.float().masked_fill(m, float("-inf")) if as_float else m


def module_case(name, factory, inputs, train, context="grad"):
    return Case(name, inputs, factory=lambda: factory().train(train), context=context)


def mha_cases(train, context, bf):
    def mha(**options):
        return lambda: nn.MultiheadAttention(E, H, batch_first=bf, **options)

    def self_attn(**kwargs):
        return lambda: ((x(batch_first=bf),) * 3, kwargs)

    def cross(**kwargs):
        return lambda: ((x(batch_first=bf), x(t=7, e=6, batch_first=bf),
                         x(t=7, e=3, batch_first=bf)), kwargs)

    forms = {
        "self_dropout": (mha(dropout=0.2), self_attn()),
        "key_padding": (mha(), self_attn(key_padding_mask=padding())),
        "float_key_padding": (mha(), self_attn(key_padding_mask=padding(as_float=True))),
        "both_masks": (mha(), self_attn(key_padding_mask=padding(), attn_mask=causal())),
        "is_causal": (mha(), self_attn(attn_mask=causal(), is_causal=True)),
        "no_weights": (mha(), self_attn(key_padding_mask=padding(), need_weights=False)),
        "per_head_weights": (mha(), self_attn(attn_mask=causal(as_float=True),
                                              average_attn_weights=False)),
        "per_head_mask": (mha(), self_attn(attn_mask=torch.randn(4, 5, 5))),
        "kdim_vdim": (mha(kdim=6, vdim=3), cross(key_padding_mask=padding(s=7))),
        "bias_kv_zero_attn": (mha(add_bias_kv=True, add_zero_attn=True),
                              self_attn(key_padding_mask=padding(), attn_mask=causal())),
        "no_bias": (mha(bias=False), self_attn(key_padding_mask=padding())),
    }
    return [module_case(name, factory, inputs, train, context)
            for name, (factory, inputs) in forms.items()]


MODES = [("train", True, "grad"), ("eval", False, "grad"), ("eval_no_grad", False, "no_grad")]
# batch_first, eval, no_grad, bias=False is left out: torch's own Dynamo returns that output
# contiguous where eager's slow path returns it transposed, with backend="eager" too (not
# aotgrad's; aotgrad's own doors keep eager's layout, tested below).
MHA_CASES = {f"{mode}-{'bf' if bf else 'sf'}-{c.name}": c
             for mode, train, context in MODES for bf in (True, False)
             for c in mha_cases(train, context, bf)
             if not (bf and c.name == "no_bias" and context == "no_grad")}


# Torch 2.11's Dynamo calls MultiheadAttention's slow path (`F.multi_head_attention_forward`)
# where eager, in eval without grad, takes the fused fast path: a batch-first output comes out
# transposed, not contiguous, with backend="eager" too, so before aotgrad sees a graph
# (`tools/probe34.py` on the GPU machine, session 34); aotgrad's own doors give eager's layout.
_DYNAMO_211_REASON = ("torch 2.11's Dynamo takes MultiheadAttention's slow path (transposed "
                      "batch-first output) where eager takes the fast path; backend='eager' too")
# The transposed input's case failed so in one 2.11 run (session 34's tests33) and passed in
# the next (final34), other tests beside it in its worker: not strict until we know why.
FAST_PATH_CASES = {"eval_no_grad-bf-key_padding": True, "mha_fast_path": True,
                   "all_keys_padded_fast_path": True, "transposed_input_fast_path": False}


def through_dynamo_211(request, door, name: str) -> None:
    """Marks a batch-first fast-path case through Dynamo as torch 2.11's known divergence."""
    if door in (dynamo, dynamo_dynamic) and name in FAST_PATH_CASES:
        request.applymarker(pytest.mark.xfail(
            torch.__version__ < "2.12", strict=FAST_PATH_CASES[name], raises=AssertionError,
            reason=_DYNAMO_211_REASON))


# Every form on aotgrad.compile's door; a few on the other two (the same trace behind them).
OTHER_DOORS = pytest.mark.parametrize("door", [compat, dynamo], ids=["compat", "dynamo"])


@pytest.mark.parametrize("name", list(MHA_CASES))
def test_multihead_attention_matches_eager(name):
    check_case(MHA_CASES[name], compile_eager)


@OTHER_DOORS
@pytest.mark.parametrize("name", ["train-bf-both_masks", "train-sf-bias_kv_zero_attn",
                                  "eval-bf-kdim_vdim", "eval_no_grad-bf-key_padding",
                                  "eval_no_grad-sf-per_head_weights"])
def test_multihead_attention_matches_eager_through_the_other_doors(name, door, request):
    through_dynamo_211(request, door, name)
    check_case(MHA_CASES[name], door)


def test_mha_no_bias_in_eval_without_grad_matches_eager_outside_dynamo():
    """The one MHA form whose layout Dynamo changes by itself (torch's `backend="eager"` too):
    aotgrad's own doors keep eager's transposed output."""
    torch.manual_seed(0)
    eager = nn.MultiheadAttention(E, H, batch_first=True, bias=False).eval()
    q = x(requires_grad=False)
    for door in (compat, compile_eager):
        with torch.no_grad():
            got, want = door(eager)(q, q, q), eager(q, q, q)
        for g, w in zip(got, want):
            assert g.stride() == w.stride()
            torch.testing.assert_close(g, w)


# ---- transformer layers and nn.Transformer -------------------------------------------------

def layer_cases(train, context):
    cases = []
    for norm_first in (False, True):
        for act in ("relu", "gelu"):
            for bf in (True, False):
                tag = f"{'pre' if norm_first else 'post'}_{act}_{'bf' if bf else 'sf'}"
                enc = lambda nf=norm_first, a=act, bf=bf: nn.TransformerEncoderLayer(  # noqa
                    E, H, 16, dropout=0.1, activation=a, norm_first=nf, batch_first=bf)
                dec = lambda nf=norm_first, a=act, bf=bf: nn.TransformerDecoderLayer(  # noqa
                    E, H, 16, dropout=0.1, activation=a, norm_first=nf, batch_first=bf)
                cases.append(module_case(f"encoder_{tag}", enc, lambda bf=bf: (
                    (x(batch_first=bf),), {"src_mask": causal(),
                                           "src_key_padding_mask": padding()}), train, context))
                cases.append(module_case(f"decoder_{tag}", dec, lambda bf=bf: (
                    (x(batch_first=bf), x(t=7, batch_first=bf)),
                    {"tgt_mask": causal(), "tgt_key_padding_mask": padding(),
                     "memory_key_padding_mask": padding(s=7), "tgt_is_causal": True}),
                    train, context))
    return cases


LAYER_CASES = {f"{mode}-{c.name}": c for mode, train, context in MODES
               for c in layer_cases(train, context)}


@pytest.mark.parametrize("name", [n for n in LAYER_CASES if "_relu_" in n or "train" in n])
def test_transformer_layers_match_eager(name):
    check_case(LAYER_CASES[name], compile_eager)


@OTHER_DOORS
@pytest.mark.parametrize("name", ["train-encoder_pre_gelu_bf", "train-decoder_post_relu_bf",
                                  "eval-decoder_pre_relu_sf", "eval_no_grad-encoder_post_relu_bf",
                                  "eval_no_grad-decoder_post_relu_bf"])
def test_transformer_layers_match_eager_through_the_other_doors(name, door):
    check_case(LAYER_CASES[name], door)


def _transformer(bf):
    return lambda: nn.Transformer(E, H, 1, 1, 16, dropout=0.1, batch_first=bf)


@pytest.mark.parametrize("train, context", [(True, "grad"), (False, "grad"),
                                            (False, "no_grad")],
                         ids=["train", "eval", "eval_no_grad"])
@pytest.mark.parametrize("bf", [True, False], ids=["batch_first", "seq_first"])
def test_transformer_matches_eager_through_dynamo(bf, train, context):
    """nn.Transformer asks `_detect_is_causal_mask` a value question (`.item()`); Dynamo
    splits around it. Through aotgrad's own doors the refusal names it (below)."""
    case = module_case("transformer", _transformer(bf), lambda: (
        (x(batch_first=bf), x(t=6, batch_first=bf)),
        {"tgt_mask": nn.Transformer.generate_square_subsequent_mask(6),
         "src_key_padding_mask": padding(), "memory_key_padding_mask": padding()}),
        train, context)
    check_case(case, dynamo)


@pytest.mark.parametrize("door", [compat, compile_eager], ids=["compat", "compile"])
def test_transformer_with_a_tgt_mask_is_refused_by_name_outside_dynamo(door):
    torch.manual_seed(0)
    model = _transformer(True)()
    with pytest.raises(NotImplementedError, match="aotgrad: .*depends on tensor data.*"
                                                  "make_causal"):
        door(model)(x(), x(t=6), tgt_mask=nn.Transformer.generate_square_subsequent_mask(6))


@pytest.mark.parametrize("door", [compat, compile_eager, dynamo],
                         ids=["compat", "compile", "dynamo"])
def test_transformer_without_masks_matches_eager(door):
    """Without a tgt_mask nothing reads values: every door traces the whole model."""
    case = module_case("transformer", _transformer(True), lambda: ((x(), x(t=6)), {}),
                       True)
    check_case(case, door)


@INDUCTOR_DOORS
def test_a_batch_first_encoder_layer_trains_with_inductor(door):
    """Dropout draws Inductor's numbers: checked by eval-mode values and that training
    gives finite gradients for every parameter."""
    torch.manual_seed(0)
    eager = nn.TransformerEncoderLayer(E, H, 16, dropout=0.1, batch_first=True, norm_first=True)
    compiled = door(eager)
    inp = x()
    compiled(inp, src_key_padding_mask=padding()).sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in eager.parameters())
    eager.eval()
    case = Case("encoder", lambda: ((x(),), {"src_key_padding_mask": padding()}),
                factory=lambda: nn.TransformerEncoderLayer(E, H, 16, batch_first=True).eval())
    check_case(case, door)


# ---- dynamic shapes: a second call at another sequence length -------------------------------

def _length():
    return 5 + 2 * call_index()


def _padding_of_length(t):
    m = torch.zeros(2, t, dtype=torch.bool)
    m[1, -2:] = True
    return m


DYNAMIC_MODULE_CASES = [
    module_case("mha_key_padding_train", lambda: nn.MultiheadAttention(E, H, batch_first=True,
                                                                       dropout=0.1),
                lambda: ((x(t=_length()),) * 3, {"key_padding_mask": _padding_of_length(
                    _length())}), True),
    module_case("mha_fast_path", lambda: nn.MultiheadAttention(E, H, batch_first=True),
                lambda: ((x(t=_length(), requires_grad=False),) * 3,
                         {"key_padding_mask": _padding_of_length(_length())}), False, "no_grad"),
    module_case("encoder_layer_train", lambda: nn.TransformerEncoderLayer(
        E, H, 16, dropout=0.1, batch_first=True),
        lambda: ((x(t=_length()),), {"src_key_padding_mask": _padding_of_length(_length())}),
        True),
    module_case("decoder_layer_train", lambda: nn.TransformerDecoderLayer(
        E, H, 16, dropout=0.1, batch_first=True, norm_first=True),
        lambda: ((x(t=_length()), x(t=_length() + 1)),
                 {"tgt_mask": causal(_length()), "tgt_is_causal": True}), True),
]


@pytest.mark.parametrize("door", [dynamo_dynamic,
                                  lambda f: aotgrad.compile(f, backend="eager", dynamic=True)],
                         ids=["dynamo", "compile"])
@pytest.mark.parametrize("case", DYNAMIC_MODULE_CASES, ids=lambda c: c.name)
def test_attention_modules_with_dynamic_shapes_match_eager_at_a_second_length(case, door,
                                                                           request):
    through_dynamo_211(request, door, case.name)
    check_case(case, door)


# ---- autocast and errors -------------------------------------------------------------------

@pytest.mark.parametrize("layer", ["encoder", "decoder"])
def test_a_transformer_layer_trains_under_autocast_as_eager_to_bfloat16s_rounding(layer):
    """With dropout, the float32 gradients differ from eager's by about one bfloat16 ulp of
    their largest element (0.125 of 20 for the decoder's linear2.weight), as with torch's
    own aot_eager (the same sizes); without dropout the encoder's are eager's bit for bit.
    Checked to two bfloat16 ulps of each gradient's largest element."""
    torch.manual_seed(0)
    if layer == "encoder":
        eager = nn.TransformerEncoderLayer(E, H, 16, dropout=0.1, batch_first=True)
    else:
        eager = nn.TransformerDecoderLayer(E, H, 16, dropout=0.1, batch_first=True,
                                           norm_first=True)
    compiled = compile_eager(copy.deepcopy(eager))
    inp = x(), x(t=7)

    def step(model):
        torch.manual_seed(1)
        args = inp[:1] if layer == "encoder" else inp
        with torch.autocast("cpu", torch.bfloat16):
            out = model(*args)
        return out, torch.autograd.grad(out.float().square().sum(), (inp[0], *model.parameters()))
    (got, got_grads), (want, want_grads) = step(compiled), step(eager)
    torch.testing.assert_close(got, want)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, atol=w.abs().max().item() * 2 ** -7, rtol=2e-2)


ERROR_CASES = [
    Case("causal_and_mask", lambda: ((*qkv(), torch.ones(5, 5, dtype=torch.bool)), {}),
         fn=lambda q, k, v, m: SDPA(q, k, v, attn_mask=m, is_causal=True)),
    Case("gqa_heads_not_divisible", lambda: (qkv(h=3, kv_heads=2), {}),
         fn=lambda q, k, v: SDPA(q, k, v, enable_gqa=True)),
    Case("gqa_heads_without_the_flag", lambda: (qkv(h=4, kv_heads=2), {}),
         fn=lambda q, k, v: SDPA(q, k, v)),
    Case("mask_of_another_shape", lambda: ((*qkv(), torch.randn(3, 5)), {}),
         fn=lambda q, k, v, m: SDPA(q, k, v, attn_mask=m)),
    Case("integer_mask", lambda: ((*qkv(), torch.ones(5, 5, dtype=torch.int64)), {}),
         fn=lambda q, k, v, m: SDPA(q, k, v, attn_mask=m)),
    Case("float64_mask", lambda: ((*qkv(), torch.randn(5, 5, dtype=torch.float64)), {}),
         fn=lambda q, k, v, m: SDPA(q, k, v, attn_mask=m)),
    Case("no_keys", lambda: ((torch.randn(2, 2, 5, 4, requires_grad=True),
                              *(torch.randn(2, 2, 0, 4, requires_grad=True) for _ in range(2))),
                             {}), fn=lambda q, k, v: SDPA(q, k, v)),
    Case("dropout_one", lambda: (qkv(), {}), fn=lambda q, k, v: SDPA(q, k, v, dropout_p=1.0)),
    module_case("mha_is_causal_without_a_mask",
                lambda: nn.MultiheadAttention(E, H, batch_first=True),
                lambda: ((x(),) * 3, {"is_causal": True}), True),
]


@DOORS
@pytest.mark.parametrize("case", ERROR_CASES, ids=lambda c: c.name)
def test_sdpa_edge_cases_and_errors_match_eager(case, door):
    check_case(case, door)


# ---- a learned bias held by the module (T5's relative bias, ALiBi) ---------------------------

class BiasedAttention(nn.Module):
    """A parameter bias expanded over the batch, ALiBi's slopes (a buffer), a padding mask
    filled in: the mask SDPA gets requires grad, is expanded (stride 0) and computed inside."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(E, 3 * E)
        self.bias = nn.Parameter(torch.randn(H, 5, 5))
        self.register_buffer("slopes", torch.tensor([0.5, 0.25]))

    def forward(self, inp, pad):
        b, t, _ = inp.shape
        q, k, v = self.qkv(inp).view(b, t, 3, H, E // H).permute(2, 0, 3, 1, 4)
        pos = torch.arange(t)
        mask = self.bias[None].expand(b, H, t, t) \
            - self.slopes[:, None, None] * (pos[None, :] - pos[:, None]).abs()
        mask = mask.masked_fill(pad[:, None, None, :], float("-inf"))
        out = SDPA(q, k, v, attn_mask=mask, dropout_p=0.2 if self.training else 0.0)
        return out.transpose(1, 2).reshape(b, t, E)


@DOORS
@pytest.mark.parametrize("tags", [(), ("double_backward",)], ids=["backward", "double_backward"])
def test_a_modules_learned_attention_bias_gets_eagers_gradient(door, tags):
    case = Case("biased_attention", lambda: ((x(), padding()), {}), factory=BiasedAttention,
                tags=frozenset(tags))
    check_case(case, door)


# ---- a kernel chosen by the caller (sdpa_kernel) --------------------------------------------

def _under_kernel(backend, **options):
    def fn(q, k, v):
        with torch.nn.attention.sdpa_kernel(backend):
            return SDPA(q, k, v, **options)
    return fn


_KERNELS = torch.nn.attention.SDPBackend
KERNEL_CASES = [
    Case("flash_causal_double_backward", lambda: (qkv(), {}),
         fn=_under_kernel(_KERNELS.FLASH_ATTENTION, is_causal=True),
         tags=frozenset({"double_backward"})),
    Case("math_double_backward", lambda: (qkv(), {}), fn=_under_kernel(_KERNELS.MATH),
         tags=frozenset({"double_backward"})),
    Case("flash_dropout", lambda: (qkv(), {}),
         fn=_under_kernel(_KERNELS.FLASH_ATTENTION, dropout_p=0.3)),
    Case("flash_autocast_bf16", lambda: (qkv(), {}), fn=_under_kernel(_KERNELS.FLASH_ATTENTION),
         context="autocast_bf16"),
    Case("efficient_on_cpu_raises", lambda: (qkv(), {}),
         fn=_under_kernel(_KERNELS.EFFICIENT_ATTENTION)),
]


@DOORS
@pytest.mark.parametrize("case", KERNEL_CASES, ids=lambda c: c.name)
def test_sdpa_under_a_chosen_kernel_matches_eager(case, door):
    check_case(case, door)


def _all_padded_second_row():
    return torch.tensor([[False] * 5, [True] * 5])


MORE_MHA_CASES = [
    module_case("learned_attn_mask", lambda: nn.MultiheadAttention(E, H, batch_first=True),
                lambda: ((x(),) * 3, {"attn_mask": learned_bias(5, 5)}), True),
    module_case("learned_per_head_mask_transposed",
                lambda: nn.MultiheadAttention(E, H, batch_first=True),
                lambda: ((x(),) * 3, {"attn_mask": learned_bias(4, 5, 5).transpose(1, 2)}), True),
    module_case("learned_key_padding", lambda: nn.MultiheadAttention(E, H, batch_first=True),
                lambda: ((x(),) * 3, {"key_padding_mask": learned_bias(2, 5)}), True),
    module_case("all_keys_padded", lambda: nn.MultiheadAttention(E, H, batch_first=True),
                lambda: ((x(),) * 3, {"key_padding_mask": _all_padded_second_row()}), True),
    module_case("all_keys_padded_fast_path", lambda: nn.MultiheadAttention(E, H, batch_first=True),
                lambda: ((x(requires_grad=False),) * 3,
                         {"key_padding_mask": _all_padded_second_row()}), False, "no_grad"),
    module_case("transposed_input_fast_path",
                lambda: nn.MultiheadAttention(E, H, batch_first=True),
                lambda: ((x(batch_first=False, requires_grad=False).transpose(0, 1),) * 3,
                         {"key_padding_mask": padding()}), False, "no_grad"),
]


@DOORS
@pytest.mark.parametrize("case", MORE_MHA_CASES, ids=lambda c: c.name)
def test_multihead_attention_learned_masks_and_empty_rows_match_eager(case, door, request):
    """Masks that require grad get eager's gradients; a sequence whose keys are all padded
    gives eager's NaN rows (output and weights), on the slow path and the fast one."""
    through_dynamo_211(request, door, case.name)
    check_case(case, door)
