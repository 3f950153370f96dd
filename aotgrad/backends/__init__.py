"""Stage 4: compilers for the forward and backward graphs (compilers), and the Python code aotgrad
generates to run a graph fast (codegen, bindings)."""
