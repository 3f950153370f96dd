"""Train a small transformer language model through aotgrad and check it against eager.

    python -m aotgrad.demo [--backend inductor|eager] [--steps 5]

Two identical models train side by side from one seed: one eager, one compiled. After every
step the losses and every parameter's gradient must agree; at the end the script prints
what aotgrad built (graph sizes, the tensors saved for backward, compile time) and the step
time against eager.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from torch import nn

import aotgrad


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        b, t, w = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, -1).unbind(2)
        att = nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, w))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab=256, width=128, heads=4, layers=2, context=64):
        super().__init__()
        self.embed, self.pos = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.blocks = nn.Sequential(*[Block(width, heads) for _ in range(layers)])
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, vocab)

    def forward(self, tokens, targets):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.blocks(self.embed(tokens) + self.pos(positions))
        logits = self.head(self.norm(x))
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def train_step(model, optimizer, tokens, targets) -> tuple[float, float]:
    start = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    loss = model(tokens, targets)
    loss.backward()
    optimizer.step()
    return loss.item(), time.perf_counter() - start


def max_grad_error(a: nn.Module, b: nn.Module) -> float:
    return max((pa.grad - pb.grad).abs().max().item()
               for pa, pb in zip(a.parameters(), b.parameters()))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="inductor", choices=["inductor", "eager"])
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args(argv)
    torch.manual_seed(0)

    eager = TinyLM()
    compiled_model = copy.deepcopy(eager)
    compiled = aotgrad.compile(compiled_model, backend=args.backend)
    opt_eager = torch.optim.AdamW(eager.parameters(), lr=1e-3)
    opt_compiled = torch.optim.AdamW(compiled_model.parameters(), lr=1e-3)

    print(f"aotgrad demo: TinyLM ({sum(p.numel() for p in eager.parameters()):,} parameters), "
          f"backend={args.backend}, torch {torch.__version__}")
    times_eager, times_compiled, worst = [], [], 0.0
    for step in range(args.steps):
        tokens = torch.randint(0, 256, (8, 64))
        targets = torch.roll(tokens, -1, dims=1)
        loss_e, t_e = train_step(eager, opt_eager, tokens, targets)
        loss_c, t_c = train_step(compiled, opt_compiled, tokens, targets)
        err = max_grad_error(eager, compiled_model)
        worst = max(worst, err)
        print(f"step {step}: loss eager {loss_e:.5f}  aotgrad {loss_c:.5f}  "
              f"max |grad diff| {err:.1e}  ({t_e * 1000:.1f} ms vs {t_c * 1000:.1f} ms)")
        if abs(loss_e - loss_c) > 1e-3 or err > 1e-3:
            print("MISMATCH against eager")
            return 1
        times_eager.append(t_e)
        times_compiled.append(t_c)

    print()
    print(compiled.artifacts[0].summary())
    med_e, med_c = statistics.median(times_eager[1:]), statistics.median(times_compiled[1:])
    print(f"step time (median of steps 1..{args.steps - 1}): eager {med_e * 1000:.1f} ms, "
          f"aotgrad {med_c * 1000:.1f} ms ({med_e / med_c:.2f}x eager's speed)")
    print(f"OK: losses and gradients match eager (worst gradient difference {worst:.1e})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
