"""Issue 20: the values aotgrad's partition saves for the backward vs torch's, on one joint.

    PYTHONPATH=.:/tmp/timmpkgs:/tmp/tfpkgs:/tmp/tvstub python tools/saved_compare.py bert
        [--small] [--cpu-autocast] [--top 15] [--ops]

A bench/run.py model at its full size (its batch too), traced on CPU with fake tensors (no
memory, no arithmetic) under bf16 autocast, Inductor's decompositions and joint-graph passes,
no code generation. The one joint graph is partitioned twice: by aotgrad's min cut and by
torch's AOTAutograd `min_cut_rematerialization_partition` (on a copy). Per side: the saved
activations' bytes (a buffer once, however many views of it are saved), by dtype and by the
op that made the buffer; then the buffers one side saves and the other does not, largest
first. The GPU's peak is mostly these bytes plus the backward's working set.

The joint is aotgrad's, whose backward is traced with autocast off, as eager's runs.
torch.compile traces its backward under the forward's autocast. Where the forward computes
in float32 inside autocast, torch.compile's backward computes in bf16 and saves bf16 copies,
which torch's side here does not show. BERT's SDPA math path is one such place (session 29:
torch.compile saved 6369 MiB on the GPU, ours 8737; `tools/gpu_graph_ops.py` records what
each door really hands Inductor).

CPU autocast is a stand-in for CUDA's: both cast matmuls and convolutions to bf16, but only
CUDA's runs layer norm, softmax, sums and losses in float32. `CudaLikeAutocast` adds that
(it casts those ops' bf16 inputs to float32 while autocast is on), so that the dtypes of the
joint are the GPU run's; `--cpu-autocast` leaves it out.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import sys
from unittest import mock
from pathlib import Path

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.overrides import TorchFunctionMode

os.environ.setdefault("AOTGRAD_CACHE", "0")  # a cached entry would skip the partitioners
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import aotgrad  # noqa: E402
from aotgrad.backends.compilers import (_inductor_decompositions, copy_graph,  # noqa: E402
                                        eager_compiler, inductor_graph_passes)
from aotgrad.partition.memory import base_of, estimate_peak, tensor_bytes  # noqa: E402
from aotgrad.partition.remat import min_cut_rematerialization_partition  # noqa: E402
from aotgrad.schema import Backend  # noqa: E402

# CUDA autocast's float32 ops (aten/src/ATen/autocast_mode.cpp) that CPU autocast leaves in
# the input's dtype, by the names Python calls them by (function or method).
CUDA_FLOAT32 = frozenset({
    "layer_norm", "group_norm", "softmax", "log_softmax", "cross_entropy", "nll_loss",
    "mse_loss", "l1_loss", "smooth_l1_loss", "kl_div", "binary_cross_entropy_with_logits",
    "exp", "log", "log1p", "expm1", "pow", "rsqrt", "reciprocal", "softplus", "sum", "cumsum",
    "prod", "logsumexp", "norm", "cosine_similarity", "erfinv",
})


class CudaLikeAutocast(TorchFunctionMode):
    """Run CUDA autocast's float32 ops in float32 under CPU autocast, as the GPU does."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.is_autocast_enabled("cpu") and getattr(func, "__name__", "") in CUDA_FLOAT32:
            args, kwargs = torch.utils._pytree.tree_map_only(torch.Tensor, _to_float32,
                                                             (args, kwargs))
        return func(*args, **kwargs)


def _to_float32(t: torch.Tensor) -> torch.Tensor:
    return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t


# ---- the trace ------------------------------------------------------------------------------

def fake_model(name: str, small: bool, attention_dropout: bool = False):
    """bench/run.py's loss module and batch, as fake tensors of the same sizes and strides."""
    import run as bench
    spec = bench.MODELS[name]
    model, batch = spec.build(small)
    if not attention_dropout:
        without_attention_dropout(model)
    fmt = torch.channels_last if spec.channels_last else torch.contiguous_format
    model = model.to(memory_format=fmt).train()
    batch = tuple(t.to(memory_format=fmt) if t.dim() == 4 else t for t in batch)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    for module in model.modules():
        for key, p in module._parameters.items():
            if p is not None:
                module._parameters[key] = torch.nn.Parameter(mode.from_tensor(p.detach()),
                                                             p.requires_grad)
        for key, b in module._buffers.items():
            if b is not None:
                module._buffers[key] = mode.from_tensor(b)
    return model, tuple(mode.from_tensor(t) for t in batch)


def without_attention_dropout(model: torch.nn.Module) -> None:
    """transformers' SDPA attention (BERT's `dropout_prob`) without dropout. With dropout, CPU
    attention takes the math path (the [B, H, T, T] probabilities and dropout mask saved);
    the GPU's flash attention draws its dropout inside the kernel and saves neither."""
    for module in model.modules():
        if isinstance(getattr(module, "dropout_prob", None), float):
            module.dropout_prob = 0.0


def partition_both(model, batch, cuda_like: bool):
    """The joint graph, and the saved values of each partitioner: {side: [joint node]}."""
    found = {}

    def partitioner(joint, _inputs=None, *, num_fwd_outputs, **kwargs):
        found["joint"] = joint
        found["torch"], found["torch peak"], found["torch graphs"] = torch_saved(
            copy_graph(joint), num_fwd_outputs, joint)
        with spans_noted(found):
            fw, bw = min_cut_rematerialization_partition(joint, None,
                                                         num_fwd_outputs=num_fwd_outputs)
        found["aotgrad"] = saved_of(fw, num_fwd_outputs, joint)
        found["aotgrad peak"] = estimate_peak(fw, bw, num_fwd_outputs)
        found["aotgrad graphs"] = fw, bw
        return fw, bw

    backend = Backend(eager_compiler, eager_compiler, eager_compiler,
                      _inductor_decompositions(), inductor_graph_passes)
    compiled = aotgrad.compile(model, backend=backend, partitioner=partitioner)
    with torch.autocast("cpu", torch.bfloat16), as_under_dynamo(), \
            (CudaLikeAutocast() if cuda_like else contextlib.nullcontext()), \
            mock.patch.object(aotgrad.api, "under_a_function_mode", lambda: False):
        # A call under a function mode runs the original code (the mode may see every
        # call); here the mode is meant for the trace, which runs once.
        compiled(*batch)
    return found


@contextlib.contextmanager
def spans_noted(found: dict):
    """Notes the min cut's last look at the recomputed values a backward kernel would keep
    alive (`remat.saved_below_peak`): all of them, and those it saved."""
    from aotgrad.partition import remat
    choose = remat.saved_below_peak

    def noted(spanning, *args):
        found["spanning"] = spanning, choose(spanning, *args)
        return found["spanning"][1]
    remat.saved_below_peak = noted
    try:
        yield
    finally:
        remat.saved_below_peak = choose


@contextlib.contextmanager
def as_under_dynamo():
    """The model code as the GPU run's Dynamo sees it: transformers skips its data-dependent
    checks (padding warnings, mask shortcuts) when `torch.compiler.is_compiling()`."""
    was = torch.compiler.is_compiling
    torch.compiler.is_compiling = lambda: True
    try:
        yield
    finally:
        torch.compiler.is_compiling = was


def torch_saved(joint: fx.GraphModule, num_fwd_outputs: int, original: fx.GraphModule):
    from torch._functorch.partitioners import min_cut_rematerialization_partition as torch_mincut
    for node in joint.graph.find_nodes(op="placeholder"):  # torch tells inputs apart by name
        node.name = node.target = _torch_name(node)
    joint.recompile()
    fw, bw = torch_mincut(joint, None, num_fwd_outputs=num_fwd_outputs)
    return (saved_of(fw, num_fwd_outputs, original), estimate_peak(fw, bw, num_fwd_outputs),
            (fw, bw))


def _torch_name(node: fx.Node) -> str:
    from aotgrad.schema import is_tangent
    if is_tangent(node):
        return node.name if node.name.startswith("tangents") else f"tangents_{node.name}"
    return node.name if node.name.startswith("primals") else f"primals_{node.name}"


def saved_of(forward: fx.GraphModule, num_fwd_outputs: int, joint: fx.GraphModule):
    """The forward's saved tensors, as the joint's nodes of the same name where there is one
    (a node a partitioner added stands for itself)."""
    by_name = {n.name: n for n in joint.graph.nodes}
    saved = forward.graph.output_node().args[0][num_fwd_outputs:]
    return [by_name.get(_joint_name(n), n) for n in saved
            if isinstance(n, fx.Node) and isinstance(n.meta.get("val"), torch.Tensor)]


def _joint_name(node: fx.Node) -> str:
    for prefix in ("primals_", "tangents_"):
        if node.name.startswith(prefix) and not node.name[len(prefix):].isdigit():
            return node.name[len(prefix):]
    return node.name


# ---- the report -----------------------------------------------------------------------------

def buffers(saved: list[fx.Node]) -> dict[fx.Node, int]:
    """The saved activations' buffers (inputs are alive anyway) and their bytes."""
    out = {}
    for node in saved:
        base = base_of(node)
        if base.op != "placeholder":
            out[base] = tensor_bytes(base.meta.get("val"))
    return out


def where(node: fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    path = list(stack.values())[-1][0] if stack else ""
    return path.replace("L['self'].", "").replace("L['fn'].", "")[-48:]


def describe(node: fx.Node) -> str:
    val = node.meta["val"]
    op = getattr(node.target, "__name__", str(node.target))
    return (f"{node.name:24} {op:28} {str(val.dtype).replace('torch.', ''):9}"
            f" {str(list(val.shape)):20} {where(node)}")


def mib(n: int) -> str:
    return f"{n / 2**20:9.1f} MiB"


def report_side(side: str, bufs: dict[fx.Node, int], inputs: int, peak) -> None:
    print(f"\n== {side}: {len(bufs)} saved buffers, {mib(sum(bufs.values()))}"
          f" (+{inputs} saved inputs); aotgrad's memory model (partition/memory.py), graphs"
          f" in the partitioner's order: forward peak {mib(peak.forward_peak_bytes)}, backward"
          f" peak {mib(peak.backward_peak_bytes)}")
    for title, key in (("dtype", lambda n: str(n.meta["val"].dtype)),
                       ("op", lambda n: getattr(n.target, "__name__", str(n.target)))):
        totals = collections.Counter()
        for node, size in bufs.items():
            totals[key(node)] += size
        print(f"  by {title}: " + ", ".join(f"{k} {v / 2**20:.1f}" for k, v in
                                           totals.most_common(12)))
    for node in sorted(bufs, key=lambda n: -bufs[n])[:5]:
        print(f"  largest {mib(bufs[node])}  {describe(node)}")


def report(found: dict, top: int) -> dict[str, int]:
    sides = {side: buffers(found[side]) for side in ("aotgrad", "torch")}
    for side, bufs in sides.items():
        report_side(side, bufs, sum(n.op == "placeholder" for n in found[side]),
                    found[f"{side} peak"])
    ours, theirs = sides["aotgrad"], sides["torch"]
    for title, a, b in (("aotgrad only", ours, theirs), ("torch only", theirs, ours)):
        extra = sorted((n for n in a if n not in b), key=lambda n: -a[n])
        print(f"\n== saved by {title}: {len(extra)} buffers, "
              f"{mib(sum(a[n] for n in extra))}")
        for node in extra[:top]:
            print(f"  {mib(a[node])}  {describe(node)}")
    totals = {side: sum(bufs.values()) for side, bufs in sides.items()}
    print(f"\nsaved activations: aotgrad {mib(totals['aotgrad'])}, torch {mib(totals['torch'])}"
          f", ratio {totals['aotgrad'] / max(totals['torch'], 1):.3f}")
    return totals


def report_ops(found: dict, top: int) -> None:
    """What each graph of the two partitions holds: ops by target where the sides differ
    (what Inductor lowers, one node at a time), and the spanning values aotgrad left to
    the backward."""
    for i, role in enumerate(("forward", "backward")):
        ours, theirs = (_ops(found[f"{side} graphs"][i]) for side in ("aotgrad", "torch"))
        print(f"\n== {role} ops: aotgrad {sum(ours.values())}, torch {sum(theirs.values())}")
        for op in sorted(set(ours) | set(theirs), key=lambda k: -abs(ours[k] - theirs[k]))[:top]:
            if ours[op] != theirs[op]:
                print(f"  {op:44} {ours[op]:6} {theirs[op]:6} {ours[op] - theirs[op]:+6}")
    spanning, saved = found.get("spanning", ([], []))
    left = [n for n in spanning if n not in saved]
    print(f"\n== recomputed values a backward kernel keeps alive: {len(spanning)}, saved "
          f"{len(saved)} (the rest would raise the modeled peak)")
    for node in left[:top]:  # many saved values: a chain, such as a residual stream's
        print(f"  {node.name:24} {mib(tensor_bytes(node.meta.get('val')))}, recomputed from "
              f"{len(_rebuilt_from(node, set(found['aotgrad'])))} saved values (through the "
              "values recomputed before it)")


def _rebuilt_from(node: fx.Node, saved: set) -> set:
    """The saved values the backward reads to recompute `node` and what it is made from."""
    from aotgrad.partition.split import ancestors
    return {i for a in ancestors([node], stop=saved) for i in a.all_input_nodes if i in saved}


def _ops(gm: fx.GraphModule) -> collections.Counter:
    return collections.Counter(str(n.target) for n in gm.graph.nodes if n.op == "call_function")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="a bench/run.py model name (bert, efficientnet_b0, ...)")
    p.add_argument("--small", action="store_true", help="bench/run.py's --small variant")
    p.add_argument("--cpu-autocast", action="store_true",
                   help="CPU autocast's dtypes, not CUDA's (see the module docstring)")
    p.add_argument("--attention-dropout", action="store_true",
                   help="keep SDPA's dropout (CPU attention then saves what flash does not)")
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--ops", action="store_true",
                   help="also each graph's ops where the sides differ, and the spanning values")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    model, batch = fake_model(args.model, args.small, args.attention_dropout)
    found = partition_both(model, batch, cuda_like=not args.cpu_autocast)
    report(found, args.top)
    if args.ops:
        report_ops(found, args.top)


if __name__ == "__main__":
    main()
