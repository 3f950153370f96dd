"""What Inductor receives and the Triton kernels it writes, recorded into a folder.

    with Dump(folder, marks=("native_layer_norm_backward",)):
        ...  # compile and run

Each graph Inductor compiles goes to `graph_<n>_<fw|bw>.txt` (with strides); each Triton
kernel whose name holds every one of `marks` to `<kernel name>.py`. The GPU's kernels are
the measure of a partition (issue 20); a CPU run writes C++, which this does not record.
"""

from __future__ import annotations

import pathlib


class Dump:
    """Records what Inductor receives and the Triton sources it generates, into `folder`."""

    def __init__(self, folder: pathlib.Path | None, marks: tuple[str, ...]):
        self.folder, self.marks, self.count, self.undo = folder, marks, 0, []

    def __enter__(self):
        if self.folder is None:
            return self
        self.folder.mkdir(parents=True, exist_ok=True)
        import torch._inductor.async_compile as async_compile
        import torch._inductor.compile_fx as compile_fx
        self._patch(compile_fx, "fx_codegen_and_compile", self._graph)
        self._patch(async_compile.AsyncCompile, "triton", self._kernel)
        return self

    def __exit__(self, *exc):
        for owner, name, original in reversed(self.undo):
            setattr(owner, name, original)

    def _patch(self, owner, name, make):
        original = getattr(owner, name, None)
        if original is None:
            print(f"dump: {owner.__name__}.{name} not in this torch; not recorded")
            return
        self.undo.append((owner, name, original))
        setattr(owner, name, make(original))

    def _graph(self, original):
        def recorded(gm, example_inputs, *rest, **kwargs):
            role = "bw" if kwargs.get("is_backward") else "fw"
            text = gm.print_readable(print_output=False, include_stride=True)
            (self.folder / f"graph_{self.count}_{role}.txt").write_text(text)
            self.count += 1
            return original(gm, example_inputs, *rest, **kwargs)
        return recorded

    def _kernel(self, original):
        folder, marks = self.folder, self.marks

        def recorded(self_, kernel_name, source_code, *rest, **kwargs):
            if all(mark in kernel_name for mark in marks):
                (folder / f"{kernel_name}.py").write_text(source_code)
            return original(self_, kernel_name, source_code, *rest, **kwargs)
        return recorded
