"""Stage 4: compilers for the forward and backward graphs (compilers; Inductor under
torch.compile's mode and options: settings), and the Python code aotgrad generates to run a
graph fast (codegen, bindings)."""
