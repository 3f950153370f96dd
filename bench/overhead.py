"""Per-call overhead: a tiny function and a tiny module, eager vs aotgrad vs functorch.

    python bench/overhead.py [--calls 500] [--repeats 20] [--baseline main] [--out bench/results]

Kernels take a microsecond or two here, so a call's time is the host overhead of each path.
Every candidate runs `--calls` calls in a row, the candidates take turns (interleaved) for
`--repeats` rounds, and each keeps its fastest round, by two clocks: the process's CPU time
(what the table shows: time the process spent descheduled on a shared machine does not
count) and wall time. The ratios of these minimums are what to read. Cases: forward+backward with grad on, and forward alone
under torch.no_grad(). aotgrad uses the "eager" backend, its compat door `nop`; functorch's aot_function /
aot_module with the `nop` compiler is the reference where it imports. `--baseline REV` adds
aotgrad as of a git revision (its package extracted under another name) to the same rounds.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import importlib
import platform
import subprocess
import sys
import tempfile
import time
from typing import Callable

import torch
from torch import nn

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
import aotgrad  # noqa: E402
from aotgrad import compat  # noqa: E402


def tiny_function(x):
    return (x.sin() * 2).sum()


class TinyMLP(nn.Module):
    """bench/run.py's `tiny` model: two 16-wide layers and a squared mean."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 16), nn.GELU())

    def forward(self, x):
        return self.net(x).square().mean()


def functorch_versions(fn: Callable, module: nn.Module) -> dict[str, Callable]:
    try:  # comparison only: aotgrad itself never imports functorch.compile
        from functorch.compile import aot_function, aot_module, nop
    except ImportError:
        return {}
    return {"function": aot_function(fn, nop), "module": aot_module(module, nop)}


def baseline_package(rev: str, into: str):
    """aotgrad as of git revision `rev`, imported as a package of another name."""
    archive = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", rev, "aotgrad"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    name = "aotgrad_at_" + "".join(c if c.isalnum() else "_" for c in rev)
    pathlib.Path(into, "aotgrad").rename(pathlib.Path(into, name))  # relative imports only
    sys.path.insert(0, into)
    return importlib.import_module(name)


def candidates(baseline=None) -> dict[str, tuple[dict[str, Callable], tuple]]:
    """case -> ({path: callable}, arguments)."""
    torch.manual_seed(0)
    module = TinyMLP()
    cases = {"function": ({"eager": tiny_function}, (torch.randn(4, requires_grad=True),)),
             "module": ({"eager": module}, (torch.randn(8, 16),))}
    versions = {"aotgrad": aotgrad, **({"baseline": baseline} if baseline else {})}
    for name, package in versions.items():
        cases["function"][0][name] = package.compile(tiny_function, backend="eager")
        cases["module"][0][name] = package.compile(module, backend="eager")
    # The compat door (a drop-in for functorch's compile module) with `nop`: a row each door.
    cases["function"][0]["compat"] = compat.aot_function(tiny_function, compat.nop)
    cases["module"][0]["compat"] = compat.aot_module(module, compat.nop)
    for case, fn in functorch_versions(tiny_function, module).items():
        cases[case][0]["functorch"] = fn
    return cases


def forward_backward(fn: Callable, args: tuple) -> None:
    fn(*args).backward()


def forward_no_grad(fn: Callable, args: tuple) -> None:
    with torch.no_grad():
        fn(*args)


MODES = {"fwd+bwd": forward_backward, "no_grad": forward_no_grad}


CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}


def time_calls(step: Callable, fn: Callable, args: tuple, calls: int) -> dict[str, float]:
    """Microseconds per call, by each clock."""
    start = {name: clock() for name, clock in CLOCKS.items()}
    for _ in range(calls):
        step(fn, args)
    return {name: (clock() - start[name]) / calls * 1e6 for name, clock in CLOCKS.items()}


def measure(paths: dict[str, Callable], args: tuple, step: Callable, calls: int,
            repeats: int) -> dict[str, dict[str, float]]:
    """clock -> path -> microseconds per call: the fastest round, the paths interleaved."""
    for fn in paths.values():
        for _ in range(20):  # compile, then warm caches
            step(fn, args)
    best = {clock: {name: float("inf") for name in paths} for clock in CLOCKS}
    for _ in range(repeats):
        for name, fn in paths.items():
            for clock, us in time_calls(step, fn, args, calls).items():
                best[clock][name] = min(best[clock][name], us)
    return best


def run(calls: int, repeats: int, baseline=None) -> list[dict]:
    rows = []
    for case, (paths, args) in candidates(baseline).items():
        for mode, step in MODES.items():
            best = measure(paths, args, step, calls, repeats)
            rows.append({"case": case, "mode": mode, "us": best["cpu"], "wall_us": best["wall"],
                         "ratio_to_eager": _ratios(best["cpu"]),
                         "wall_ratio_to_eager": _ratios(best["wall"])})
    return rows


def _ratios(us: dict[str, float]) -> dict[str, float]:
    return {name: us[name] / us["eager"] for name in us if name != "eager"}


def markdown(meta: dict, rows: list[dict]) -> str:
    lines = [f"# Per-call overhead ({meta['date']}, torch {meta['torch']}, {meta['device']})", "",
             "Microseconds of process CPU time per call, fastest of the interleaved rounds; "
             "ratios against eager (by wall time in the last column). aotgrad: "
             "`aotgrad.compile(..., backend=\"eager\")`; compat: `aotgrad.compat.aot_function`/"
             "`aot_module` with `nop`; functorch: torch's `aot_function`/`aot_module` with `nop`.",
             "",
             "| case | mode | eager (us) | aotgrad (us) | compat (us) | functorch (us) "
             "| aotgrad / eager | compat / eager | functorch / eager | aotgrad / eager (wall) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        us, ratio = r["us"], r["ratio_to_eager"]
        theirs = f"{us['functorch']:.1f}" if "functorch" in us else "-"
        theirs_ratio = f"{ratio['functorch']:.2f}" if "functorch" in ratio else "-"
        lines.append(f"| {r['case']} | {r['mode']} | {us['eager']:.1f} | {us['aotgrad']:.1f} "
                     f"| {us['compat']:.1f} | {theirs} | {ratio['aotgrad']:.2f} "
                     f"| {ratio['compat']:.2f} | {theirs_ratio} "
                     f"| {r['wall_ratio_to_eager']['aotgrad']:.2f} |")
    if meta.get("baseline"):
        lines += ["", f"aotgrad as of `{meta['baseline']}`, in the same rounds:", ""]
        lines += [f"- {r['case']} {r['mode']}: {r['us']['baseline']:.1f} us, "
                  f"{r['ratio_to_eager']['baseline']:.2f}x eager" for r in rows]
    lines += ["", f"Settings: {meta['calls']} calls per round, {meta['repeats']} rounds, "
              f"{meta['threads']} intra-op thread(s)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--baseline", help="also time aotgrad as of this git revision")
    parser.add_argument("--out", default=None, help="write overhead_cpu.json/.md here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as scratch:
        baseline = baseline_package(args.baseline, scratch) if args.baseline else None
        rows = run(args.calls, args.repeats, baseline)
    meta = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "device": f"CPU (this machine: {platform.machine()}, {torch.get_num_threads()} "
                      "thread)", "calls": args.calls, "repeats": args.repeats,
            "threads": args.threads, "baseline": args.baseline}
    publish(markdown(meta, rows), meta, rows, args.out, "overhead_cpu")


def publish(text: str, meta: dict, rows: list[dict], out: str | None, stem: str) -> None:
    """Print the table; with `out`, write it and the rows as STEM.md and STEM.json there."""
    print(text)
    if out:
        folder = pathlib.Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{stem}.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
        (folder / f"{stem}.md").write_text(text)


if __name__ == "__main__":
    main()
