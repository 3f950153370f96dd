"""Eager behaviours, each whole in one module: dynamic shapes (dynamic), set_() and storage swaps
(swaps), error checks and effectful ops (effects), tensor subclasses (subclasses), inputs that share
memory (aliasing), views of normal tensors under inference_mode (inference), autocast's cast
cache (autocast). Every stage consults them; they import only schema, tables and each other."""
