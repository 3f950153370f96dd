import torch, aotgrad
def f(x):
    h = x.sin()
    h.register_hook(lambda g: g * 2)
    return h
def run(fn):
    x = torch.arange(3.0, requires_grad=True)
    h = fn(x); h.retain_grad(); h.sum().backward()
    return x.grad.tolist(), h.grad.tolist()
print("eager", run(f))
for b in ("aot_eager", "eager", aotgrad.backend(backend="eager")):
    torch._dynamo.reset()
    print(b if isinstance(b, str) else "aotgrad", run(torch.compile(f, backend=b)))
torch._dynamo.reset()
import torch._dynamo
explain = torch._dynamo.explain(f)(torch.arange(3.0, requires_grad=True))
print(explain.graph_count, explain.graph_break_count, [str(r.reason)[:100] for r in explain.break_reasons])
