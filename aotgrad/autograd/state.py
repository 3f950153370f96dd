"""The one flag the runtime reads: is compiled autograd tracing a backward right now?

Kept in a module of its own, importing nothing, so that `runtime/call.py` can read it on the
backward path without loading the capture machinery.
"""

# True while the engine walks a backward graph under `aotgrad.compiled_autograd.enable`:
# an aotgrad region's backward then runs its partitioned graph op by op, for the capture to
# record its ops instead of one opaque compiled call.
capturing = False
