"""Does torch's own `aot_eager` compile `test_dynamic`'s padded_by_a_count case on this torch?
(torch 2.11's functional `copy_` guards on the data-dependent size; aotgrad fails there.)"""
import torch

import aotgrad  # noqa: F401  (registers backend="aotgrad")

def padded_positives(x):
    y = x[x > 0]
    n = y.shape[0]
    z = torch.zeros(n + 2)
    z[1:n + 1] = y
    return z, z[n:] * 2

with torch._dynamo.config.patch(capture_scalar_outputs=True, capture_dynamic_output_shape_ops=True):
    for backend in ("aot_eager", "aotgrad"):
        torch._dynamo.reset()
        x = torch.tensor([-1.0, -0.3, -1.0, 0.24, -1.0, -2.3], requires_grad=True)
        try:
            z, w = torch.compile(padded_positives, backend=backend)(x)
            (z.sum() + w.sum()).backward()
            print(torch.__version__, backend, "ok", x.grad.tolist())
        except Exception as e:
            print(torch.__version__, backend, "FAILED", type(e).__name__, str(e).splitlines()[0][:200])
