"""A bench model's parameter gradients: eager against torch.compile with aotgrad and with
Inductor, dropout off (eval), under bf16 autocast, on the GPU.

    python tools/model_grads.py bert

Prints, per pair, the losses and each parameter's gradient error relative to the other's
norm (median and largest). Session 32: BERT's compiled graphs take cuDNN attention (its mask
made dense, capture/kernel_choice.py) where Inductor's take the float32 math path and eager
cuDNN without a mask. `aotgrad again` is a second compile after the others ran, which
would show another run's cuDNN kernel served to ours (backends/passes.py).
"""

import statistics
import sys

sys.modules.setdefault("torchvision", None)  # transformers' optional import, absent there
import torch  # noqa: E402

sys.path.insert(0, "bench")
import run as bench_run  # noqa: E402


def main():
    torch.manual_seed(0)
    model, batch = bench_run.MODELS[sys.argv[1]].build(False)
    model = model.cuda().eval()
    batch = tuple(b.cuda() for b in batch)

    def grads(fn):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cuda", torch.bfloat16):
            loss = fn(*batch)
        loss.backward()
        return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()
                             if p.grad is not None}

    runs = {"aotgrad": grads(torch.compile(model, backend="aotgrad")), "eager": grads(model)}
    torch._dynamo.reset()
    runs["inductor"] = grads(torch.compile(model, backend="inductor"))
    torch._dynamo.reset()
    runs["aotgrad again"] = grads(torch.compile(model, backend="aotgrad"))
    for a, b in [("aotgrad", "eager"), ("inductor", "eager"), ("aotgrad", "inductor"),
                 ("aotgrad again", "aotgrad")]:
        (loss_a, ga), (loss_b, gb) = runs[a], runs[b]
        rel = {n: ((ga[n].float() - gb[n].float()).norm() /
                   gb[n].float().norm().clamp_min(1e-12)).item() for n in gb}
        worst = max(rel, key=rel.get)
        print(f"{a:14s} vs {b:9s} loss {loss_a:.5f} vs {loss_b:.5f}  relative gradient error "
              f"median {statistics.median(rel.values()):.4f}, largest {rel[worst]:.4f} ({worst})")


if __name__ == "__main__":
    main()
