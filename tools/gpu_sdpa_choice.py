"""Which attention kernel SDPA takes for a bench model, in eager and in a trace's fake tensors.

    python tools/gpu_sdpa_choice.py bert [--model]

Runs one bf16-autocast training step of `bench/run.py`'s model in eager, recording the first
`scaled_dot_product_attention` call's arguments, and prints `torch._fused_sdp_choice` (the
backend index: 0 math, 1 flash, 2 efficient, 3 cudnn, ...) for them, the attention ops a
fake-tensor trace of the same call holds, the same two with an explicit mask (as transformers
builds under Dynamo), and the attention kernels the eager step ran. Issue 20:
BERT's compiled graphs (both doors) hold the math path in float32, where eager's peak memory
suggests a fused kernel. `--model`: only what the model's Dynamo graph hands SDPA, and the
choice for it (`model_choice`).
"""

import functools
import pathlib
import sys

sys.modules.setdefault("torchvision", None)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils import _pytree as pytree  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import run as bench_run  # noqa: E402


def _attention_ops(gm) -> list[str]:
    return sorted({str(n.target) for n in gm.graph.nodes if n.op == "call_function"
                   and any(w in str(n.target) for w in ("attention", "bmm"))})


def _recorder(seen: dict, door: str):
    """A compiler that notes, once per door, the attention ops of the graph it is given."""
    def compiler(gm, example_inputs):
        seen.setdefault(door, _attention_ops(gm))
        return gm
    return compiler


def traced_choice(args, kwargs) -> list[str]:
    """The attention ops a fake-tensor trace of the call holds. (Asked under FakeTensorMode,
    the `_fused_sdp_choice` op said math in session 29: it reaches its meta kernel, which by
    torch's source asks the CUDA selection only for a tensor whose key set holds CUDA. SDPA's
    own decomposition calls the selection for the tensor's device.)"""
    from torch.fx.experimental.proxy_tensor import make_fx
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    mask = kwargs.get("attn_mask")
    rest = {k: v for k, v in kwargs.items() if k != "attn_mask"}

    def attend(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, **rest)
    return _attention_ops(make_fx(attend, tracing_mode="fake")(*tensors, mask))


def compiled_choices(args, kwargs, decomposed: bool = False) -> dict:
    """The attention ops in the forward graph each door traces from the same call, under bf16
    autocast with gradients on (session 30: BERT's compiled graphs hold the math path, with
    a bf16 mask [16, 1, 512, 512] and dropout 0.1, where a plain fake trace of that call
    holds cuDNN's kernel): aotgrad's joint trace, and torch's AOTAutograd (aot_eager).
    `decomposed`: with Inductor's decompositions, whose SDPA entry runs its
    CompositeImplicitAutograd kernel from Python, where the plain traces run it from C++."""
    import aotgrad
    from aotgrad.backends.compilers import _inductor_decompositions
    from functorch.compile import aot_function  # torch's, to compare; tools may import it
    from torch._inductor.decomposition import select_decomp_table
    tensors = [a.detach().requires_grad_() for a in args if isinstance(a, torch.Tensor)]
    mask = kwargs.get("attn_mask")
    rest = {k: v for k, v in kwargs.items() if k != "attn_mask"}
    seen = {}
    recorder = functools.partial(_recorder, seen)

    def attend(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, **rest).float().sum()
    ours = _inductor_decompositions() if decomposed else None
    theirs = select_decomp_table() if decomposed else None
    doors = {"aotgrad": lambda: aotgrad.compile(attend, backend=aotgrad.Backend(
                 recorder("aotgrad"), recorder("aotgrad_bw"), recorder("aotgrad_inf"), ours)),
             "torch": lambda: aot_function(attend, recorder("torch"), recorder("torch_bw"),
                                           decompositions=theirs)}
    for door, make in doors.items():
        try:
            with torch.autocast("cuda", torch.bfloat16):
                out = make()(*tensors, mask)
            out.backward()
        except Exception as e:  # noqa: BLE001  (a tool: report and go on)
            seen[door] = f"failed: {str(e)[:200]}"
    return {d: seen.get(d) for d in doors}


def dynamo_choices(args, kwargs) -> dict:
    """The same call through Dynamo: the attention ops each door's forward graph holds, with
    torch.compile(backend=aotgrad's, eager compilers) and torch's AOTAutograd (session 31:
    the whole model's Dynamo graphs hold the math path in both doors, where each door's joint
    trace of the call alone holds cuDNN's kernel). `model`: with the mask built in the
    compiled code as transformers builds it under Dynamo (a bf16 `where` of an expanded
    `q_idx >= 0`), not passed in."""
    import aotgrad
    from torch._dynamo.backends.common import aot_autograd  # torch's, to compare
    tensors = [a.detach().requires_grad_() for a in args if isinstance(a, torch.Tensor)]
    rest = {k: v for k, v in kwargs.items() if k != "attn_mask"}
    seen = {}

    recorder = functools.partial(_recorder, seen)

    def attend_masked(q, k, v):
        b, t = q.shape[0], q.shape[2]
        keep = (torch.arange(t, device=q.device)[None, None, :, None] >= 0).expand(b, -1, t, t)
        mask = torch.where(keep, torch.tensor(0.0, dtype=q.dtype, device=q.device),
                           torch.tensor(float("-inf"), dtype=q.dtype, device=q.device))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **rest).float().sum()

    def attend_plain(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, **rest).float().sum()
    backends = {
        "aotgrad": lambda d: aotgrad.backend(backend=aotgrad.Backend(
            recorder(d), recorder(d + "_bw"), recorder(d + "_inf"))),
        "torch": lambda d: aot_autograd(fw_compiler=recorder(d), bw_compiler=recorder(d + "_bw"))}
    for fn in (attend_plain, attend_masked):
        for door, make in backends.items():
            name = f"{door} {fn.__name__}"
            torch._dynamo.reset()
            try:
                with torch.autocast("cuda", torch.bfloat16):
                    out = torch.compile(fn, backend=make(name))(*tensors)
                out.backward()
            except Exception as e:  # noqa: BLE001  (a tool: report and go on)
                seen[name] = f"failed: {str(e)[:200]}"
    return {d: v for d, v in seen.items() if not d.endswith(("_bw", "_inf"))}


def _real(fake: torch.Tensor) -> torch.Tensor:
    real = torch.empty_strided([int(n) for n in fake.shape], [int(n) for n in fake.stride()],
                               dtype=fake.dtype, device=fake.device)
    return real.requires_grad_(fake.requires_grad)


def model_choice(model, batch) -> list[str]:
    """What the whole model's Dynamo graph hands SDPA (session 31: its compiled graphs hold
    the math path, where the call alone takes cuDNN however it is traced): each SDPA node's
    fake arguments as Dynamo recorded them, `_fused_sdp_choice` of real ones laid out alike
    (and with the mask made dense), and the global switches it reads. Traced by aotgrad
    with Inductor's decompositions and eager compilers."""
    import aotgrad
    from aotgrad.backends.compilers import _inductor_decompositions, eager_compiler
    lines = []

    def describe(v):
        if isinstance(v, torch.Tensor):
            return (f"{v.dtype} {list(v.shape)} stride {v.stride()} offset "
                    f"{v.storage_offset()} grad {v.requires_grad} {v.device}")
        return repr(v)

    def inspecting(gm, example_inputs):
        for node in gm.graph.nodes:
            if node.op == "call_function" and "scaled_dot_product" in str(node.target):
                args, kwargs = torch.fx.node.map_aggregate(
                    (node.args, node.kwargs),
                    lambda a: a.meta.get("example_value") if isinstance(a, torch.fx.Node)
                    else a)
                lines.append(f"{node.name}: " + "; ".join(map(describe, args)) + " | " + str(
                    {k: describe(v) for k, v in kwargs.items()}))
                # Asked of fake tensors the choice is always math (its meta kernel): asked
                # of real ones laid out alike (their values do not matter to it).
                args, kwargs = pytree.tree_map_only(torch.Tensor, _real, (args, kwargs))
                dense = {**kwargs, "attn_mask": kwargs["attn_mask"].contiguous()} \
                    if kwargs.get("attn_mask") is not None else kwargs
                lines.append(f"  choice {torch._fused_sdp_choice(*args, **kwargs)}, "
                             f"the mask dense {torch._fused_sdp_choice(*args, **dense)}")
                if len(lines) >= 4:
                    break
        lines.append("switches: flash %s efficient %s cudnn %s math %s deterministic %s" % (
            torch.backends.cuda.flash_sdp_enabled(),
            torch.backends.cuda.mem_efficient_sdp_enabled(),
            torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.math_sdp_enabled(),
            torch.are_deterministic_algorithms_enabled()))
        backend = aotgrad.Backend(eager_compiler, eager_compiler, eager_compiler,
                                  _inductor_decompositions())
        return aotgrad.backend(backend=backend)(gm, example_inputs)
    torch._dynamo.reset()
    with torch.autocast("cuda", torch.bfloat16):
        loss = torch.compile(model, backend=inspecting)(*batch)
    loss.backward()
    return lines


def main():
    spec = bench_run.MODELS[sys.argv[1]]
    torch.manual_seed(0)
    model, batch = spec.build(False)
    model = model.cuda().train()
    batch = tuple(b.cuda() for b in batch)
    if sys.argv[2:] == ["--model"]:  # the model's Dynamo graph alone
        print(sys.argv[1], "Dynamo graph:", *model_choice(model, batch), sep="\n  ")
        return
    calls = []
    original = F.scaled_dot_product_attention

    def recording(*args, **kwargs):
        if not calls:
            calls.append((args, kwargs))
        return original(*args, **kwargs)
    F.scaled_dot_product_attention = recording
    torch.nn.functional.scaled_dot_product_attention = recording
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        with torch.autocast("cuda", torch.bfloat16):
            loss = model(*batch)
        loss.backward()
        torch.cuda.synchronize()
    F.scaled_dot_product_attention = original
    args, kwargs = calls[0]
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            print(f"arg{i}: {a.dtype} {list(a.shape)} stride {a.stride()} "
                  f"requires_grad {a.requires_grad}")
    print("kwargs:", {k: (v if not isinstance(v, torch.Tensor) else
                          f"{v.dtype} {list(v.shape)} stride {v.stride()}")
                      for k, v in kwargs.items()})
    print("real choice:", torch._fused_sdp_choice(*args, **kwargs))
    print("a fake trace holds:", traced_choice(args, kwargs))
    # Under Dynamo, transformers passes an explicit mask (zeros where attended), broadcast
    # over the heads: what does each choose with it?
    q = args[0]
    mask = torch.zeros(q.shape[0], 1, q.shape[2], q.shape[2], dtype=q.dtype, device=q.device)
    masked = {**kwargs, "attn_mask": mask}
    print("with a mask, real choice:", torch._fused_sdp_choice(*args, **masked),
          "a fake trace holds:", traced_choice(args, masked))
    print("traced by each door (autocast, the mask, dropout):", compiled_choices(args, masked))
    print("... and without dropout:", compiled_choices(args, {**masked, "dropout_p": 0.0}))
    print("... nor the mask:", compiled_choices(args, {**kwargs, "dropout_p": 0.0}))
    print("the model's Dynamo graph:", *model_choice(model, batch), sep="\n  ")
    print("through Dynamo:", dynamo_choices(args, kwargs))
    print("with Inductor's decompositions:", compiled_choices(args, masked, decomposed=True))
    names = {}
    for e in prof.key_averages():
        if any(m in e.key.lower() for m in ("fmha", "flash", "attention", "efficient", "cutlass")):
            names[e.key[:110]] = e.count
    print("attention kernels:", names or "none (math path)")
    print("eager peak MB:", torch.cuda.max_memory_allocated() / 2**20)


if __name__ == "__main__":
    main()
