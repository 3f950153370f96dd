"""Export: a module as one functional graph with a signature, for `compat.aot_export_module`."""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.utils._pytree as pytree

from . import analysis, joint, subclasses
from .compat import BackwardSignature, ExportGraphSignature
from .pipeline import capture_and_analyze
from .verify import verify


def export_module(mod: torch.nn.Module, args: Sequence[Any], decompositions,
                  trace_joint: bool, loss_index: int | None):
    params = dict(mod.named_parameters())
    buffers = dict(mod.named_buffers())
    names = [*params, *buffers]

    def forward(*flat):
        state = dict(zip(names, flat[:len(names)]))
        return torch.func.functional_call(mod, state, tuple(flat[len(names):]))

    flat = [*params.values(), *buffers.values(), *pytree.tree_leaves(tuple(args))]
    flat_args, in_spec = pytree.tree_flatten((tuple(flat), {}))
    c = capture_and_analyze(forward, flat_args, in_spec)
    info = c.info
    if any(x.storage_swap is not None for x in info.inputs):
        raise NotImplementedError("aot_export_module: the module calls set_() on an input; "
                                  "an exported graph cannot swap storages. Return the tensor.")
    if c.aliasing is not None and c.aliasing.groups:
        raise NotImplementedError("aot_export_module: inputs that share memory are mutated; "
                                  "an exported graph takes independent inputs. Pass clones.")
    if any(o.kind is not analysis.OutputKind.PLAIN for o in info.outputs):
        raise RuntimeError("aot_export_module: an output aliases an input or another output; "
                           "return a fresh tensor (e.g. .clone()).")
    wrt = [i for i, t in enumerate(c.inputs[:len(params)]) if t.requires_grad]
    if trace_joint:
        gm = joint.trace_loss_joint(c.graph_fn, info, c.fakes, c.fake_mode, decompositions,
                                    loss_index, wrt)
    else:
        gm = joint.trace_inference(c.graph_fn, info, c.fakes, c.fake_mode, decompositions)
    subclasses.refuse_in_export(c.fakes, gm, "aot_export_module")
    verify(gm)
    return gm, _signature(gm, info, list(params), list(buffers), wrt, loss_index, info.out_spec)


def _signature(gm, info, params, buffers, wrt, loss_index, out_spec) -> ExportGraphSignature:
    in_names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    out_names = [getattr(n, "name", None) for n in gm.graph.output_node().args[0]]
    state = params + buffers
    mutated = list(info.data_mutated_inputs)
    mutation_outputs = dict(zip(mutated, out_names[:len(mutated)]))
    user_outs = out_names[len(mutated):info.num_graph_outputs]
    backward = None
    if loss_index is not None:
        grads = out_names[info.num_graph_outputs:]
        backward = BackwardSignature(
            gradients_to_parameters={g: params[i] for g, i in zip(grads, wrt) if g},
            gradients_to_user_inputs={},
            loss_output=user_outs[loss_index])
    return ExportGraphSignature(
        parameters=params,
        buffers=buffers,
        user_inputs=in_names[len(state):],
        user_outputs=user_outs,
        inputs_to_parameters=dict(zip(in_names, params)),
        inputs_to_buffers=dict(zip(in_names[len(params):], buffers)),
        buffers_to_mutate={o: state[i] for i, o in mutation_outputs.items() if i < len(state)},
        user_inputs_to_mutate={o: in_names[i] for i, o in mutation_outputs.items()
                               if i >= len(state)},
        out_spec=out_spec,
        backward_signature=backward,
    )
