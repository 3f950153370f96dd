"""Per-call overhead as instructions: bench/overhead.py's cases, counted by callgrind.

    python bench/overhead_instructions.py [--calls 300] [--baseline REV] [--out DIR]

On a shared machine the time of a 100 us call moves by 10-50% between rounds (session 26:
the same eager call took 15.7 and 27.6 us minutes apart, two helpers compiling beside it).
Instructions executed do not move: one process runs every (case, mode, path) of
bench/overhead.py under valgrind's callgrind, and each measured window (`--calls` calls,
after 20 warm-up calls) is counted alone. Instructions are not time: a Python frame runs
fewer instructions per cycle than an ATen kernel, so aotgrad's time ratio to eager is
higher than its instruction ratio. Read them to see what a change costs, not as a speed.

The windows are marked by two builtins the measured code never calls: `divmod` zeroes the
counters (callgrind's --zero-before), `ascii` writes them out (--dump-before). Needs
valgrind; about 5 minutes, most of it importing torch under valgrind. `--cache-sim` adds
callgrind's simulated cache misses and mispredicted branches, which tell part of why the
time ratio is higher than the instruction ratio.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import pathlib
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading

BENCH = str(pathlib.Path(__file__).resolve().parent)  # where overhead.py is


def worker(calls: int, baseline: str | None, windows_path: str) -> None:
    """Under callgrind: each window's (case, mode, path) to `windows_path`, in order."""
    sys.path.insert(0, BENCH)
    import torch
    import overhead
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        package = overhead.baseline_package(baseline, scratch) if baseline else None
        cases = overhead.candidates(package)
        # callgrind counts every thread: none still running from the compiles (aotgrad's
        # probe of the CPU's vector instructions) is to be counted in the first windows.
        for thread in threading.enumerate():
            if thread is not threading.current_thread():
                thread.join(timeout=120)
        windows = []
        for case, (paths, args) in cases.items():
            for mode, step in overhead.MODES.items():
                for path, fn in paths.items():
                    for _ in range(20):
                        step(fn, args)
                    # No full collection over the compiles' objects left to land in a window.
                    gc.collect()
                    gc.freeze()
                    divmod(1, 1)
                    for _ in range(calls):
                        step(fn, args)
                    ascii(0)
                    windows.append((case, mode, path))
    pathlib.Path(windows_path).write_text(json.dumps(windows))


def count(calls: int, baseline: str | None, cache_sim: bool = False) -> list[dict]:
    """Events per call of each window, counted in one process under callgrind: instructions
    (Ir), and with `cache_sim` its simulated cache misses and mispredicted branches."""
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed")
    with tempfile.TemporaryDirectory() as out:
        windows_path = f"{out}/windows.json"
        # Fixed string hashes and addresses: dict and set probes, and caches keyed by id,
        # would otherwise differ between processes. (The first window, eager's fwd+bwd of
        # the function, still moves between runs: 242.9k to 336.7k; cause not found.)
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        no_aslr = ["setarch", platform.machine(), "-R"] if shutil.which("setarch") else []
        command = [*no_aslr, "valgrind", "--tool=callgrind", "--zero-before=builtin_divmod",
                   "--dump-before=builtin_ascii", f"--callgrind-out-file={out}/cg",
                   *(["--cache-sim=yes", "--branch-sim=yes"] if cache_sim else []),
                   sys.executable, __file__, "--worker", windows_path, "--calls", str(calls)]
        command += ["--baseline", baseline] if baseline else []
        subprocess.run(command, check=True, capture_output=True, env=env)
        windows = json.loads(pathlib.Path(windows_path).read_text())
        dumps = sorted(pathlib.Path(out).glob("cg.*"), key=lambda p: int(p.suffix[1:]))
        if len(dumps) != len(windows):  # a marker ran inside a window: the counts are off
            raise RuntimeError(f"{len(dumps)} dumps for {len(windows)} windows")
        return [{"case": case, "mode": mode, "path": path,
                 **{event: total / calls for event, total in _summary(dump).items()}}
                for (case, mode, path), dump in zip(windows, dumps)]


def _summary(dump: pathlib.Path) -> dict[str, int]:
    """The dump's total of each event: Ir (instructions); with the simulators also I1mr,
    D1mr, D1mw (first-level cache misses), Bcm, Bim (mispredicted branches), ..."""
    text = dump.read_text()
    events = re.search(r"^events: (.+)$", text, re.M).group(1).split()
    totals = re.search(r"^summary: (.+)$", text, re.M).group(1).split()
    return dict(zip(events, map(int, totals)))


def markdown(meta: dict, rows: list[dict]) -> str:
    paths = list(dict.fromkeys(r["path"] for r in rows))
    by = {(r["case"], r["mode"], r["path"]): r["Ir"] for r in rows}
    lines = [f"# Per-call overhead in instructions ({meta['date']}, torch {meta['torch']})", "",
             "Thousands of instructions per call (callgrind), and each path's ratio to eager. "
             "Not time: see the script's docstring.", "",
             "| case | mode | " + " | ".join(f"{p} (k)" for p in paths) + " | "
             + " | ".join(f"{p} / eager" for p in paths if p != "eager") + " |",
             "|---|---|" + "---:|" * (2 * len(paths) - 1)]
    for case, mode in dict.fromkeys((r["case"], r["mode"]) for r in rows):
        counts = [by[case, mode, p] for p in paths]
        ratios = [by[case, mode, p] / by[case, mode, "eager"] for p in paths if p != "eager"]
        lines.append(f"| {case} | {mode} | " + " | ".join(f"{c / 1e3:.1f}" for c in counts)
                     + " | " + " | ".join(f"{r:.3f}" for r in ratios) + " |")
    if "Bcm" in rows[0]:
        lines += ["", "Simulated misses per call: first-level instruction and data cache "
                  "(I1mr, D1mr + D1mw), mispredicted conditional and indirect branches "
                  "(Bcm + Bim).", "", "| case | mode | path | I1 | D1 | branches |",
                  "|---|---|---|---:|---:|---:|"]
        lines += [f"| {r['case']} | {r['mode']} | {r['path']} | {r['I1mr']:.0f} "
                  f"| {r['D1mr'] + r['D1mw']:.0f} | {r['Bcm'] + r['Bim']:.0f} |" for r in rows]
    if meta.get("baseline"):
        lines += ["", f"baseline: aotgrad as of `{meta['baseline']}`, in the same process."]
    lines += ["", f"Settings: {meta['calls']} calls per window, 1 intra-op thread."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--baseline", help="also count aotgrad as of this git revision")
    parser.add_argument("--cache-sim", action="store_true",
                        help="also simulate caches and branch prediction (3x slower)")
    parser.add_argument("--out", help="write overhead_instructions.json/.md here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.calls, args.baseline, args.worker)
    import torch
    rows = count(args.calls, args.baseline, args.cache_sim)
    meta = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "calls": args.calls, "baseline": args.baseline}
    sys.path.insert(0, BENCH)
    import overhead
    overhead.publish(markdown(meta, rows), meta, rows, args.out, "overhead_instructions")


if __name__ == "__main__":
    main()
