"""Is the joint graph this checkout traces the baseline's, less the aliases of saved values?

    python bench/results/trace-cpu-2026-11-29/joint_equivalence.py BASELINE_DIR [--model M]
        [--cuda-dropout] [--autocast]

Both traces of the model's Dynamo graph (bench/trace_time.py's setup, Inductor's
decompositions), each node written as its op, its arguments (an `alias` that is no output
replaced by its input) and its value's shape, strides and dtype: the lists must be equal."""
import argparse
import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/
import torch  # noqa: E402
import trace_time  # noqa: E402


def traced(side, package: str, model) -> torch.fx.GraphModule:
    joint = importlib.import_module(f"{package}.capture.joint")
    graphs, trace = [], joint.trace

    def kept(*args, **kwargs):
        graphs.append(trace(*args, **kwargs))
        return graphs[-1]
    joint.trace = kept  # pure.py traces through joint.trace too
    try:
        trace_time.compiled_once(model, side)
    finally:
        joint.trace = trace
    return graphs[-1]


def canonical(gm: torch.fx.GraphModule) -> list:
    env, nodes = {}, []
    for n in gm.graph.nodes:
        if n.target is torch.ops.aten.alias.default and all(u.op != "output" for u in n.users):
            env[n] = env[n.args[0]]
            continue
        env[n] = f"v{len(nodes)}"
        args = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: env[a])
        val = n.meta.get("val")
        meta = (tuple(val.shape), val.stride(), val.dtype) if isinstance(val, torch.Tensor) else None
        nodes.append((n.op, str(n.target), str(args), str(meta)))
    return nodes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("baseline")
    parser.add_argument("--model", default="deberta_v2")
    parser.add_argument("--cuda-dropout", action="store_true")
    parser.add_argument("--autocast", action="store_true")
    args = parser.parse_args()
    args = argparse.Namespace(**vars(args), small=True, device="cpu",
                              sides=["aotgrad", "baseline"])
    model, sides = trace_time.prepared(args), trace_time.sides(args)
    new = traced(sides["aotgrad"], "aotgrad", model)
    old = traced(sides["baseline"], "aotgrad_baseline", model)
    count = [len(g.graph.nodes) for g in (new, old)]
    print(f"{args.model}: nodes {count[0]} (this checkout) vs {count[1]} (baseline); "
          f"equal less aliases: {canonical(new) == canonical(old)}")


if __name__ == "__main__":
    main()
