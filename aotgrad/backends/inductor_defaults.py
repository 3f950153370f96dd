"""Inductor's settings aotgrad chooses for its own graphs, each measured on a GPU, each left
as the user set it (`torch.compile(..., options=...)`, or a `config.patch` away from
torch's default).
Applied per graph (compilers._our_settings), so the forward, the backward and an inference
graph can differ, around both the load of a stored Inductor key and the compile: the context
a key is filed under names them. aotgrad's cache key holds its own source, so a change here
is a new key."""

from __future__ import annotations

import contextvars
from typing import Any, Sequence

import torch

# The names of the settings the user gave aotgrad (torch.compile's options, mode), set
# around each compile by settings.WithInductorSettings: `options={"combo_kernels": False}`
# is the user's choice though it equals torch's default.
USER_SETTINGS: contextvars.ContextVar[frozenset] = contextvars.ContextVar(
    "aotgrad_user_inductor_settings", default=frozenset())

# The most buffers one kernel of a backward may read and write. A backward that recomputes a
# chain (a residual stream, rebuilt layer by layer from what the forward saved) would have
# Inductor fuse the whole chain into one kernel: on DeBERTa-v2, 128 inputs and 26 outputs,
# registers spilled, 1.63 ms; capped, its backward's kernels take 24.71 ms a step instead
# of 26.22 (H200, bench/results/h200-2026-11-29-session18).
BACKWARD_KERNEL_BUFFERS = 64

# A CUDA graph's independent pointwise kernels launched as one (Inductor's combo kernels,
# pointwise only): fewer launches where the host sets the pace. Nine models on an H200
# (bench/results/h200-2026-12-01-session36): step 0.884x of backend="inductor" against plain
# aotgrad's 0.952x in the same processes (eight models; ViT-S 0.952 -> 0.862, DeBERTa-v2
# 1.316 -> 1.066; EfficientNet-B0, 0.960 -> 1.001, the one slower). Reductions stay apart:
# combos joining them never finished compiling DeBERTa-v2 and slowed ViT-S 1.7x (session 35).
# Not for compiled autograd's segments: unmeasured there.
POINTWISE_COMBOS = {"combo_kernels": True, "combo_kernels_pointwise_only": True}
# The graphs that take them: not the backward's. Its combos cut launches where the host has
# the time to spare (DeBERTa-v2's backward 537 -> 470, host 26.8 -> 27.2 ms, session 37) and
# hold buffers longer: nine models on an H200 (h200-2026-12-02-session39), combos in every
# graph / forward's only / none, x backend="inductor": step 0.877 / 0.897 / 0.939, peak
# 0.950 / 0.917 / 0.917, every model's peak with the forward's only equal to none's (with the
# backward's: BERT +403 MB, DeBERTa-v2 +389, GPT-2 +261, EfficientNet-B0 +129, each over
# torch's but BERT's). The bench's `aotgrad_combo_all` measures the backward's still.
COMBO_ROLES = frozenset({"forward", "inference"})


def for_graph(config, role: str, example_inputs: Sequence[Any]) -> dict:
    """The settings for one graph's compile, `role` "forward", "backward" or "inference"."""
    ours = backward_fusion_limits(config) if role == "backward" else {}
    if role in COMBO_ROLES and any(isinstance(t, torch.Tensor) and t.is_cuda
                                   for t in example_inputs):
        ours.update(_unset(config, POINTWISE_COMBOS))
    return ours


def backward_fusion_limits(config) -> dict:
    """Inductor's settings for a backward's kernels (compiled autograd's too): the cap on
    their buffers, unless the user set one."""
    if config.max_fusion_unique_io_buffers is not None:
        return {}
    return {"max_fusion_unique_io_buffers": BACKWARD_KERNEL_BUFFERS}


def _unset(config, settings: dict) -> dict:
    """`settings`, unless the user chose any of them: a choice of theirs stands whole. Chosen:
    named in the options they gave aotgrad, or away from torch's default (Inductor's own
    `_is_default` cannot tell: a `config.patch` leaves its setting marked as set)."""
    if USER_SETTINGS.get() & set(settings) or any(
            getattr(config, name) != config._config[name].default for name in settings):
        return {}
    return dict(settings)
