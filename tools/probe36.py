"""Session 36: convnext_t's aotgrad step failed in combo36c's interleaved process (a fake
`view` of an NHWC tensor with H and W swapped), not in its cold process. Its entry was read
from aotgrad's cache while its Inductor key may have missed (the merged caches keep one
`.fxkey` per graph): then the stored graphs get their fake values by running each op again
(`fill_fake_values`). This runs the step in a fresh cache (`store`), then again after the
`.fxkey` files are deleted (`refill`), and prints where an error rises.

    python tools/probe36.py store DIR && python tools/probe36.py refill DIR
"""
import os
import pathlib
import sys
import traceback

phase, root = sys.argv[1], pathlib.Path(sys.argv[2])
os.environ.update(TORCHINDUCTOR_CACHE_DIR=str(root / "inductor"),
                  AOTGRAD_CACHE_DIR=str(root / "aotgrad"))
sys.path.insert(0, "bench")
import run as bench  # noqa: E402
import interleaved  # noqa: E402
import aotgrad.cache  # noqa: E402

if phase == "refill":
    for key in root.glob("aotgrad/**/*.fxkey"):
        key.unlink()
try:
    model, device = (sys.argv[3:] + ["convnext_t", "cuda"][len(sys.argv) - 3:])[:2]
    interleaved.compiled_step(bench.Job(model, "aotgrad_dynamo", None, device == "cpu",
                                        device, 2, 3))
    print(phase, "ok")
except Exception as e:
    print(phase, "error:", bench.describe(e)[:600])
    print("\n".join(bench.where(e, 30)))
    traceback.print_exc(limit=-8)
print(phase, aotgrad.cache.stats(), aotgrad.cache.events()[:4])
