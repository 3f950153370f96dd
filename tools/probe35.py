"""Session 35's GPU probe: where does aotgrad's compile of DeBERTa-v2 with Inductor's combo
kernels spend its time (session 35's combo35: no result after 290 s, where torch's own
compiled in 86 s)? One mode per process (`python tools/probe35.py deberta_v2 aotgrad_combo`):
the Python stacks every 45 s, then the first step's seconds and aotgrad's stage times."""
import faulthandler
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import models as bench_models  # noqa: E402
import run as bench  # noqa: E402

model_name, mode = sys.argv[1], sys.argv[2]
# PROBE_STACKS=0: no timed dumps (faulthandler's crashed 2.11's process twice: probe35, probe35b)
if os.environ.get("PROBE_STACKS", "1") == "1":
    faulthandler.dump_traceback_later(45, repeat=True)
device = sys.argv[3] if len(sys.argv) > 3 else "cuda"
job = bench.Job(model_name, bench_models.MODES[mode], None, device == "cpu", device, 0, 1)
model, batch, use_autocast = bench.prepare(job)
sink = []
compiled = bench.MODES[job.mode].compile(model, None, sink)
step = bench.make_step(model, compiled, batch, use_autocast)
t0 = time.perf_counter()
step()
print(f"{model_name}/{mode}: first step {time.perf_counter() - t0:.1f} s", flush=True)
faulthandler.cancel_dump_traceback_later()
print(bench.compile_facts(sink, job.mode).get("stages"))
