"""Tensor-parallel training through aotgrad, on 2 GPUs over NCCL (DTensor parameters).

    PYTHONPATH=. torchrun --nproc-per-node 2 tools/gpu_tensor_parallel.py
    PYTHONPATH=. torchrun --nproc-per-node 2 tools/gpu_tensor_parallel.py --cpu   # gloo

An MLP of column-wise then row-wise parallel linear layers (`parallelize_module`), the
row-wise outputs all-reduced in the forward and the column-wise input gradients in the
backward, trains a few SGD steps eagerly and through each compiler, from the same seed on
the same batches (each rank its own). Printed on rank 0: per run, the largest difference
of the losses and of the parameters (each rank's shard) from eager's, and the first step's
time. tests/test_distributed.py runs the same model on CPU in the suite.
"""

from __future__ import annotations

import argparse
import json
import os
import time

# NVLink multicast (NVLS) stays off: on shared hosts it can take the GPUs out of service.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

import aotgrad  # noqa: E402

WIDTH, BLOCKS, STEPS = 1024, 4, 3


def model(device: str) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    torch.manual_seed(0)
    net = nn.Sequential(*[nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh())
                          for _ in range(BLOCKS)]).to(device)
    plan = {f"{i}.0": ColwiseParallel() if i % 2 == 0 else RowwiseParallel()
            for i in range(BLOCKS)}
    return parallelize_module(net, init_device_mesh(device, (dist.get_world_size(),)), plan)


def train(net: nn.Module, device: str) -> dict:
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    losses, first = [], None
    for step in range(STEPS):
        g = torch.Generator(device).manual_seed(100 * step + dist.get_rank())
        x = torch.randn(16, WIDTH, device=device, generator=g)
        start = time.perf_counter()
        loss = net(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        first = first if first is not None else time.perf_counter() - start
    params = [p.detach().to_local().clone() for p in net.parameters()]
    return {"losses": torch.tensor(losses), "params": params, "first_step_s": first}


RUNS = {
    "aotgrad eager backend (Dynamo)": lambda m: torch.compile(
        m, backend=aotgrad.backend(backend="eager")),
    "aotgrad (Dynamo, Inductor)": lambda m: torch.compile(m, backend="aotgrad"),
    "aotgrad.compile (Inductor)": lambda m: aotgrad.compile(m),
    "torch.compile (Inductor)": lambda m: torch.compile(m),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu", action="store_true", help="gloo on CPU")
    args = p.parse_args()
    device = "cpu" if args.cpu else "cuda"
    if not args.cpu:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("gloo" if args.cpu else "nccl")
    eager = train(model(device), device)
    rows = {}
    for name, wrap in RUNS.items():
        torch._dynamo.reset()
        try:
            got = train(wrap(model(device)), device)
            rows[name] = {
                "losses": (got["losses"] - eager["losses"]).abs().max().item(),
                "params": max((a - b).abs().max().item()
                              for a, b in zip(got["params"], eager["params"])),
                "first_step_s": got["first_step_s"]}
        except Exception as error:  # reported, the other runs go on
            rows[name] = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
    if dist.get_rank() == 0:
        print(json.dumps(rows, indent=1))
        out = os.environ.get("OUT")
        if out:
            with open(os.path.join(out, "tensor_parallel.json"), "w") as f:
                json.dump({"device": torch.cuda.get_device_name() if not args.cpu else "cpu",
                           "torch": torch.__version__, "rows": rows}, f, indent=1)
        print("| run | loss diff | param diff | first step s |\n|---|---:|---:|---:|")
        for name, r in rows.items():
            print(f"| {name} | {r.get('losses', r.get('error'))} | {r.get('params', '')} | "
                  f"{r.get('first_step_s', '')} |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
