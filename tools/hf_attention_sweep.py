"""HF models through torch.compile(backend="aotgrad") against eager: which SDPA masks
`fold_constant_masks` folds, and loss/gradient differences. Not run by CI (needs
transformers). Run: PYTHONPATH=<transformers>:. python tools/hf_attention_sweep.py [names]

Each line: model/case, folded kinds (one per SDPA call of each Dynamo graph, '-' where a
mask stayed), max |loss diff| and max |grad diff| against eager. The eager-like backend
(aotgrad.backend(backend="eager")) draws eager's dropout numbers: same seed, same values.

Output, 2026-12-01, CPU, torch 2.13.0+cpu, transformers 5.24.0, after commits 2f8b471 and
509f6d0 (gpt2, llama, bert, t5: every case; the rest: --quick). T = folded to no mask,
C = folded to is_causal, - = a mask that stayed (a padding mask from the attention_mask
input, a sliding window narrower than the sequence, a symbolic shape after the automatic
dynamic recompile or dynamic=True), (none) = no SDPA call had a mask (BERT, RoBERTa and
BART get None from transformers without an attention_mask; T5's float position bias is
not boolean). Gemma2 and GPT-Neo refuse attn_implementation="sdpa" in 5.24 (model error).
Every fold was right: causal only where the window covered the sequence (mistral-sw64;
qwen2/gemma3's full-attention layer, not their sliding one), all true at t=1.

gpt2          eval                 folded CC             loss 0.0e+00 grad 0.0e+00
gpt2          eval mask=ones       folded --             loss 0.0e+00 grad 0.0e+00
gpt2          eval pad right       folded --             loss 0.0e+00 grad 0.0e+00
gpt2          eval pad left        folded --             loss 0.0e+00 grad 0.0e+00
gpt2          train                folded CC             loss 0.0e+00 grad 0.0e+00
gpt2          train pad right      folded --             loss 0.0e+00 grad 0.0e+00
gpt2          eval t=1 b=1         folded --             loss 0.0e+00 grad 0.0e+00
gpt2          eval t=8 then 6      folded ----           loss 0.0e+00 grad 0.0e+00
gpt2          eval dynamic         folded ----           loss 0.0e+00 grad 0.0e+00
gpt2          eval inductor        folded --             loss 4.8e-07 grad 1.2e-07
llama         eval                 folded CC             loss 0.0e+00 grad 0.0e+00
llama         eval mask=ones       folded --             loss 0.0e+00 grad 0.0e+00
llama         eval pad right       folded --             loss 0.0e+00 grad 0.0e+00
llama         eval pad left        folded --             loss 0.0e+00 grad 0.0e+00
llama         train                folded CC             loss 0.0e+00 grad 0.0e+00
llama         train pad right      folded --             loss 0.0e+00 grad 0.0e+00
llama         eval t=1 b=1         folded --             loss 0.0e+00 grad 0.0e+00
llama         eval t=8 then 6      folded ----           loss 0.0e+00 grad 0.0e+00
llama         eval dynamic         folded ----           loss 0.0e+00 grad 0.0e+00
llama         eval inductor        folded --             loss 0.0e+00 grad 3.7e-08
bert          eval                 folded (none)         loss 0.0e+00 grad 0.0e+00
bert          eval mask=ones       folded --             loss 0.0e+00 grad 0.0e+00
bert          eval pad right       folded --             loss 0.0e+00 grad 0.0e+00
bert          eval pad left        folded --             loss 0.0e+00 grad 0.0e+00
bert          train                folded (none)         loss 0.0e+00 grad 0.0e+00
bert          train pad right      folded --             loss 0.0e+00 grad 0.0e+00
bert          eval t=1 b=1         folded --             loss 0.0e+00 grad 0.0e+00
bert          eval t=8 then 6      folded ----           loss 0.0e+00 grad 0.0e+00
bert          eval dynamic         folded --             loss 0.0e+00 grad 0.0e+00
bert          eval inductor        folded --             loss 0.0e+00 grad 8.9e-08
t5            eval                 folded ------         loss 0.0e+00 grad 0.0e+00
t5            eval mask=ones       folded ------         loss 0.0e+00 grad 0.0e+00
t5            eval pad right       folded ------         loss 0.0e+00 grad 0.0e+00
t5            eval pad left        folded ------         loss 0.0e+00 grad 0.0e+00
t5            train                folded ------         loss 0.0e+00 grad 0.0e+00
t5            train pad right      folded ------         loss 0.0e+00 grad 0.0e+00
t5            eval t=1 b=1         folded ------         loss 0.0e+00 grad 0.0e+00
t5            eval t=8 then 6      folded ------------   loss 0.0e+00 grad 0.0e+00
t5            eval dynamic         folded ------------   loss 0.0e+00 grad 0.0e+00
t5            eval inductor        folded ------         loss 0.0e+00 grad 1.2e-07
mistral-sw4   eval                 folded --             loss 0.0e+00 grad 0.0e+00
mistral-sw4   eval pad left        folded --             loss 0.0e+00 grad 0.0e+00
mistral-sw4   train pad right      folded --             loss 0.0e+00 grad 0.0e+00
mistral-sw4   eval t=1 b=1 nomask  folded TT             loss 0.0e+00 grad 0.0e+00
mistral-sw4   eval t=8,6 nomask    folded ----           loss 0.0e+00 grad 0.0e+00
mistral-sw4   eval dyn nomask      folded ----           loss 0.0e+00 grad 0.0e+00
mistral-sw64  eval                 folded CC             loss 0.0e+00 grad 0.0e+00
mistral-sw64  eval pad left        folded --             loss 0.0e+00 grad 0.0e+00
mistral-sw64  train pad right      folded --             loss 0.0e+00 grad 0.0e+00
mistral-sw64  eval t=1 b=1 nomask  folded TT             loss 0.0e+00 grad 0.0e+00
mistral-sw64  eval t=8,6 nomask    folded CC--           loss 0.0e+00 grad 0.0e+00
mistral-sw64  eval dyn nomask      folded ----           loss 0.0e+00 grad 0.0e+00
qwen2-sw4     eval                 folded -C             loss 0.0e+00 grad 0.0e+00
qwen2-sw4     eval pad left        folded --             loss 0.0e+00 grad 0.0e+00
qwen2-sw4     train pad right      folded --             loss 0.0e+00 grad 0.0e+00
qwen2-sw4     eval t=1 b=1 nomask  folded TT             loss 0.0e+00 grad 0.0e+00
qwen2-sw4     eval t=8,6 nomask    folded -C--           loss 0.0e+00 grad 0.0e+00
qwen2-sw4     eval dyn nomask      folded ----           loss 0.0e+00 grad 0.0e+00
gemma         eval                 folded CC             loss 0.0e+00 grad 0.0e+00
gemma         eval pad left        folded --             loss 0.0e+00 grad 0.0e+00
gemma         train pad right      folded --             loss 0.0e+00 grad 0.0e+00
gemma         eval t=1 b=1 nomask  folded TT             loss 0.0e+00 grad 0.0e+00
gemma         eval t=8,6 nomask    folded CC--           loss 0.0e+00 grad 0.0e+00
gemma         eval dyn nomask      folded ----           loss 0.0e+00 grad 0.0e+00
gemma3-sw4    eval                 folded -C             loss 0.0e+00 grad 0.0e+00
gemma3-sw4    eval pad left        folded --             loss 0.0e+00 grad 0.0e+00
gemma3-sw4    train pad right      folded --             loss 0.0e+00 grad 0.0e+00
gemma3-sw4    eval t=1 b=1 nomask  folded TT             loss 0.0e+00 grad 0.0e+00
gemma3-sw4    eval t=8,6 nomask    folded -C--           loss 0.0e+00 grad 0.0e+00
gemma3-sw4    eval dyn nomask      folded ----           loss 0.0e+00 grad 0.0e+00
roberta       eval                 folded (none)         loss 0.0e+00 grad 0.0e+00
roberta       eval pad left        folded --             loss 0.0e+00 grad 0.0e+00
roberta       train pad right      folded --             loss 0.0e+00 grad 0.0e+00
roberta       eval t=1 b=1 nomask  folded (none)         loss 0.0e+00 grad 0.0e+00
roberta       eval t=8,6 nomask    folded (none)         loss 0.0e+00 grad 0.0e+00
roberta       eval dyn nomask      folded (none)         loss 0.0e+00 grad 0.0e+00
bart          eval                 folded (none)         loss 0.0e+00 grad 0.0e+00
bart          eval pad left        folded ----           loss 0.0e+00 grad 0.0e+00
bart          train pad right      folded ----           loss 0.0e+00 grad 0.0e+00
bart          eval t=1 b=1 nomask  folded (none)         loss 0.0e+00 grad 0.0e+00
bart          eval t=8,6 nomask    folded (none)         loss 0.0e+00 grad 0.0e+00
bart          eval dyn nomask      folded (none)         loss 0.0e+00 grad 0.0e+00
"""
from __future__ import annotations

import sys

import torch

import aotgrad
import aotgrad.capture.kernel_choice as kc

KINDS: list = []
_original = kc._constant_kind


def _spy(*args):
    kind = _original(*args)
    KINDS.append({"all true": "T", "causal": "C", None: "-"}[kind])
    return kind


kc._constant_kind = _spy
SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
             attn_implementation="sdpa", pad_token_id=0, head_dim=8)


def models():
    import transformers as tf
    yield "gpt2", lambda: tf.GPT2LMHeadModel(tf.GPT2Config(
        vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64,
        attn_implementation="sdpa")), "lm"
    yield "llama", lambda: tf.LlamaForCausalLM(tf.LlamaConfig(**SMALL, attention_dropout=0.1)), "lm"
    yield "mistral-sw4", lambda: tf.MistralForCausalLM(tf.MistralConfig(
        **SMALL, sliding_window=4, attention_dropout=0.1)), "lm"
    yield "mistral-sw64", lambda: tf.MistralForCausalLM(tf.MistralConfig(
        **SMALL, sliding_window=64)), "lm"
    yield "qwen2-sw4", lambda: tf.Qwen2ForCausalLM(tf.Qwen2Config(
        **SMALL, use_sliding_window=True, sliding_window=4, max_window_layers=1,
        layer_types=["sliding_attention", "full_attention"], attention_dropout=0.1)), "lm"
    yield "gemma", lambda: tf.GemmaForCausalLM(tf.GemmaConfig(**SMALL)), "lm"
    # Gemma2 refuses sdpa in transformers 5.24; Gemma3's text model takes it
    yield "gemma3-sw4", lambda: tf.Gemma3ForCausalLM(tf.Gemma3TextConfig(
        **SMALL, sliding_window=4, layer_types=["sliding_attention", "full_attention"],
        attention_dropout=0.1)), "lm"
    yield "gptneo-local4", lambda: tf.GPTNeoForCausalLM(tf.GPTNeoConfig(
        vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, max_position_embeddings=64,
        attention_types=[[["local", "global"], 1]], window_size=4,
        attn_implementation="sdpa")), "lm"
    enc = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
               num_attention_heads=4, max_position_embeddings=64, attn_implementation="sdpa",
               pad_token_id=0)
    yield "bert", lambda: tf.BertForMaskedLM(tf.BertConfig(**enc)), "mlm"
    yield "roberta", lambda: tf.RobertaForMaskedLM(tf.RobertaConfig(**enc, )), "mlm"
    yield "t5", lambda: tf.T5ForConditionalGeneration(tf.T5Config(
        vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        attn_implementation="sdpa", decoder_start_token_id=0)), "s2s"
    yield "bart", lambda: tf.BartForConditionalGeneration(tf.BartConfig(
        vocab_size=64, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_position_embeddings=64, attn_implementation="sdpa",
        attention_dropout=0.1)), "s2s"


def inputs(kind, b, t, mask, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 64, (b, t), generator=g)
    kw = dict(input_ids=ids, labels=ids.clone(), use_cache=False)
    if kind == "s2s":
        kw["labels"] = torch.randint(3, 64, (b, max(t - 2, 1)), generator=g)
    if mask is not None:
        am = torch.ones(b, t, dtype=torch.long)
        if mask == "right" and t > 2:
            am[0, -2:] = 0
        if mask == "left" and t > 2:
            am[0, :2] = 0
        kw["attention_mask"] = am
    return kw


def step(model, call, kw, seed=1):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    out = call(**kw)
    out.loss.backward()
    return out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                               if p.grad is not None}


def diff(a, b):
    loss = (a[0] - b[0]).abs().item()
    keys = set(a[1]) | set(b[1])
    grad = max(((a[1][k] - b[1][k]).abs().max().item() if k in a[1] and k in b[1]
                else float("inf")) for k in keys)
    return loss, grad


CASES = [  # name, train, mask, shapes [(b, t)...] run in turn, compile kwargs, backend
    ("eval", False, None, [(2, 8)], {}, "eager"),
    ("eval mask=ones", False, "ones", [(2, 8)], {}, "eager"),
    ("eval pad right", False, "right", [(2, 8)], {}, "eager"),
    ("eval pad left", False, "left", [(2, 8)], {}, "eager"),
    ("train", True, None, [(2, 8)], {}, "eager"),
    ("train pad right", True, "right", [(2, 8)], {}, "eager"),
    ("eval t=1 b=1", False, "ones", [(1, 1)], {}, "eager"),
    ("eval t=8 then 6", False, "ones", [(2, 8), (2, 6)], {}, "eager"),
    ("eval dynamic", False, "ones", [(2, 8), (2, 5)], {"dynamic": True}, "eager"),
    ("eval inductor", False, "ones", [(2, 8)], {}, "inductor"),
]
QUICK = [  # what a 2-core machine runs in time for every model
    ("eval", False, None, [(2, 8)], {}, "eager"),
    ("eval pad left", False, "left", [(2, 8)], {}, "eager"),
    ("train pad right", True, "right", [(2, 8)], {}, "eager"),
    ("eval t=1 b=1 nomask", False, None, [(1, 1)], {}, "eager"),
    ("eval t=8,6 nomask", False, None, [(2, 8), (2, 6)], {}, "eager"),
    ("eval dyn nomask", False, None, [(2, 8), (2, 5)], {"dynamic": True}, "eager"),
]


def main(names):
    cases = QUICK if "--quick" in names else CASES
    names = [n for n in names if n != "--quick"]
    torch._dynamo.config.cache_size_limit = 64
    for name, make, kind in models():
        if names and name not in names:
            continue
        for case, train, mask, shapes, ckw, backend in cases:
            if backend == "inductor" and name not in ("gpt2", "llama", "bert", "t5"):
                continue
            torch.manual_seed(0)
            try:
                model = make().train(train)
            except Exception as e:  # noqa: BLE001
                print(f"{name:13s} {case:20s} model error {type(e).__name__}: {e}"[:160])
                break
            torch._dynamo.reset()
            KINDS.clear()
            compiled = torch.compile(model, backend=aotgrad.backend(backend=backend), **ckw)
            worst = [0.0, 0.0]
            try:
                for b, t in shapes:
                    kw = inputs(kind, b, t, mask)
                    want, got = step(model, model, kw), step(model, compiled, kw)
                    worst = [max(w, d) for w, d in zip(worst, diff(want, got))]
                line = (f"{name:13s} {case:20s} folded {''.join(KINDS) or '(none)':14s} "
                        f"loss {worst[0]:.1e} grad {worst[1]:.1e}")
                tol = 1e-4 if backend == "inductor" else 1e-5
                print(line + ("  WRONG" if max(worst) > tol else ""), flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"{name:13s} {case:20s} error {type(e).__name__}: {e}"[:200], flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
