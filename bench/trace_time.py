"""aotgrad's trace against torch's `aot_trace_joint_graph`, on the same Dynamo graph.

    python bench/trace_time.py --model deberta_v2 --small                 # CPU, in one process
    python bench/trace_time.py --model deberta_v2 --small --baseline DIR  # + another checkout
    python bench/trace_time.py --model deberta_v2 --small --cold          # a process per trace
    python bench/trace_time.py --model bert --small --cuda-dropout        # the GPU's trace path
    python bench/trace_time.py --model deberta_v2 --device cuda --autocast --profile DIR

Each round, each side compiles the model's loss (bench/run.py's models; one Dynamo graph) with
Inductor's decompositions and no-op compilers, inside Dynamo as a real compile runs (its fake
mode), so that only the front half of a compile runs: aotgrad's capture, analysis and trace
(its pipeline's timer), torch's AOTAutograd metadata pass and joint trace (its `dynamo_timed`
phases). After `--warmup` untimed rounds, sides take turns, the order flipping every round;
each side's minimum and all its rounds are printed, with the fake-tensor cache's hits, misses and bypasses during the compile
(Dynamo's own included).

`--baseline DIR`: DIR holds another aotgrad package (`git archive COMMIT aotgrad | tar -x -C
DIR`), loaded beside this one as the package `aotgrad_baseline`: before and after a change,
timed in the same process. `--cold`: each trace the first of a fresh process (one-time costs included:
first calls, caches; Inductor is imported before the timers on both sides, as torch's
`inductor` backend does). `--profile DIR`: a cProfile of each side's last round.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

BENCH_DIR = Path(__file__).resolve().parent
os.environ.setdefault("AOTGRAD_CACHE", "0")  # every trace a first one
sys.path.insert(0, str(BENCH_DIR))
import torch  # noqa: E402
import run as bench  # noqa: E402  (bench/run.py: the models; it puts this checkout first)

TORCH_STAGES = ("aot_collect_metadata", "aot_trace_joint_graph")
OUR_STAGES = ("capture", "analysis", "trace")


def prepared(args) -> tuple[torch.nn.Module, tuple, Callable]:
    """The loss module, its batch, and the context its forward runs in."""
    if args.cuda_dropout:
        torch.nn.functional.dropout = _native_dropout
    torch.manual_seed(0)
    model, batch = bench.MODELS[args.model].build(args.small)
    model = model.to(args.device).train()
    batch = tuple(t.to(args.device) for t in batch)
    context = (lambda: torch.autocast(args.device.split(":")[0], torch.bfloat16)) \
        if args.autocast else contextlib.nullcontext
    return model, batch, context


def _native_dropout(input, p=0.5, training=True, inplace=False):
    """Dropout as CUDA runs it: one functional `native_dropout` (the CPU's draws its mask
    in place, which sends aotgrad's traces down the functionalized path of pure.py)."""
    if not training or p == 0:
        return input
    return torch.ops.aten.native_dropout.default(input, p, True)[0]


def compiled_once(prepared_model, side: Callable) -> dict[str, float]:
    """The stages of `side` compiling the model's one Dynamo graph, in Dynamo's own context
    (its fake mode and shape env, as a real compile has them)."""
    model, batch, context = prepared_model
    torch._dynamo.reset()
    stages = []

    def backend(gm, example_inputs):
        compiled, timings = side(gm, example_inputs)
        stages.append(timings)
        return compiled
    with context():
        torch.compile(model, backend=backend)(*batch)
    if len(stages) != 1:
        raise SystemExit(f"{len(stages)} Dynamo graphs; this tool times one")
    return stages[0]


def load_aotgrad(checkout: str | None):
    """This checkout's aotgrad, or the one in `checkout` as the package `aotgrad_baseline`
    (aotgrad imports itself relatively only)."""
    if checkout is None:
        import aotgrad
        return aotgrad
    init = Path(checkout, "aotgrad", "__init__.py")
    spec = importlib.util.spec_from_file_location("aotgrad_baseline", init,
                                                  submodule_search_locations=[str(init.parent)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["aotgrad_baseline"] = module
    spec.loader.exec_module(module)
    return module


def ours(package) -> Callable:
    """aotgrad's Dynamo backend: Inductor's decompositions, the eager backend's compiler (its
    compile stages are not timed here); the stages of the pipeline's timer."""
    dynamo = importlib.import_module(f"{package.__name__}.dynamo")
    compilers = importlib.import_module(f"{package.__name__}.backends.compilers")
    schema = importlib.import_module(f"{package.__name__}.schema")
    nop = compilers.eager_compiler
    backend = dynamo.make_backend(backend=schema.Backend(
        nop, nop, nop, compilers.INDUCTOR_DECOMPOSITIONS))

    def compile_(gm, example_inputs) -> tuple[Callable, dict[str, float]]:
        compiled = backend(gm, example_inputs)
        return compiled, {k: compiled.artifact.timings[k] for k in OUR_STAGES}
    return compile_


def torchs() -> Callable:
    """torch's AOTAutograd as its `inductor` backend calls it (Inductor's decompositions),
    with no-op compilers; its `dynamo_timed` phases."""
    from functorch.compile import nop
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.utils import compilation_time_metrics
    from torch._inductor.decomposition import select_decomp_table
    backend = aot_autograd(fw_compiler=nop, bw_compiler=nop, decompositions=select_decomp_table())

    def compile_(gm, example_inputs) -> tuple[Callable, dict[str, float]]:
        before = {k: len(compilation_time_metrics.get(k, ())) for k in TORCH_STAGES}
        compiled = backend(gm, example_inputs)
        return compiled, {k: sum(compilation_time_metrics[k][before[k]:]) for k in TORCH_STAGES}
    return compile_


def sides(args) -> dict[str, Callable]:
    chosen = {"aotgrad": lambda: ours(load_aotgrad(None)), "torch": torchs}
    if args.baseline:
        chosen["baseline"] = lambda: ours(load_aotgrad(args.baseline))
    return {name: make() for name, make in chosen.items() if name in args.sides}


def timed(side: Callable, prepared_model, profile: str | None) -> dict:
    """One compile's stages, its fake-tensor cache counts, and (`profile`) its cProfile."""
    profiler = cProfile.Profile() if profile else None

    def profiled(gm, example_inputs):
        with profiler or contextlib.nullcontext():
            return side(gm, example_inputs)
    cache = _fake_cache_counts()
    stages = compiled_once(prepared_model, profiled)
    if profiler:
        profiler.dump_stats(profile)
    return {**stages, **{k: v - cache[k] for k, v in _fake_cache_counts().items()}}


def _fake_cache_counts() -> dict[str, int]:
    """Fake tensors' op cache (shared by every fake mode): a miss or a bypass runs the op's
    meta function (or its decomposition) in Python."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    info = FakeTensorMode.cache_info()
    return {"fake_cache_hits": info.hits, "fake_cache_misses": info.misses,
            "fake_cache_bypasses": sum(info.bypasses.values())}


def in_process(args) -> dict[str, list[dict]]:
    model = prepared(args)
    chosen = sides(args)
    for _ in range(args.warmup):  # first calls, caches: the same start for every side
        for side in chosen.values():
            timed(side, model, None)
    rounds: dict[str, list[dict]] = {name: [] for name in chosen}
    for r in range(args.rounds):
        last = r == args.rounds - 1
        for name in (list(chosen) if r % 2 == 0 else list(chosen)[::-1]):
            profile = str(Path(args.profile, f"{name}.prof")) if args.profile and last else None
            rounds[name].append(timed(chosen[name], model, profile))
    return rounds


def cold(args) -> dict[str, list[dict]]:
    """Each round, each side in a fresh process of its own (this script, --worker)."""
    names = [s for s in args.sides if s != "baseline" or args.baseline]
    rounds: dict[str, list[dict]] = {name: [] for name in names}
    for r in range(args.rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            command = [sys.executable, __file__, "--worker", name, *_passed_on(args)]
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            rounds[name].append(json.loads(out.strip().splitlines()[-1]))
    return rounds


def _passed_on(args) -> list[str]:
    flags = ["--model", args.model, "--device", args.device]
    flags += ["--small"] * args.small + ["--autocast"] * args.autocast
    flags += ["--cuda-dropout"] * args.cuda_dropout
    return flags + (["--baseline", args.baseline] if args.baseline else [])


def worker(args) -> dict:
    """One side's first trace in this process; Inductor imported first, as torch's backend
    imports it before AOTAutograd starts (aotgrad's trace would import it otherwise)."""
    model = prepared(args)
    start = time.perf_counter()
    import torch._inductor.compile_fx  # noqa: F401
    inductor_import = time.perf_counter() - start
    side = sides(argparse.Namespace(**{**vars(args), "sides": [args.worker]}))[args.worker]
    return {**timed(side, model, None), "inductor_import": inductor_import}


def report(rounds: dict[str, list[dict]]) -> None:
    for name, results in rounds.items():
        for key in results[0]:
            values = [r[key] for r in results]
            unit, spell = (" s", "{:.3f}") if isinstance(values[0], float) else ("  ", "{}")
            print(f"{name:9} {key:22} min {spell.format(min(values)):>7}{unit}   rounds "
                  + " ".join(spell.format(v) for v in values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="deberta_v2", choices=sorted(bench.MODELS))
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--autocast", action="store_true", help="bf16 autocast, as on the GPU")
    parser.add_argument("--cuda-dropout", action="store_true",
                        help="dropout as on CUDA (native_dropout): the GPU's trace path on CPU")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    parser.add_argument("--sides", default="aotgrad,baseline,torch")
    parser.add_argument("--baseline", help="another aotgrad checkout, timed beside this one")
    parser.add_argument("--cold", action="store_true", help="a fresh process per trace")
    parser.add_argument("--profile", help="directory for each side's cProfile (last round)")
    parser.add_argument("--json", help="write every round here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.sides = args.sides.split(",")
    if args.worker:
        print(json.dumps(worker(args)))
        return
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    rounds = cold(args) if args.cold else in_process(args)
    report(rounds)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rounds": rounds}, indent=1))


if __name__ == "__main__":
    main()
