"""Session 37: where DeBERTa-v2's host time goes, per mode, in one process. Its aotgrad step
is host-bound and 1.25-1.32x torch's in every interleaved process measured (sessions 34, 36,
37), with equal GPU work (session 31) and parity on the CPU (a tiny DeBERTa-v2, 5.26 vs 5.14
ms a step in a four-mode process). This compiles the modes in one process, times them in
turns (host and CUDA-event medians), then profiles a few steps of each with cProfile:
the functions whose own time differs most between the first two modes, and each mode's
top functions. The profiles are written to $OUT (or the directory given) as .pstats.

    python tools/probe37.py deberta_v2 inductor,aotgrad [OUT]
"""
import cProfile
import os
import pstats
import statistics
import sys
import time

sys.path.insert(0, "bench")
import torch  # noqa: E402

import interleaved  # noqa: E402
import models  # noqa: E402
import run as bench  # noqa: E402

model, modes = sys.argv[1], sys.argv[2].split(",")
out = sys.argv[3] if len(sys.argv) > 3 else os.environ.get("OUT", "/tmp")
cuda = torch.cuda.is_available()
sync = torch.cuda.synchronize if cuda else (lambda: None)
models._allow_recompiles(len(modes))

steps = {}
for mode in modes:
    t0 = time.perf_counter()
    job = bench.Job(model, models.MODES[mode], None, not cuda, "cuda" if cuda else "cpu", 3, 3)
    steps[mode] = interleaved.compiled_step(job)
    print(f"{mode}: compiled and warmed in {time.perf_counter() - t0:.1f} s", flush=True)

timed = {m: [] for m in modes}
for r in range(8):
    for mode in modes if r % 2 == 0 else modes[::-1]:
        for _ in range(3):
            timed[mode].append(bench.time_step(steps[mode], cuda))
for mode in modes:
    host = statistics.median(t["host"] for t in timed[mode]) * 1e3
    step = statistics.median(t["step"] for t in timed[mode]) * 1e3
    print(f"{mode}: host {host:.2f} ms, step {step:.2f} ms (medians of {len(timed[mode])})")

PROFILED = 6
stats = {}
for mode in modes:
    profile = cProfile.Profile()
    sync()
    profile.enable()
    for _ in range(PROFILED):
        steps[mode]()
    profile.disable()
    sync()
    profile.dump_stats(f"{out}/{model}-{'+'.join(modes)}-{mode}.pstats")
    stats[mode] = pstats.Stats(profile).stats  # (file, line, name) -> (cc, nc, tt, ct, callers)


def own_ms(mode):
    return {f"{k[0].split('site-packages/')[-1]}:{k[1]}({k[2]})": (v[2] / PROFILED * 1e3,
                                                                    v[1] / PROFILED)
            for k, v in stats[mode].items()}


per_mode = {mode: own_ms(mode) for mode in modes}
for mode in modes:
    total = sum(ms for ms, _ in per_mode[mode].values())
    print(f"\n== {mode}: {total:.2f} ms a step under the profiler; top own time:")
    for name, (ms, calls) in sorted(per_mode[mode].items(), key=lambda kv: -kv[1][0])[:25]:
        print(f"  {ms:8.3f} ms {calls:8.1f} calls  {name}")
if len(modes) > 1:
    a, b = modes[:2]
    names = set(per_mode[a]) | set(per_mode[b])
    diff = {n: (per_mode[b].get(n, (0, 0)), per_mode[a].get(n, (0, 0))) for n in names}
    print(f"\n== own time a step, {b} less {a} (largest either way):")
    for name, ((mb, cb), (ma, ca)) in sorted(diff.items(),
                                             key=lambda kv: -abs(kv[1][0][0] - kv[1][1][0]))[:40]:
        print(f"  {mb - ma:+8.3f} ms  ({cb:7.1f} vs {ca:7.1f} calls)  {name}")
