"""OpInfo sweep: every op of PyTorch's op database, run eagerly and through `aotgrad.compile`.

For each OpInfo, on CPU in float32, the first N sample inputs run eagerly and compiled, on
identical copies. Forward outputs, input values after the call and the gradients of a fixed
random projection of the outputs must match eager. Ops that cannot be compared (random,
eager raises, outputs that are not comparable) are skipped with a reason; every failure is
filed under a cause by an ordered rule table, so the report reads as a to-do list.

The `double_backward` pass instead compares second-order gradients, for the ops whose OpInfo
supports gradgrad, in float64 where the op supports it: the first-order gradients taken with
create_graph=True, then the gradients of a random projection of them. The `dynamic` pass
compiles with `dynamic=True` and calls the same compiled function on the sample, then on the
sample grown (`tools/opdb_grow.py`), noting whether the first graph served it or the shape
guards asked for another. Several passes print their pass rates side by side. Per-op
knowledge lives in `tools/opdb_tables.py`, the comparisons in `tools/opdb_compare.py`.

    python -m tools.opdb_sweep --samples 1 --every 10
    python -m tools.opdb_sweep --ops add,nn.functional.conv2d --json /tmp/opdb.json
    python -m tools.opdb_sweep --pass static,double_backward --samples 1 --every 4
    python -m tools.opdb_sweep --pass static,dynamic --samples 1 --every 10
    python -m tools.opdb_sweep --decomposed --budget 0 --samples 1   # recomputing the most
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import functools
import itertools
import json
import re
import signal
import sys
import threading
import time
import traceback
import warnings
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import torch
import torch.utils._pytree as pytree

import aotgrad
from tools.opdb_compare import (Skip, Mismatch, comparison, require_comparable, compare_outputs,
                                compare_values, compare_aliasing, compare_strides, compare_grads,
                                compare_grad_lists, differentiable_outputs, fixed_weights,
                                input_grads)
from tools.opdb_grow import grow_tensors
from tools.opdb_tables import (RANDOM_NAME_PARTS, NOT_RANDOM, RANDOM_OPS, UNINITIALIZED_OPS,
                               SLOW_OPS, OP_TIME_LIMIT_S, DEFAULT_TOLERANCE, TOLERANCES,
                               FAILURE_RULES)

# ---- results -------------------------------------------------------------------------------

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


@dataclass(frozen=True)
class OpResult:
    op: str  # op name, plus ".variant" when the OpInfo has a variant_test_name
    status: str  # PASSED, FAILED or SKIPPED
    reason: str = ""  # the failure group, or why the op was skipped
    detail: str = ""  # the raw message and where it was raised, for diagnosis
    seconds: float = 0.0
    note: str = ""  # dynamic pass: what the grown sample did (SERVED, RECOMPILED, NOT_GROWN)


@dataclass(frozen=True)
class SweepResult:
    results: tuple[OpResult, ...]
    samples: int
    backend: str
    pass_name: str = "static"

    def with_status(self, status: str) -> list[OpResult]:
        return [r for r in self.results if r.status == status]

    def failure_groups(self) -> list[tuple[str, list[str]]]:
        """(cause, op ids), the most frequent cause first."""
        groups: dict[str, list[str]] = collections.defaultdict(list)
        for r in self.with_status(FAILED):
            groups[r.reason].append(r.op)
        return sorted(groups.items(), key=lambda item: (-len(item[1]), item[0]))

    def skip_counts(self) -> collections.Counter:
        """Skips per category: the reason up to its first colon."""
        return collections.Counter(r.reason.split(":")[0] for r in self.with_status(SKIPPED))

    def pass_rate(self) -> str:
        passed = len(self.with_status(PASSED))
        run = len(self.results) - len(self.with_status(SKIPPED))
        return f"{passed} / {run} ({100 * passed / max(run, 1):.1f}%)"

    def summary(self) -> str:
        passed, failed = len(self.with_status(PASSED)), len(self.with_status(FAILED))
        run = passed + failed
        skips = ", ".join(f"{k} {n}" for k, n in self.skip_counts().most_common())
        lines = [f"aotgrad OpInfo sweep: pass={self.pass_name}, backend={self.backend}, "
                 f"samples={self.samples}, ops={len(self.results)}",
                 f"passed {passed} / run {run} ({100 * passed / max(run, 1):.1f}%); "
                 f"skipped {len(self.results) - run} ({skips})"]
        notes = collections.Counter(r.note for r in self.with_status(PASSED) if r.note)
        lines += [f"  {note}: {n} ops" for note, n in notes.most_common()]
        lines.append(f"failures by cause ({failed} ops in {len(self.failure_groups())} groups):")
        for cause, ops in self.failure_groups():
            lines += [f"  [{len(ops)}] {cause}", f"      {', '.join(ops)}"]
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"pass": self.pass_name, "samples": self.samples, "backend": self.backend,
                "passed": len(self.with_status(PASSED)), "failed": len(self.with_status(FAILED)),
                "skipped": len(self.with_status(SKIPPED)),
                "groups": {cause: ops for cause, ops in self.failure_groups()},
                "results": [dataclasses.asdict(r) for r in self.results]}


class OpTimeout(BaseException):
    """A BaseException, so that torch's internal `except Exception` handlers let it through."""


# ---- choosing ops --------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def all_ops() -> tuple:
    from torch.testing._internal.common_methods_invocations import op_db
    return tuple(op_db)


def op_id(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def is_random(name: str) -> bool:
    if name in NOT_RANDOM:
        return False
    return name in RANDOM_OPS or any(part in name for part in RANDOM_NAME_PARTS)


def static_skip_reason(op, seeded_random: bool = False) -> str | None:
    """Why the op cannot be compared at all, decided before running it; None if it can.
    With `seeded_random`, random ops can: eager and compiled draw alike from one seed."""
    name = op_id(op)
    if is_random(name) and not seeded_random:
        return "random output"
    if name in UNINITIALIZED_OPS:
        return "uninitialized output"
    if name in SLOW_OPS:
        return f"slow: {SLOW_OPS[name]}"
    if torch.float32 not in op.supported_dtypes("cpu"):
        return "float32 unsupported"
    return None


def select_ops(names: Iterable[str] | None = None, every: int = 1,
               comparable_only: bool = False) -> list:
    """Ops by id or name (all when None), then every `every`-th of them."""
    ops = list(all_ops())
    if names is not None:
        wanted = set(names)
        ops = [op for op in ops if op_id(op) in wanted or op.name in wanted]
        unknown = wanted - {op_id(op) for op in ops} - {op.name for op in ops}
        if unknown:
            raise ValueError(f"not in op_db: {sorted(unknown)}")
    if comparable_only:
        ops = [op for op in ops if static_skip_reason(op) is None]
    return ops[::every]


# ---- running one op ------------------------------------------------------------------------

def run_sweep(ops: Iterable[str] | None = None, samples: int = 2, backend: str = "eager",
              sample_every: int = 1, progress: Callable[[OpResult], None] | None = None,
              pass_name: str = "static") -> SweepResult:
    """Run every selected op (all of op_db by default) and collect the results.

    >>> run_sweep(["sin", "bernoulli"], samples=1).skip_counts()
    Counter({'random output': 1})
    """
    results = []
    for op in select_ops(ops, sample_every):
        results.append(run_op(op, samples, backend, pass_name=pass_name))
        if progress is not None:
            progress(results[-1])
    return SweepResult(tuple(results), samples, describe_backend(backend), pass_name)


def describe_backend(backend: str | dict) -> str:
    if isinstance(backend, str):
        return backend
    name = backend["backend"]
    name = name if isinstance(name, str) else "eager with Inductor's decompositions"
    return f"{name}, memory_budget={backend.get('memory_budget')}"


def decomposed(memory_budget: float | None = None) -> dict:
    """Compile options: the eager backend with Inductor's decompositions (the graphs Inductor
    partitions, run eagerly) and a memory budget."""
    from aotgrad.backends.compilers import _inductor_decompositions, eager_compiler
    from aotgrad.schema import Backend
    backend = Backend(eager_compiler, eager_compiler, eager_compiler, _inductor_decompositions())
    return {"backend": backend, "memory_budget": memory_budget}


def run_op(op, samples: int = 2, backend: str = "eager",
           time_limit: float | None = OP_TIME_LIMIT_S, pass_name: str = "static") -> OpResult:
    """One op, isolated: whatever it raises becomes a failure of this op alone."""
    name = op_id(op)
    sweep_pass = PASSES[pass_name]
    seeded_random = sweep_pass.seeds_random_ops and backend == "eager"
    reason = static_skip_reason(op, seeded_random) or sweep_pass.skip_reason(op)
    if reason is not None:
        return OpResult(name, SKIPPED, reason)
    start = time.perf_counter()
    try:
        with _quiet(), _time_limit(time_limit), torch.random.fork_rng(), torch.enable_grad():
            reasons, notes = _run_samples(op, samples, backend, sweep_pass)
    except Skip as skip:  # the sample inputs themselves could not be made
        return OpResult(name, SKIPPED, str(skip), seconds=time.perf_counter() - start)
    except (Exception, OpTimeout) as exc:
        return OpResult(name, FAILED, classify(exc), describe(exc), time.perf_counter() - start)
    seconds = time.perf_counter() - start
    if reasons and None not in reasons:
        return OpResult(name, SKIPPED, reasons[0], seconds=seconds)
    return OpResult(name, PASSED if reasons else SKIPPED, "" if reasons else "no samples",
                    seconds=seconds, note=min(notes, key=NOTE_ORDER.index, default=""))


def _run_samples(op, samples: int, backend: str, sweep_pass: "Pass"
                 ) -> tuple[list[str | None], list[str]]:
    """Per sample, None when it passed or the reason it was skipped (raises on failure); and
    the notes of the samples that passed."""
    reasons, notes = [], []
    for sample in first_samples(op, samples, sweep_pass.dtype(op)):
        try:
            note = sweep_pass.check(op, sample, backend)
            reasons.append(None)
        except Skip as skip:
            reasons.append(str(skip))
        else:
            notes += [note] if note else []
    return reasons, notes


def first_samples(op, n: int, dtype: torch.dtype = torch.float32) -> list:
    """The first `n` samples, the same in every run: the seed depends on the op alone."""
    torch.manual_seed(zlib.crc32(op_id(op).encode()))
    try:
        samples = op.sample_inputs("cpu", dtype, requires_grad=op.supports_autograd)
        return list(itertools.islice(samples, n))
    except Exception as exc:
        raise Skip(f"sample inputs raise: {type(exc).__name__}") from exc


def check_sample(op, sample, backend: str) -> None:
    """Eager and compiled agree on this sample, or raise `Mismatch` (or whatever aotgrad
    raised); `Skip` when eager itself raises or the outputs cannot be compared."""
    fn, tensors = sample_function(op, sample)
    compare_call(op, sample, fn, compile_with(fn, backend), tensors)


def compile_with(fn: Callable, backend: str | dict, **options) -> Callable:
    """`aotgrad.compile(fn)`: `backend` is a backend's name, or the compile's keyword
    arguments (a backend, a memory budget)."""
    given = dict(backend) if isinstance(backend, dict) else {"backend": backend}
    return aotgrad.compile(fn, **given, **options)


def compare_call(op, sample, fn: Callable, compiled: Callable, tensors) -> None:
    """One call of `compiled` against `fn` on copies of `tensors`: see `check_sample`."""
    eager_inputs, compiled_inputs = copy_tensors(tensors), copy_tensors(tensors)
    try:
        expected = fn(*eager_inputs)
    except Exception as exc:
        raise Skip(f"eager raises: {type(exc).__name__}") from exc
    require_comparable(expected)
    actual = compiled(*compiled_inputs)
    tolerance = TOLERANCES.get(op_id(op), DEFAULT_TOLERANCE)
    compare_outputs(actual, expected, tolerance)
    compare_aliasing((actual, compiled_inputs), (expected, eager_inputs))
    compare_values(compiled_inputs, eager_inputs, tolerance, "mismatch: inputs after call")
    if op.supports_autograd:
        compare_grads(sample, (actual, compiled_inputs), (expected, eager_inputs), tolerance)
    compare_strides(actual, expected)


def sample_function(op, sample) -> tuple[Callable, list[torch.Tensor]]:
    """`fn(*tensors)` calling the op on the sample, and the sample's tensors. Other leaves of
    the sample (ints, dtypes, ...) are constants of `fn`."""
    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]

    def fn(*tensors):
        flat = list(leaves)
        for i, t in zip(positions, tensors):
            flat[i] = t
        inp, args, kwargs = pytree.tree_unflatten(flat, spec)
        return op(inp, *args, **kwargs)

    fn.__name__ = op_id(op)
    return fn, [leaves[i] for i in positions]


def copy_tensors(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Fresh leaves with the same values, sizes, strides and storage offsets; a tensor given
    twice is copied once, so the copies alias as the originals do."""
    copies: dict[int, torch.Tensor] = {}
    return [copies.setdefault(id(t), _copy(t)) for t in tensors]


def _copy(t: torch.Tensor) -> torch.Tensor:
    if t.layout != torch.strided:
        return t.detach().clone().requires_grad_(t.requires_grad)
    with torch.no_grad():
        storage = t.untyped_storage().clone()
        copy = torch.empty(0, dtype=t.dtype, device=t.device)
        copy.set_(storage, t.storage_offset(), t.shape, t.stride())
    return copy.requires_grad_(t.requires_grad)


# ---- the double_backward pass --------------------------------------------------------------

# float64 has no rounding worth a tolerance: the replay runs eager's kernels, though it may
# sum gradient contributions in another order.
DOUBLE_TOLERANCE = {torch.float64: (1e-7, 1e-7)}
# The seed of both runs of a sample: random ops (OpInfo reseeds most of them itself, to 42).
RANDOM_OP_SEED = 42


def double_backward_skip_reason(op) -> str | None:
    if not op.supports_autograd or not op.supports_gradgrad:
        return "no gradgrad"
    return None


def double_backward_dtype(op) -> torch.dtype:
    return torch.float64 if torch.float64 in op.supported_dtypes("cpu") else torch.float32


def check_sample_double_backward(op, sample, backend: str) -> None:
    """First-order gradients taken with create_graph=True (values and whether they carry
    history), then the gradients of a random projection of them, against eager."""
    fn, tensors = sample_function(op, sample)
    eager_inputs, compiled_inputs = copy_tensors(tensors), copy_tensors(tensors)
    try:
        torch.manual_seed(RANDOM_OP_SEED)
        out = fn(*eager_inputs)
        require_comparable(out)
        expected = second_order_grads(sample, out, eager_inputs)
    except Skip:
        raise
    except Exception as exc:
        raise Skip(f"eager raises: {type(exc).__name__}") from exc
    if expected is None:
        raise Skip("no differentiable output")
    torch.manual_seed(RANDOM_OP_SEED)  # compiling draws nothing: tracing runs on fakes
    out = compile_with(fn, backend)(*compiled_inputs)
    state = torch.get_rng_state()
    actual = second_order_grads(sample, out, compiled_inputs)
    if not torch.equal(torch.get_rng_state(), state):
        raise Mismatch("mismatch: double backward draws", "the generator moved on")
    if actual is None:
        raise Mismatch("mismatch: requires_grad", "no differentiable output when compiled")
    tolerance = DOUBLE_TOLERANCE.get(tensors[0].dtype if tensors else None, DEFAULT_TOLERANCE)
    compare_grad_lists(actual[0], expected[0], tolerance, "create_graph grad")
    compare_history(actual[0], expected[0])
    compare_grad_lists(actual[1], expected[1], tolerance, "second-order grad")


def second_order_grads(sample, out: Any, inputs: Sequence[torch.Tensor]) -> tuple | None:
    """(first-order grads with create_graph=True, grads of a projection of those); None
    when nothing is differentiable."""
    outs = differentiable_outputs(sample, out)
    wrt = [t for t in inputs if t.requires_grad]
    if not outs or not wrt:
        return None
    first = input_grads(outs, fixed_weights(outs), wrt, create_graph=True)
    diff = [g for g in first if g is not None and g.requires_grad]
    if not diff:  # the op is linear in its inputs: no second-order term
        return first, [None] * len(wrt)
    return first, input_grads(diff, fixed_weights(diff, seed=1), wrt)


@comparison
def compare_history(actual: Sequence, expected: Sequence) -> None:
    for i, (a, e) in enumerate(zip(actual, expected)):
        if e is not None and a.requires_grad != e.requires_grad:
            raise Mismatch("mismatch: create_graph grad requires_grad",
                           f"input {i}: {a.requires_grad}, eager {e.requires_grad}")


# ---- the dynamic pass ----------------------------------------------------------------------

# Notes of the dynamic pass on the grown sample (`OpResult.note`); an op's note is its
# samples' first in this order.
SERVED, RECOMPILED, NOT_GROWN = ("grown sample served by the first graph",
                                 "grown sample compiled again (a guard failed)",
                                 "no grown sample (no dim >= 2, or eager refuses it)")
NOTE_ORDER = (RECOMPILED, SERVED, NOT_GROWN)


def check_sample_dynamic(op, sample, backend: str) -> str:
    """`check_sample` compiled with dynamic=True, then the same compiled function on the
    sample grown; returns whether the first graph served the grown sample."""
    fn, tensors = sample_function(op, sample)
    compiled = compile_with(fn, backend, dynamic=True)
    compare_call(op, sample, fn, compiled, tensors)
    refuse_static_fallback(compiled)
    grown = grow_tensors(tensors)
    if grown is None:
        return NOT_GROWN
    try:
        compare_call(op, sample, fn, compiled, grown)
    except Skip:  # eager refuses the grown sample (its constants fix some sizes)
        return NOT_GROWN
    refuse_static_fallback(compiled)
    return SERVED if compiled.num_compiles == 1 else RECOMPILED


def refuse_static_fallback(compiled) -> None:
    """A compile for dynamic shapes that fell back to static shapes fails the dynamic pass."""
    for exc in compiled.static_only.values():  # grouped by type: messages carry paths
        raise Mismatch(f"fell back to static: {type(exc).__name__}", describe(exc))


# ---- passes --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Pass:
    """What one kind of sweep checks per sample (returning a note, or None), in which dtype,
    and which ops it skips."""

    check: Callable[[Any, Any, str], str | None]
    dtype: Callable[[Any], torch.dtype]
    skip_reason: Callable[[Any], str | None]
    # Runs random ops too, eager and compiled from one seed: the eager backend draws the
    # numbers eager draws, and a double backward must draw nothing more.
    seeds_random_ops: bool = False


PASSES: dict[str, Pass] = {
    "static": Pass(check_sample, lambda op: torch.float32, lambda op: None),
    "double_backward": Pass(check_sample_double_backward, double_backward_dtype,
                            double_backward_skip_reason, seeds_random_ops=True),
    "dynamic": Pass(check_sample_dynamic, lambda op: torch.float32, lambda op: None),
}


# ---- classifying failures ------------------------------------------------------------------

def classify(exc: BaseException) -> str:
    """The cause group of a failure: a mismatch's own group, the first matching rule, or the
    exception type with its normalized first line."""
    if isinstance(exc, Mismatch):
        return exc.group
    text = f"{type(exc).__name__}: {exc}"
    for pattern, group in FAILURE_RULES:
        if re.search(pattern, text):
            return group
    return f"{type(exc).__name__}: {normalize_message(str(exc))}"


def normalize_message(message: str) -> str:
    """The first line, with what varies between ops (numbers, names of values, shapes)
    blanked, so that one cause reads the same for every op."""
    line = next((s.strip() for s in message.splitlines() if s.strip()), "")
    line = re.sub(r"0x[0-9a-fA-F]+", "0x?", line)
    line = re.sub(r"\[[^\]]*\]", "[...]", line)
    line = re.sub(r"\d+", "N", line)
    return line[:120]


def describe(exc: BaseException) -> str:
    """The message, and the innermost aotgrad frame that raised it."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "/aotgrad/" in f.filename]
    where = ours[-1] if ours else (frames[-1] if frames else None)
    at = f"\n  at {where.filename}:{where.lineno} in {where.name}" if where else ""
    return f"{type(exc).__name__}: {str(exc)[:2000]}{at}"


# ---- isolation -----------------------------------------------------------------------------

@contextlib.contextmanager
def _quiet():
    """Ops warn a lot (deprecations, TF32, ...); the report is the output that matters."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@contextlib.contextmanager
def _time_limit(seconds: float | None):
    """Interrupt the op after `seconds` (checked between Python bytecodes, so a long kernel
    finishes first). Signals only reach the main thread; elsewhere there is no limit."""
    if seconds is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum, frame):
        raise OpTimeout(f"took over {seconds:.0f}s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# ---- command line --------------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    ops = args.ops.split(",") if args.ops else None
    progress = _print_progress if args.verbose else None
    backend = decomposed(args.budget) if args.decomposed else args.backend
    if args.budget is not None and not args.decomposed:
        backend = {"backend": args.backend, "memory_budget": args.budget}
    results = [run_sweep(ops, args.samples, backend, args.every, progress, name)
               for name in args.passes.split(",")]
    print("\n\n".join(r.summary() for r in results))
    if len(results) > 1:
        print("\npass rates: " + "; ".join(f"{r.pass_name} {r.pass_rate()}" for r in results))
    if args.json:
        data = results[0].to_json() if len(results) == 1 else {
            r.pass_name: r.to_json() for r in results}
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tools.opdb_sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=2, help="samples per op (default 2)")
    p.add_argument("--every", type=int, default=1, help="run every K-th op only")
    p.add_argument("--ops", help="comma-separated op names or ids (name.variant)")
    p.add_argument("--backend", default="eager", help="aotgrad backend (default eager)")
    p.add_argument("--decomposed", action="store_true",
                   help="the eager backend with Inductor's decompositions")
    p.add_argument("--budget", type=float, help="memory_budget (default: the min cut)")
    p.add_argument("--pass", dest="passes", default="static",
                   help=f"comma-separated passes: {', '.join(PASSES)} (default static)")
    p.add_argument("--json", help="also write the full results to this file")
    p.add_argument("-v", "--verbose", action="store_true", help="one line per op on stderr")
    return p


def _print_progress(r: OpResult) -> None:
    print(f"{r.status:7} {r.seconds:6.2f}s {r.op}  {r.reason}{r.note}", file=sys.stderr,
          flush=True)


if __name__ == "__main__":
    sys.exit(main())
