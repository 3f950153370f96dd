"""Benchmark aotgrad against eager and PyTorch's own compilers: compile time, step time, memory.

    python bench/run.py --quick --budgets 1.0,0.5,0.2        # GPU: every model and mode
    python bench/run.py --small --models mlp,tiny --modes eager,aotgrad_compile_eager

A step is forward (loss inside the compiled region), `loss.backward()`, zero grads; no
optimizer. Each (model, mode, budget) runs in its own subprocess so that compile caches,
memory statistics and Dynamo state do not leak between rows; a failure or timeout is
recorded and the run goes on. Results land in --out as results.json, results.md and plots;
a short summary table is printed last on stdout.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import datetime
import fcntl
import importlib
import importlib.util
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
sys.path.insert(0, str(REPO_ROOT))  # `python bench/run.py` from anywhere finds aotgrad

import aotgrad  # noqa: E402
from aotgrad.backends import inductor_defaults  # noqa: E402
from aotgrad.cache.key import source_digest  # noqa: E402
from aotgrad.backends.inductor_defaults import POINTWISE_COMBOS  # noqa: E402


# ---------------------------------------------------------------------------- the tables

@dataclass(frozen=True)
class ModelSpec:
    build: Callable[[bool], tuple[nn.Module, tuple]]  # small -> (loss module, CPU batch)
    needs: tuple[str, ...]        # modules the full-size model imports
    needs_small: tuple[str, ...]  # ... and the --small variant
    autocast: bool                # bf16 autocast around forward on CUDA
    channels_last: bool = False


@dataclass(frozen=True)
class Mode:
    compile: Callable  # (model, budget, sink) -> callable; `sink` collects what has timings
    budgeted: bool = False  # runs once per --budgets value
    config: Callable[[float | None], contextlib.AbstractContextManager] = \
        lambda budget: contextlib.nullcontext()


def _build_gpt2(small, dropout=True, shape=(8, 1024)):
    from transformers import GPT2Config, GPT2LMHeadModel
    if small:
        config = GPT2Config(vocab_size=1024, n_positions=64, n_embd=128, n_layer=2, n_head=4)
    else:
        config = GPT2Config()  # GPT-2 small: 12 layers x 768, random init, nothing downloaded
    config.use_cache = False  # training: no key/value cache among the outputs
    if not dropout:
        config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = 0.0
    batch, tokens = (2, 64) if small else shape
    ids = torch.randint(0, config.vocab_size, (batch, tokens))
    return LanguageModelLoss(GPT2LMHeadModel(config)), (ids,)


def _build_resnet50(small, batch=64):
    if not small:
        import timm
        return _classifier(timm.create_model("resnet50", pretrained=False), batch, 224, 1000)
    if _importable("timm"):
        import timm
        return _classifier(timm.create_model("resnet18", pretrained=False, num_classes=10),
                           4, 64, 10)
    return _classifier(SmallConvNet(), 8, 32, 10)  # timm missing: a stand-in with BatchNorm


def _build_llama(small):
    from transformers import LlamaConfig, LlamaForCausalLM
    if small:
        shape = dict(vocab_size=1024, hidden_size=128, intermediate_size=256,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    else:  # GPT-2-small sized, with grouped-query attention, RMSNorm, SwiGLU and RoPE
        shape = dict(vocab_size=32000, hidden_size=768, intermediate_size=2048,
                     num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4)
    config = LlamaConfig(**shape, max_position_embeddings=1024, use_cache=False)
    batch, tokens = (2, 64) if small else (8, 1024)
    ids = torch.randint(0, config.vocab_size, (batch, tokens))
    return LanguageModelLoss(LlamaForCausalLM(config)), (ids,)


def _build_bert(small):
    from transformers import BertConfig, BertForMaskedLM
    if small:
        config = BertConfig(vocab_size=1024, hidden_size=128, num_hidden_layers=2,
                            num_attention_heads=4, intermediate_size=256)
    else:
        config = BertConfig()  # BERT-base: 12 layers x 768
    batch, tokens = (2, 64) if small else (16, 512)
    ids = torch.randint(0, config.vocab_size, (batch, tokens))
    return LanguageModelLoss(BertForMaskedLM(config)), (ids,)


def _build_deberta_v2(small, relative=True):
    """DeBERTa-v2 masked LM. relative=True: v3-base's attention (relative positions, p2c and
    c2p, log buckets, shared keys); False: DebertaV2Config's defaults (absolute positions)."""
    from transformers import DebertaV2Config, DebertaV2ForMaskedLM
    attention = dict(relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=256,
                     max_relative_positions=-1, share_att_key=True, norm_rel_ebd="layer_norm",
                     position_biased_input=False) if relative else {}
    if small:
        shape = dict(vocab_size=1024, hidden_size=256, num_hidden_layers=2,
                     num_attention_heads=4, intermediate_size=512)
    else:  # deberta-v3-base: 12 layers x 768
        shape = dict(vocab_size=128100, hidden_size=768, num_hidden_layers=12,
                     num_attention_heads=12, intermediate_size=3072)
    config = DebertaV2Config(**shape, **attention, max_position_embeddings=512)
    batch, tokens = (2, 64) if small else (8, 512)
    ids = torch.randint(0, config.vocab_size, (batch, tokens))
    return LanguageModelLoss(DebertaV2ForMaskedLM(config)), (ids,)


def _timm_classifier(name, batch):
    """A timm model at 224x224, random init; --small: batch 2 and 10 classes."""
    def build(small):
        import timm
        classes = 10 if small else 1000
        net = timm.create_model(name, pretrained=False, num_classes=classes)
        return _classifier(net, 2 if small else batch, 224, classes)
    return build


def _build_mlp(small):
    width, layers, batch = (256, 4, 64) if small else (4096, 8, 8192)
    return SquaredOutput(_mlp(width, layers)), (torch.randn(batch, width),)


def _build_tiny(small):
    # Kernels take microseconds here: the step time is the host overhead of each path.
    return SquaredOutput(_mlp(16, 2)), (torch.randn(8, 16),)


MODELS = {
    "gpt2": ModelSpec(_build_gpt2, ("transformers",), ("transformers",), autocast=True),
    # Not run by default: GPT-2 without random ops, to tell dropout's cost or failures apart.
    "gpt2_nodropout": ModelSpec(lambda small: _build_gpt2(small, dropout=False),
                                ("transformers",), ("transformers",), autocast=True),
    "resnet50": ModelSpec(_build_resnet50, ("timm",), (), autocast=True, channels_last=True),
    # Host-bound steps, where CUDA graphs pay (issue 20's reduce-overhead points)
    "resnet50_b16": ModelSpec(lambda small: _build_resnet50(small, batch=16), ("timm",), (),
                              autocast=True, channels_last=True),
    "gpt2_2x256": ModelSpec(lambda small: _build_gpt2(small, shape=(2, 256)),
                            ("transformers",), ("transformers",), autocast=True),
    "llama": ModelSpec(_build_llama, ("transformers",), ("transformers",), autocast=True),
    "bert": ModelSpec(_build_bert, ("transformers",), ("transformers",), autocast=True),
    "deberta_v2": ModelSpec(_build_deberta_v2, ("transformers",), ("transformers",),
                            autocast=True),
    "deberta_v2_abs": ModelSpec(lambda small: _build_deberta_v2(small, relative=False),
                                ("transformers",), ("transformers",), autocast=True),
    "efficientnet_b0": ModelSpec(_timm_classifier("efficientnet_b0", 64), ("timm",), ("timm",),
                                 autocast=True, channels_last=True),
    "vit_s16": ModelSpec(_timm_classifier("vit_small_patch16_224", 64), ("timm",), ("timm",),
                         autocast=True),
    "swin_t": ModelSpec(_timm_classifier("swin_tiny_patch4_window7_224", 64), ("timm",),
                        ("timm",), autocast=True),
    "convnext_t": ModelSpec(_timm_classifier("convnext_tiny", 64), ("timm",), ("timm",),
                            autocast=True, channels_last=True),
    "mlp": ModelSpec(_build_mlp, (), (), autocast=False),
    "tiny": ModelSpec(_build_tiny, (), (), autocast=False),
}


def _torch_budget(budget):
    # Read when AOTAutograd partitions, i.e. during the first call: the worker holds the patch
    # around every call of the row.
    if budget is None:
        return contextlib.nullcontext()
    return torch._functorch.config.patch(activation_memory_budget=budget)


def _aotgrad_dynamo(backend, mode=None, options=None):
    def compile_(model, budget, sink):
        if backend == "inductor" and budget is None:
            chosen = torch._dynamo.lookup_backend("aotgrad")  # the registered name itself
        else:
            chosen = aotgrad.backend(backend=backend, memory_budget=budget)
        return torch.compile(model, backend=_recording(chosen, sink), mode=mode, options=options)
    return compile_


@contextlib.contextmanager
def _combo_roles(*roles):
    """aotgrad's combo default for these graphs only, around each step (the first compiles).
    The context its Inductor keys are filed under holds the settings: no other mode's code
    is loaded for it."""
    chosen = inductor_defaults.COMBO_ROLES
    inductor_defaults.COMBO_ROLES = frozenset(roles)
    try:
        yield
    finally:
        inductor_defaults.COMBO_ROLES = chosen


def _spans_saved(joint, joint_inputs=None, **kwargs):
    """Issue 20's experiment: the min cut with every recomputed value that a backward kernel
    would keep alive saved by the forward, whatever it adds to the modeled peak (aotgrad
    saves only those that leave the peak as it is; torch's partitioner saves a residual
    stream's layer-norm outputs). Bench-only: it swaps the choice for its own calls."""
    from aotgrad.partition import remat
    chosen = remat.saved_below_peak
    remat.saved_below_peak = lambda spanning, *args: spanning
    try:
        return remat.min_cut_rematerialization_partition(joint, joint_inputs, **kwargs)
    finally:
        remat.saved_below_peak = chosen


def _aotgrad_spans_saved(model, budget, sink):
    chosen = aotgrad.backend(partitioner=_spans_saved)
    return torch.compile(model, backend=_recording(chosen, sink))


def _no_exchanges(joint, joint_inputs=None, **kwargs):
    """The min cut without session 26's exchanges (a stream value saved for the saved values
    the backward read only to rebuild it): ViT-S's backward kernels took 1.05x torch's after
    it, Swin-T's and ConvNeXt-T's 0.97x. Bench-only, as `_spans_saved`."""
    from aotgrad.partition import remat
    chosen = remat._exchanges
    remat._exchanges = lambda *args: []
    try:
        return remat.min_cut_rematerialization_partition(joint, joint_inputs, **kwargs)
    finally:
        remat._exchanges = chosen


def _aotgrad_no_exchanges(model, budget, sink):
    return torch.compile(model, backend=_recording(aotgrad.backend(partitioner=_no_exchanges),
                                                   sink))


def _aotgrad_torch_partition(model, budget, sink):
    """aotgrad's pipeline and Inductor with torch's partitioner (functorch's min cut) in
    place of aotgrad's: beside `aotgrad_dynamo`, what the partition alone changes (issue 20:
    backward kernel time and peak memory against torch's partitioner, same Inductor)."""
    from functorch.compile import min_cut_rematerialization_partition
    chosen = aotgrad.backend(partitioner=min_cut_rematerialization_partition)
    return torch.compile(model, backend=_recording(chosen, sink))


def _aotgrad_compile(backend):
    def compile_(model, budget, sink):
        compiled = aotgrad.compile(model, backend=backend, memory_budget=budget)
        sink.append(compiled)
        return compiled
    return compile_


MODES = {
    "eager": Mode(lambda model, budget, sink: model),
    "torch_compile": Mode(lambda model, budget, sink: torch.compile(model), budgeted=True,
                          config=_torch_budget),
    # CUDA graphs (mode="reduce-overhead"); on CPU both run without them.
    "torch_compile_ro": Mode(lambda model, budget, sink:
                             torch.compile(model, mode="reduce-overhead")),
    "aotgrad_dynamo_ro": Mode(_aotgrad_dynamo("inductor", mode="reduce-overhead")),
    # Inductor's C++ wrapper (its kernels launched from C++, not Python): host-bound steps
    "torch_compile_cpp": Mode(lambda model, budget, sink:
                              torch.compile(model, options={"cpp_wrapper": True})),
    "aotgrad_dynamo_cpp": Mode(_aotgrad_dynamo("inductor", options={"cpp_wrapper": True})),
    # Inductor's combo kernels (independent kernels fused side by side): fewer launches
    "torch_compile_combo": Mode(lambda model, budget, sink:
                                torch.compile(model, options={"combo_kernels": True})),
    "aotgrad_dynamo_combo": Mode(_aotgrad_dynamo("inductor", options={"combo_kernels": True})),
    # pointwise kernels only: session 35's slow combos joined reductions. aotgrad's default
    # on CUDA since session 36 (backends/inductor_defaults.py); `_no_combo` is the one before
    "torch_compile_combo_pw": Mode(lambda model, budget, sink: torch.compile(
        model, options=dict(POINTWISE_COMBOS))),
    "aotgrad_dynamo_combo_pw": Mode(_aotgrad_dynamo("inductor", options=dict(POINTWISE_COMBOS))),
    "aotgrad_dynamo_no_combo": Mode(_aotgrad_dynamo("inductor", options={
        "combo_kernels": False})),
    # aotgrad's combos in every graph, the backward's too (its default until session 39)
    "aotgrad_dynamo_combo_all": Mode(_aotgrad_dynamo("inductor"), config=lambda budget:
                                     _combo_roles("forward", "backward", "inference")),
    "aot_eager": Mode(lambda model, budget, sink: torch.compile(model, backend="aot_eager")),
    "aotgrad_dynamo": Mode(_aotgrad_dynamo("inductor"), budgeted=True),
    "aotgrad_dynamo_eager": Mode(_aotgrad_dynamo("eager")),
    "aotgrad_dynamo_spans_saved": Mode(_aotgrad_spans_saved),
    "aotgrad_dynamo_no_exchanges": Mode(_aotgrad_no_exchanges),
    "aotgrad_torch_partition": Mode(_aotgrad_torch_partition),
    "aotgrad_compile": Mode(_aotgrad_compile("inductor")),
    "aotgrad_compile_eager": Mode(_aotgrad_compile("eager")),
}
DEFAULT_MODELS = ["gpt2", "resnet50", "mlp", "tiny"]  # bench/models.py runs the longer list
# aotgrad_compile_eager is for CPU tests; the CUDA-graph modes are bench/models.py's
DEFAULT_MODES = [m for m in MODES
                 if m not in ("aotgrad_compile_eager", "torch_compile_ro", "aotgrad_dynamo_ro",
                              "torch_compile_cpp", "aotgrad_dynamo_cpp",
                              "torch_compile_combo", "aotgrad_dynamo_combo",
                              "torch_compile_combo_pw", "aotgrad_dynamo_combo_pw",
                              "aotgrad_dynamo_no_combo", "aotgrad_dynamo_combo_all",
                              "aotgrad_dynamo_spans_saved", "aotgrad_dynamo_no_exchanges",
                              "aotgrad_torch_partition")]

# Defaults of --warmup, --steps, --timeout (per row), --time-limit (whole run), --jobs (rows
# compiling at once on a GPU; the timed steps always run one row at a time).
SETTINGS = {
    "full": dict(warmup=5, steps=30, timeout=900, time_limit=None, jobs=1),
    "quick": dict(warmup=3, steps=10, timeout=200, time_limit=530, jobs=3),
}
MIN_ROW_SECONDS = 20  # a row with less time left than this is skipped, not started
COMPILED_MARK = "bench: first step done"


# ---------------------------------------------------------------------------- the models

class LanguageModelLoss(nn.Module):
    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids):
        return self.lm(ids, labels=ids).loss


class ClassifierLoss(nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, images, labels):
        return nn.functional.cross_entropy(self.net(images), labels)


class SquaredOutput(nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x):
        return self.net(x).square().mean()


class SmallConvNet(nn.Sequential):
    def __init__(self, classes=10):
        super().__init__(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(32, classes))


def _classifier(net, batch, size, classes):
    images = torch.randn(batch, 3, size, size)
    return ClassifierLoss(net), (images, torch.randint(0, classes, (batch,)))


def _importable(module: str) -> bool:
    """Whether `module` imports: timm beside a torchvision built for another torch is found
    but fails to import (then the small run uses its stand-in)."""
    try:
        importlib.import_module(module)
    except Exception:  # ImportError, or the RuntimeError of a mismatched extension
        return False
    return True


def _mlp(width, layers):
    return nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width), nn.GELU())])


def _recording(backend, sink):
    """Keep what the backend returns: aotgrad's compiled callables carry `.artifact`.
    torch.compile's `mode` and `options` reach the backend as keywords."""
    def recorded(gm, example_inputs, **kwargs):
        compiled = backend(gm, example_inputs, **kwargs)
        sink.append(compiled)
        return compiled
    recorded.__name__ = getattr(backend, "__name__", "backend")  # Dynamo's errors name it
    return recorded


# ---------------------------------------------------------------------------- one row (worker)

@dataclass(frozen=True)
class Job:
    model: str
    mode: str
    budget: float | None
    small: bool
    device: str
    warmup: int
    steps: int

    @property
    def label(self) -> str:
        suffix = "" if self.budget is None else f"@{self.budget:g}"
        return f"{self.model}/{self.mode}{suffix}"


def prepare(job: Job):
    """The loss module (in training mode) and its batch, on the device. BENCH_INDUCTOR_CONFIG
    ("name=value,...", values as Python literals) sets Inductor's config for the row: an
    experiment on what a setting would change."""
    from torch._inductor import config as inductor_config
    for item in filter(None, os.environ.get("BENCH_INDUCTOR_CONFIG", "").split(",")):
        name, value = item.split("=", 1)
        setattr(inductor_config, name.strip(), ast.literal_eval(value.strip()))
    spec = MODELS[job.model]
    model, batch = spec.build(job.small)
    fmt = torch.channels_last if spec.channels_last else torch.contiguous_format
    model = model.to(job.device, memory_format=fmt).train()
    batch = tuple(t.to(job.device, memory_format=fmt) if t.dim() == 4 else t.to(job.device)
                  for t in batch)
    use_autocast = spec.autocast and job.device.startswith("cuda")
    return model, batch, use_autocast


def make_step(model, compiled, batch, use_autocast):
    autocast = (lambda: torch.autocast("cuda", torch.bfloat16)) if use_autocast \
        else contextlib.nullcontext

    def step():
        with autocast():
            loss = compiled(*batch)
        loss.backward()
        model.zero_grad(set_to_none=True)
        return loss
    return step


@dataclass
class Warmed:
    """A row's model, its compiled callable, batch and step, after `job.warmup` steps that
    follow the compiling one (what the profiling benchmarks start from)."""
    model: nn.Module
    compiled: Callable
    batch: tuple
    use_autocast: bool
    step: Callable


def warmed_up(job: Job) -> Warmed:
    torch.manual_seed(0)
    model, batch, use_autocast = prepare(job)
    compiled = MODES[job.mode].compile(model, job.budget, [])
    step = make_step(model, compiled, batch, use_autocast)
    for _ in range(job.warmup + 1):
        step()
    return Warmed(model, compiled, batch, use_autocast, step)


def time_step(step, cuda: bool) -> dict:
    """One step: host time (until the Python call returns), wall time and device time."""
    if cuda:
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    t0 = time.perf_counter()
    loss = step()
    t1 = time.perf_counter()
    if cuda:
        end.record()
        torch.cuda.synchronize()
    t2 = time.perf_counter()
    device_s = start.elapsed_time(end) / 1e3 if cuda else t2 - t0
    return {"host": t1 - t0, "wall": t2 - t0, "step": device_s, "loss": loss.item()}


@contextlib.contextmanager
def exclusive(lock_path: str | None):
    """Rows may compile side by side (--jobs); only one at a time runs its timed steps."""
    if lock_path is None:
        yield 0.0
        return
    start = time.perf_counter()
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield time.perf_counter() - start
    # closing the file releases the lock


# The caching allocator's calls into the driver: a steady step should make none. One that
# does (cudaMalloc, cudaFree, a retry after freeing the cache) spends host time, and which
# blocks are cached depends on what the other modes of the process left (a host-bound step's
# ratio moves with the process: issue 20, DeBERTa-v2).
ALLOCATOR_CALLS = ("num_device_alloc", "num_device_free", "num_alloc_retries")


def allocator_calls(before: dict, steps: int) -> dict[str, float]:
    """`ALLOCATOR_CALLS` a step since `before` (`torch.cuda.memory_stats()`)."""
    after = torch.cuda.memory_stats()
    return {k: (after.get(k, 0) - before.get(k, 0)) / steps for k in ALLOCATOR_CALLS}


def measure(step, job: Job, lock_path: str | None) -> dict:
    cuda = job.device.startswith("cuda")
    first = time_step(step, cuda)  # compiles
    print(COMPILED_MARK, flush=True)  # the parent's log: tells a slow compile from slow steps
    with exclusive(lock_path) as waited:
        for _ in range(job.warmup):
            time_step(step, cuda)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() if cuda else None
        stats = torch.cuda.memory_stats() if cuda else None
        cpu_before, workers_before = time.process_time(), descendants_cpu_s()
        timed = [time_step(step, cuda) for _ in range(job.steps)]
        cpu_s, workers_after = time.process_time() - cpu_before, descendants_cpu_s()
        calls = allocator_calls(stats, job.steps) if cuda else None
    median = {k: statistics.median(t[k] for t in timed) for k in ("host", "wall", "step")}
    return {
        "compile_s": first["wall"] - median["wall"], "first_step_s": first["wall"],
        "step_ms": median["step"] * 1e3, "wall_ms": median["wall"] * 1e3,
        "host_ms": median["host"] * 1e3, "loss": first["loss"],
        "peak_mb": torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
        # CUDA graphs' pools: recorded once, reserved ever after, never allocated in a replay
        "reserved_mb": torch.cuda.max_memory_reserved() / 2**20 if cuda else None,
        "base_mb": base / 2**20 if cuda else None, "lock_wait_s": waited,
        "allocator_calls_per_step": calls,
        # CPU time a timed step, this process's threads together and its children's (compile
        # workers): beside host_ms, whether something besides the step was busy meanwhile.
        "cpu_ms": cpu_s / job.steps * 1e3,
        "children_cpu_ms": None if None in (workers_before, workers_after)
        else (workers_after - workers_before) / job.steps * 1e3,
    }


def descendants_cpu_s() -> float | None:
    """CPU seconds used so far by this process's live descendants (Linux's /proc; None
    elsewhere). os.times() counts only children that have exited and been waited for."""
    try:
        pending, total = [os.getpid()], 0.0
        while pending:
            pid = pending.pop()
            for task in Path(f"/proc/{pid}/task").iterdir():
                children = (task / "children").read_text().split()
                pending.extend(map(int, children))
                for child in children:
                    fields = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()
                    total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return total
    except (OSError, ValueError):
        return None


def artifacts_of(sink) -> list:
    found = []
    for item in sink:
        if hasattr(item, "artifacts"):
            found += item.artifacts
        elif getattr(item, "artifact", None) is not None:
            found.append(item.artifact)
    return found


def compile_facts(sink, mode: str) -> dict:
    """aotgrad's per-stage compile time and saved bytes; Dynamo's graph and break counts."""
    facts = {}
    if mode != "eager" and not mode.startswith("aotgrad_compile"):
        counters = torch._dynamo.utils.counters
        facts["graphs"] = counters["stats"]["unique_graphs"]
        facts["graph_breaks"] = sum(counters["graph_break"].values())
    artifacts = artifacts_of(sink)
    if mode.startswith("aotgrad"):
        facts["aotgrad_graphs"] = len(artifacts)
        facts["stages"] = _sum_timings(a.timings for a in artifacts) if artifacts else None
        facts["saved_mb"] = sum(s.nbytes for a in artifacts for s in a.saved) / 2**20
        facts["estimated_peak_mb"] = _estimated_peak_mb(artifacts)
    return facts


def _estimated_peak_mb(artifacts) -> float | None:
    """aotgrad's own peak estimate, to set against the measured peak: with graph breaks, of
    the graphs in the order they were compiled (the order of the first step's forwards)."""
    from aotgrad.partition.memory import chain_peak, estimate_peak
    training = [a for a in artifacts if a.backward_graph is not None]
    if not training:
        return None
    return chain_peak([estimate_peak(a.forward_graph, a.backward_graph, a.info.num_graph_outputs)
                       for a in training]) / 2**20


def _sum_timings(timings) -> dict:
    total: dict[str, float] = {}
    for t in timings:
        for stage, seconds in t.items():
            total[stage] = total.get(stage, 0.0) + seconds
    return total


def run_row(job: Job, lock_path: str | None = None) -> dict:
    torch.manual_seed(0)
    model, batch, use_autocast = prepare(job)
    mode = MODES[job.mode]
    sink: list = []
    with mode.config(job.budget):
        compiled = mode.compile(model, job.budget, sink)
        metrics = measure(make_step(model, compiled, batch, use_autocast), job, lock_path)
    return {**metrics, **compile_facts(sink, job.mode), "autocast": use_autocast}


def error_chain(error: BaseException, depth: int = 10) -> list[BaseException]:
    """`error` and what it wraps, outermost first: Dynamo and Inductor wrap a backend's error
    in their own (`inner_exception`, `__cause__`)."""
    chain = [error]
    while len(chain) < depth:
        inner = getattr(chain[-1], "inner_exception", None) or chain[-1].__cause__
        if inner is None:
            break
        chain.append(inner)
    return chain


def describe(error: BaseException) -> str:
    """The innermost error first, then what it was raised through."""
    chain = error_chain(error)
    message = f"{type(chain[-1]).__name__}: {chain[-1]}"
    wrappers = " <- ".join(type(e).__name__ for e in chain[-2::-1])
    return f"{message}\n(raised through {wrappers})" if wrappers else message


def where(error: BaseException, frames: int = 14) -> list[str]:
    """The innermost error's last frames, `file:line function`: a message alone does not
    say which stage raised it, and a GPU run is not repeated for a traceback."""
    stack = traceback.extract_tb(error_chain(error)[-1].__traceback__)[-frames:]
    return [f"{f.filename.rsplit('site-packages/', 1)[-1]}:{f.lineno} {f.name}" for f in stack]


def worker_main(job_json: str, result_path: str, lock_path: str | None) -> None:
    job = Job(**json.loads(job_json))
    start = time.perf_counter()
    try:
        result = {"status": "ok", **run_row(job, lock_path)}
    except Exception as e:  # recorded in the table; the parent goes on with the next row
        result = {"status": "error", "error": describe(e)[:2000],
                  "traceback": traceback.format_exc()[-6000:]}
    result["elapsed_s"] = time.perf_counter() - start
    Path(result_path).write_text(json.dumps(result))


# ---------------------------------------------------------------------------- the run (parent)

def plan_jobs(args) -> list[Job]:
    budgets = args.budgets or [None]
    return [Job(model, mode, budget, args.small, args.device, args.warmup, args.steps)
            for model in args.models for mode in args.modes
            for budget in (budgets if MODES[mode].budgeted else [None])]


def run_order(jobs: list[Job]) -> list[int]:
    """Every row at the default budget (or 1.0) first, so that a run cut short by
    --time-limit loses the lower budgets, not whole models."""
    return sorted(range(len(jobs)), key=lambda i: (jobs[i].budget or 1.0) < 1.0)


def missing_modules(job: Job) -> list[str]:
    spec = MODELS[job.model]
    needs = spec.needs_small if job.small else spec.needs
    return [m for m in needs if importlib.util.find_spec(m) is None]


def run_job(job: Job, args, deadline: float | None) -> dict:
    row = {"model": job.model, "mode": job.mode, "budget": job.budget}
    missing = missing_modules(job)
    if missing:
        return {**row, "status": "skipped", "error": f"{', '.join(missing)} not importable"}
    timeout = args.timeout if deadline is None else min(args.timeout, deadline - time.time())
    if timeout < MIN_ROW_SECONDS:
        return {**row, "status": "skipped", "error": "out of time (--time-limit)"}
    return {**row, **_spawn(job, timeout, args)}


def _spawn(job: Job, timeout: float, args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        result_path, log_path = Path(tmp, "result.json"), Path(tmp, "log.txt")
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker",
               json.dumps(asdict(job)), "--result", str(result_path)]
        if args.lock:
            cmd += ["--lock", args.lock]
        with open(log_path, "w") as log_file:
            # A session of its own: on timeout the whole group goes, Inductor's compile
            # workers included.
            proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT,
                                    start_new_session=True, env=_worker_env(args))
            timed_out = _wait(proc, timeout)
        if result_path.exists():
            return json.loads(result_path.read_text())
        log = log_path.read_text(errors="replace")
        return _no_result(log, proc.returncode, timeout if timed_out else None)


def _no_result(log: str, returncode: int, timed_out_after: float | None) -> dict:
    """The worker died or was killed before writing its result."""
    if timed_out_after is not None:
        stage = "in the timed steps" if COMPILED_MARK in log else "compiling"
        return {"status": "timeout", "log_tail": log[-3000:],
                "error": f"no result after {timed_out_after:.0f}s ({stage})"}
    last = [line for line in log.splitlines() if line.strip()][-1:] or [""]
    return {"status": "crash", "error": f"exit code {returncode}: {last[0]}",
            "log_tail": log[-3000:]}


def _wait(proc: subprocess.Popen, timeout: float) -> bool:
    try:
        proc.wait(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # the group this run started, leftovers included
    proc.wait()
    return timed_out


def _worker_env(args) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    if args.cache_dir:
        env.setdefault("TORCHINDUCTOR_CACHE_DIR", args.cache_dir)
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    if args.jobs > 1:  # share the cores between the rows compiling at once
        threads = max(1, (os.cpu_count() or 1) // args.jobs)
        env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(threads))
    if args.cold:  # aotgrad's own compile cache too: else a second run finds it warm
        fresh = tempfile.mkdtemp(prefix="bench-inductor-", dir=args.cache_dir)
        env["TORCHINDUCTOR_CACHE_DIR"] = fresh
        env["AOTGRAD_CACHE_DIR"] = os.path.join(fresh, "aotgrad")
        env.pop("TRITON_CACHE_DIR", None)  # unset, Triton's cache lies in Inductor's
    return env


def environment(args) -> dict:
    cuda = args.device.startswith("cuda")
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(args.device) if cuda else _cpu_name(),
        "python": platform.python_version(),
        "versions": {m: _version(m) for m in ("transformers", "timm", "triton")},
        "argv": sys.argv[1:],
        "settings": {"small": args.small, "warmup": args.warmup, "steps": args.steps,
                     "timeout_s": args.timeout, "time_limit_s": args.time_limit,
                     "jobs": args.jobs, "threads": args.threads, "cold_cache": args.cold},
    }


def code_version() -> str:
    """The commit a result names, `+changes` where the tracked files differ from it, then a
    digest of aotgrad's sources, which names the code whatever git says: the device's copy
    of a tree can carry an older .git (session 39's `ro39` ran 6f5b0d2's code and named
    cbf5da9)."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True,
                              text=True).stdout.strip()
    commit = git("rev-parse", "--short", "HEAD") or "no commit"
    if git("status", "--porcelain", "--untracked-files=no"):
        commit += "+changes"
    digest = source_digest(Path(aotgrad.__file__).parent)
    return f"{commit} (aotgrad {digest[:12]})"


def _cpu_name() -> str:
    return f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} threads)"


def _version(module: str) -> str | None:
    if importlib.util.find_spec(module) is None:
        return None
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(module)
    except PackageNotFoundError:
        return "unknown"


def run_all(args, save: Callable[[list[dict]], None]) -> list[dict]:
    """Every row, --jobs at a time, in run_order; `save` gets the finished rows after each."""
    deadline = None if args.time_limit is None else time.time() + args.time_limit
    jobs = plan_jobs(args)
    rows: list[dict] = [{}] * len(jobs)
    with ThreadPoolExecutor(args.jobs) as pool:  # threads only wait on the subprocesses
        futures = {pool.submit(run_job, jobs[i], args, deadline): i for i in run_order(jobs)}
        for done, future in enumerate(as_completed(futures), 1):
            i = futures[future]
            rows[i] = future.result()
            print(f"[{done}/{len(jobs)}] {jobs[i].label}: {_progress(rows[i])}", flush=True)
            save([r for r in rows if r])  # a run killed from outside keeps what it finished
    return rows


def _progress(row: dict) -> str:
    if row["status"] != "ok":
        first_line = (row.get("error") or "").strip().split("\n")[0]
        return f"{row['status']}: {first_line[:150]}"
    return (f"compile {row['compile_s']:.1f}s, step {row['step_ms']:.2f} ms "
            f"({row['elapsed_s']:.0f}s)")


# ---------------------------------------------------------------------------- the command line

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", type=_names(MODELS), default=DEFAULT_MODELS)
    p.add_argument("--modes", type=_names(MODES), default=DEFAULT_MODES)
    p.add_argument("--budgets", type=_budgets, default=None,
                   help="e.g. 1.0,0.5,0.2: torch_compile and aotgrad_dynamo once per budget; "
                        "'default' is the row without one")
    p.add_argument("--small", action="store_true", help="the small CPU-sized variants")
    p.add_argument("--quick", action="store_true",
                   help="few steps and a whole-run time limit: fits one 10-minute command")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--warmup", type=int, help="steps after the first (compiling) one")
    p.add_argument("--steps", type=int, help="timed steps (median reported)")
    p.add_argument("--timeout", type=float, help="seconds per row")
    p.add_argument("--time-limit", type=float, help="seconds for the whole run")
    p.add_argument("--jobs", type=int, help="rows compiling at once (timed steps never overlap)")
    p.add_argument("--threads", type=int,
                   help="OMP_NUM_THREADS for the rows (1 steadies CPU timings on a shared host)")
    p.add_argument("--cold", action="store_true",
                   help="a fresh Inductor cache per row (default: one per run, shared)")
    p.add_argument("--out", type=Path, default=BENCH_DIR / "results")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--lock", help=argparse.SUPPRESS)
    return _fill_defaults(p.parse_args(argv))


def _fill_defaults(args):
    settings = SETTINGS["quick" if args.quick else "full"]
    if not args.device.startswith("cuda"):
        settings = {**settings, "jobs": 1}  # on CPU a compiling row would skew the timed one
    for name, value in settings.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.cache_dir = None  # main() makes one per run, and the lock file in it
    return args


def _names(table):
    def parse(text):
        names = [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in names if n not in table]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {unknown}; choose from {list(table)}")
        return names
    return parse


def _budgets(text):
    words = [w.strip() for w in text.split(",") if w.strip()]
    return [None if w == "default" else float(w) for w in words]


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        return worker_main(args.worker, args.result, args.lock)
    from run_report import summary_table, write_outputs  # beside this file
    start = time.time()
    meta = environment(args)
    with tempfile.TemporaryDirectory(prefix="bench-") as scratch:
        args.cache_dir = scratch  # Inductor's cache: cold at the start of every run
        args.lock = os.path.join(scratch, "timed-steps.lock")
        rows = run_all(args, lambda done: write_outputs(args.out, meta, done, plots=False))
    meta["total_s"] = time.time() - start
    notes = write_outputs(args.out, meta, rows)
    print(summary_table(meta, rows, notes), flush=True)


if __name__ == "__main__":
    main()
